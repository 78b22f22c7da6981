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
