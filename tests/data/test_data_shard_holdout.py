"""Tar shards with only a train split: the fixed class-stratified test hold-out (as a folder's), and class names
from classes.txt beside the shards."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from shardkit import image_ids, numbered_images, numbered_shards
from vitkit.data.sources import describe, load_split, stratified_split
from vitkit.data.stream import ShardBatches, read_all

CPU = torch.device("cpu")


def _stream_ids(data) -> list[int]:
    return [int(s.key.rpartition(":s")[2]) for s in read_all(data)]


@pytest.fixture()
def shards(tmp_path: Path) -> Path:
    numbered_shards(tmp_path, [30, 25, 35], classes=4)  # 90 samples, 4 classes, train-* shards only
    return tmp_path


def test_train_only_shards_hold_out_a_fixed_class_stratified_test_split(shards: Path) -> None:
    uri = f"wds:{shards}"
    train, test = load_split(uri, "train", image_size=8), load_split(uri, "test", image_size=8)
    kept, held = image_ids(train.images), image_ids(test.images)
    assert sorted(kept + held) == list(range(90)) and not set(kept) & set(held)
    labels = numbered_images(90, classes=4)[1]
    assert Counter(labels[held].tolist()) == {c: round(0.2 * n) for c, n in Counter(labels.tolist()).items()}
    assert sorted(held) == stratified_split(torch.from_numpy(labels), 0.2, 0)[1].tolist()  # the folder's draw
    assert test.labels.tolist() == labels[held].tolist()
    assert "fixed 20% class-stratified hold-out of 3 train shard(s)" in test.origin
    assert "minus the fixed 20% test hold-out" in train.origin
    assert describe(uri).num_train == len(train) == 72
    again = load_split(uri, "test", image_size=8)
    assert image_ids(again.images) == held  # the same on every call


def test_streamed_split_reads_the_same_samples_in_every_worker_and_after_a_resume(shards: Path) -> None:
    uri = f"wds:{shards}"
    memory = image_ids(load_split(uri, "train", image_size=8).images)
    streamed = load_split(uri, "train", image_size=8, max_in_memory_bytes=0)
    held = load_split(uri, "test", image_size=8, max_in_memory_bytes=0)
    assert streamed.access == held.access == "stream" and len(streamed) == 72 and len(held) == 18
    assert _stream_ids(streamed) == memory and sorted(_stream_ids(held)) == sorted(set(range(90)) - set(memory))

    def batches(workers: int, step: int = 0) -> list[int]:
        stream = ShardBatches(
            streamed,
            seed=0,
            global_batch=8,
            rank=0,
            world=1,
            micro_batch=4,
            device=CPU,
            workers=workers,
            strict=False,
            window=16,
        )
        stream.load_state_dict({**stream.state_dict(), "step": step})
        iterator = iter(stream)
        return [i for _ in range(20 - step) for images, _ in next(iterator) for i in image_ids(images)]

    one, two = batches(0), batches(2)
    assert Counter(one[:72]) == Counter(memory)  # one lane's first epoch: every kept sample once
    assert set(two) <= set(memory) and len(set(two)) > 60  # two lanes (workers): kept samples only
    assert batches(2, step=7) == two[7 * 8 :]  # resuming mid-round reads the held-back window again


def test_class_names_come_from_classes_txt(shards: Path) -> None:
    (shards / "classes.txt").write_text("n01\nn02\nn03\nn04\n\n")
    assert load_split(f"wds:{shards}", "train", image_size=8).class_names == ["n01", "n02", "n03", "n04"]
    pattern = load_split(f"wds:{shards}/train-{{000000..000001}}.tar", "train", image_size=8)
    assert pattern.class_names == ["n01", "n02", "n03", "n04"]
    assert describe(f"wds:{shards}").num_classes == 4


@pytest.mark.parametrize(
    "text, message",
    [
        ("n01\nn02\n", r"names 2 classes, but \S+-0000\d\d\.tar:s\d+ holds label 3"),
        ("n01\n\nn03\nn04\n", "line 2 is empty"),
        ("n01\nn02\nn01\nn04\n", "'n01' appears twice"),
        ("n01\nn02\x0cn03\nn04\n", "line 2's name holds a control character"),  # splitlines() made it 4 lines
        ("", "one class name per line"),
    ],
)
def test_a_bad_classes_txt_is_refused_with_its_reason(shards: Path, text: str, message: str) -> None:
    (shards / "classes.txt").write_text(text)
    with pytest.raises(ValueError, match=message):
        load_split(f"wds:{shards}", "train", image_size=8)
    (shards / "classes.txt").write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match="not UTF-8"):
        load_split(f"wds:{shards}", "train", image_size=8)


def test_shards_with_a_test_or_val_split_hold_nothing_out(shards: Path) -> None:
    numbered_shards(shards, [6], prefix="val", start=90, classes=4)
    assert len(load_split(f"wds:{shards}", "train", image_size=8)) == 90
    assert sorted(image_ids(load_split(f"wds:{shards}", "test", image_size=8).images)) == list(range(90, 96))


@pytest.mark.parametrize("sizes", [[90], [45, 45]], ids=["one shard", "two shards"])
def test_a_validation_hold_out_of_few_shards_is_the_asked_share_of_each_class(tmp_path: Path, sizes: list[int]) -> None:
    """Where whole shards cannot hold the asked share (one shard; one of two is half), the val hold-out is drawn
    class-stratified from the samples, as a folder's: the same in memory and streamed, disjoint from train and
    test."""
    numbered_shards(tmp_path, sizes, classes=3)
    uri = f"wds:{tmp_path}"
    test = image_ids(load_split(uri, "test", image_size=8).images)
    train, val = (load_split(uri, split, image_size=8, val_fraction=0.1, seed=2) for split in ("train", "val"))
    kept, held = image_ids(train.images), image_ids(val.images)
    assert sorted(kept + held + test) == list(range(90)) and not set(kept) & set(held)
    labels = numbered_images(90, classes=3)[1]
    rest = sorted(set(range(90)) - set(test))  # 72 samples, 24 of each class
    assert Counter(labels[held].tolist()) == {c: round(0.1 * 24) for c in range(3)}
    assert sorted(rest[i] for i in stratified_split(torch.from_numpy(labels[rest]), 0.1, 2)[1]) == sorted(held)
    assert "10.0% class-stratified hold-out" in val.origin
    streamed = load_split(uri, "val", image_size=8, val_fraction=0.1, seed=2, max_in_memory_bytes=0)
    assert streamed.access == "stream" and sorted(_stream_ids(streamed)) == sorted(held)
    streamed_train = load_split(uri, "train", image_size=8, val_fraction=0.1, seed=2, max_in_memory_bytes=0)
    assert sorted(_stream_ids(streamed_train)) == sorted(kept)


def test_a_validation_hold_out_of_many_shards_holds_out_whole_shards(tmp_path: Path) -> None:
    """Where a draw of whole shards holds about the asked share, those shards are the val split (a val pass
    reads them alone)."""
    numbered_shards(tmp_path, [10] * 10, classes=3)
    val = load_split(f"wds:{tmp_path}", "val", image_size=8, val_fraction=0.1, seed=0, max_in_memory_bytes=0)
    assert "10.0% whole-shard hold-out" in val.origin and len(val.units) == 1 and 7 <= len(val) <= 9  # of 80


def test_re_sharding_train_only_shards_writes_their_test_hold_out(shards: Path, tmp_path: Path) -> None:
    """`vitkit shard wds:DIR` of train-* shards alone wrote the training part only: the re-sharded set then held
    out a new 20% of the old training images, and evaluating on it scored images the model had trained on."""
    from vitkit.data.shard import write_shards

    uri = f"wds:{shards}"
    written = write_shards(uri, tmp_path / "again", 40)
    assert {s: v["samples"] for s, v in written["splits"].items()} == {"train": 72, "test": 18}
    held = image_ids(load_split(uri, "test", image_size=8).images)
    assert sorted(image_ids(load_split(f"wds:{tmp_path / 'again'}", "test", image_size=8).images)) == sorted(held)
