"""Where shards are found: split names inside shard names, split folders, one shard file, the channel probe."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardkit import numbered_shards, png, write_tar
from vitkit.data.sources import describe


def test_split_names_inside_shard_names_are_read_as_timm_and_hf_name_them(tmp_path: Path, caplog) -> None:
    """imagenet1k-train-0000.tar beside imagenet1k-validation-00.tar: no name began with train-/val-/test-, so
    every shard was training data, the validation images among them, without a word."""
    from vitkit.data.tarshards import split_units

    numbered_shards(tmp_path, [6, 6], prefix="imagenet1k-train")
    numbered_shards(tmp_path, [4], prefix="imagenet1k-validation", start=12)
    numbered_shards(tmp_path, [3], prefix="contest_test", start=16)  # a word ending in "test" is no split name
    splits, _, _ = split_units(str(tmp_path))
    assert {name: [Path(u.path).name for u in units] for name, units in splits.items()} == {
        "train": ["imagenet1k-train-000000.tar", "imagenet1k-train-000001.tar"],
        "val": ["imagenet1k-validation-000000.tar"],
        "test": ["contest_test-000000.tar"],
    }


def test_shards_in_split_folders_are_read_as_those_splits(tmp_path: Path) -> None:
    """DIR/train/0000.tar beside DIR/validation/0000.tar (a layout of webdataset repositories) said "no train
    split"; each folder is its split, unless a shard's own name says otherwise."""
    from vitkit.data.tarshards import split_units

    numbered_shards(tmp_path / "train", [6, 6], prefix="shard")
    numbered_shards(tmp_path / "validation", [4], prefix="shard", start=12)
    numbered_shards(tmp_path / "test", [3], prefix="data-test", start=16)
    numbered_shards(tmp_path / "extra", [3], prefix="shard", start=19)  # not a split name: not read
    splits, _, _ = split_units(str(tmp_path))
    assert {name: [str(Path(u.path).relative_to(tmp_path)) for u in units] for name, units in splits.items()} == {
        "train": ["train/shard-000000.tar", "train/shard-000001.tar"],
        "val": ["validation/shard-000000.tar"],
        "test": ["test/data-test-000000.tar"],
    }
    info = describe(f"wds:{tmp_path}")
    assert (info.num_train, info.num_classes) == (12, 10)
    numbered_shards(tmp_path, [2], prefix="train", start=22)  # shards at the top: the folders are not searched
    assert [Path(u.path).name for u in split_units(str(tmp_path))[0]["train"]] == ["train-000000.tar"]


def test_one_shard_file_is_a_pattern_of_one(tmp_path: Path) -> None:
    """wds:DIR/train-000000.tar was "no such directory (or brace pattern of .tar files)"."""
    from vitkit.data.tarshards import split_units

    numbered_shards(tmp_path, [5, 4])
    splits, _, _ = split_units(str(tmp_path / "train-000001.tar"))
    assert [Path(u.path).name for u in splits["train"]] == ["train-000001.tar"]
    splits, _, _ = split_units(str(tmp_path / "train-000000.tar"))
    numbered_shards(tmp_path, [3], prefix="test", start=9)
    splits, _, _ = split_units(str(tmp_path / "test-000000.tar"))  # given as the training shard: not also test
    assert [Path(u.path).name for u in splits["train"]] == ["test-000000.tar"] and "test" not in splits


def test_the_channel_probe_looks_past_a_first_shard_of_gray_images(tmp_path: Path) -> None:
    """A colour set whose first 16 images were gray had been read as one channel, all colour thrown away."""
    gray = np.zeros((8, 8), np.uint8)
    colour = np.zeros((8, 8, 3), np.uint8)
    for k, pixels in enumerate((gray, colour)):
        members = [
            m for i in range(20) for m in ((f"{k}_{i:03d}.png", png(pixels)), (f"{k}_{i:03d}.cls", b"%d" % (i % 2)))
        ]
        write_tar(tmp_path / f"train-{k:06d}.tar", members)
    assert describe(f"wds:{tmp_path}").channels == 3


def test_labels_that_are_no_class_index_are_refused_up_front_beside_a_class_file(tmp_path: Path) -> None:
    """.json labels that are no class index (1.5) beside a classes.txt: every sample was skipped as corrupt one line
    at a time, after a plan "for 0px images", where without classes.txt the same shards were one line up front."""
    import json

    import pytest

    members = []
    for i in range(4):
        members += [
            (f"s{i}.png", png(np.full((8, 8), i, np.uint8))),
            (f"s{i}.json", json.dumps({"label": 1.5}).encode()),
        ]
    write_tar(tmp_path / "train-000000.tar", members)
    with pytest.raises(ValueError, match="no sample has a label that reads as a class index; the first: .*s0"):
        describe(f"wds:{tmp_path}")
    (tmp_path / "classes.txt").write_text("cat\ndog\n")
    with pytest.raises(ValueError, match="no sample has a label that reads as a class index; the first: .*s0"):
        describe(f"wds:{tmp_path}")
