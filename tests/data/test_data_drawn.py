"""A fixed random sample of a split (a bounded evaluation, the images of a figure): the same samples whether the
split is decoded into memory or streamed from shards, where `fixed_sample` did not exist (AttributeError)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardkit import image_ids, numbered_shards, write_tar
from vitkit.data.inmemory import drawn_sample
from vitkit.data.sources import load_split
from vitkit.data.stream import ShardSet


@pytest.mark.parametrize(("count", "seed"), [(6, 3), (1, 0), (17, 1), (18, 0), (50, 2)])
def test_a_streamed_draw_is_the_in_memory_draw(tmp_path: Path, count: int, seed: int) -> None:
    ids = numbered_shards(tmp_path, [5, 7, 6], prefix="test")
    numbered_shards(tmp_path, [3], start=100)
    uri = f"wds:{tmp_path}"
    stream = load_split(uri, "test", image_size=8, max_in_memory_bytes=0)
    memory = load_split(uri, "test", image_size=8)
    assert isinstance(stream, ShardSet) and memory.images is not None and image_ids(memory.images) == ids
    expected = memory.fixed_sample(count, seed)
    drawn = drawn_sample(stream, count, seed)
    assert drawn.images is not None and len(drawn) == min(count, 18)
    assert image_ids(drawn.images) == image_ids(expected.images)
    assert drawn.labels.tolist() == expected.labels.tolist()
    assert drawn.class_names == memory.class_names
    assert drawn_sample(memory, count, seed).labels.tolist() == expected.labels.tolist()


def test_a_corrupt_drawn_sample_is_skipped_and_counted(tmp_path: Path) -> None:
    numbered_shards(tmp_path, [4], prefix="test")
    numbered_shards(tmp_path, [3], start=100)
    write_tar(tmp_path / "test-000001.tar", [("x.png", b"not a png"), ("x.cls", b"1")])
    stream = load_split(f"wds:{tmp_path}", "test", image_size=8, max_in_memory_bytes=0)
    drawn = drawn_sample(stream, 5, 0)
    assert len(drawn) == 4 and drawn.skipped == 1 and sorted(image_ids(drawn.images)) == [0, 1, 2, 3]


def test_fewshot_of_a_streamed_split_is_the_in_memory_fewshot(tmp_path: Path) -> None:
    """A split too large to decode up front had no label index, so few-shot refused it ("has no label index in
    memory"); its shots are now drawn from its labels as read from the shards, and only they are decoded."""
    import vitkit
    from vitkit.eval.fewshot import FewShotConfig, run_fewshot
    from vitkit.runs import open_checkpoint

    numbered_shards(tmp_path, [9, 8, 7], classes=3)
    numbered_shards(tmp_path, [6], prefix="test", start=100, classes=3)
    model = vitkit.create_model("vit_ti16", num_classes=3, img_size=8, hidden_size=16, depth=1, num_heads=2,
                                mlp_dim=32, patch_size=4, in_chans=1)  # fmt: skip
    checkpoint = open_checkpoint(vitkit.save(model, tmp_path / "ckpt"))
    config = FewShotConfig(shots=(1, 3), seeds=2, device="cpu")
    uri, kept = f"wds:{tmp_path}", dict(image_size=8, channels=1, val_fraction=0.0)
    memory = run_fewshot(checkpoint, load_split(uri, "train", **kept), load_split(uri, "test", **kept), config)
    train, test = (load_split(uri, split, **kept, max_in_memory_bytes=0) for split in ("train", "test"))
    assert isinstance(train, ShardSet) and isinstance(test, ShardSet)
    streamed = run_fewshot(checkpoint, train, test, config)
    assert streamed.to_dict() == memory.to_dict() and streamed.num_test == 6
    # an image that does not decode (its label does) leaves the draws, and the shots are drawn again without it
    write_tar(tmp_path / "train-000003.tar", [("x0.png", b"not a png"), ("x0.cls", b"1"), ("x1.png", b"no label")])
    train = load_split(uri, "train", **kept, max_in_memory_bytes=0)
    assert len(train) == 26
    again = run_fewshot(checkpoint, train, test, FewShotConfig(shots=(8,), seeds=3, device="cpu"))
    assert [run["seed"] for run in again.shots[8]["runs"]] == [0, 1, 2]  # 8 of class 1's 8 readable images
