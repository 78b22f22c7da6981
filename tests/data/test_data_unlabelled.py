"""Sources without labels (a flat folder of images, shards without .cls members, an hf dataset without a label
column): masked patch prediction reads them as one class, every image kept; a classifier's reading refuses
them and names the command that takes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from shardkit import image_ids, numbered_images, png, write_tar
from vitkit.cli import main
from vitkit.data.imageset import UNLABELLED
from vitkit.data.sources import describe, load_split
from vitkit.data.stream import ShardSet, read_all

COUNT = 40  # images; a fixed 20% (8) is held out as the test split


def _flat_folder(root: Path) -> str:
    root.mkdir()
    for i, pixels in enumerate(numbered_images(COUNT)[0]):
        Image.fromarray(pixels).save(root / f"img{i:03d}.png")
    return f"folder:{root}"


def _bare_shards(root: Path) -> str:
    root.mkdir()
    images = numbered_images(COUNT)[0]
    write_tar(root / "train-000000.tar", [(f"s{i:06d}.png", png(images[i])) for i in range(24)])
    write_tar(root / "train-000001.tar", [(f"s{i:06d}.png", png(images[i])) for i in range(24, COUNT)])
    return f"wds:{root}"


def _hf(root: Path, parquet: bool) -> str:
    datasets = pytest.importorskip("datasets")
    rows = {"picture": [{"bytes": png(pixels), "path": None} for pixels in numbered_images(COUNT)[0]]}
    found = datasets.Dataset.from_dict(rows, features=datasets.Features({"picture": datasets.Image()}))
    if parquet:
        (root / "data").mkdir(parents=True)
        found.to_parquet(str(root / "data" / "train-00000-of-00001.parquet"), batch_size=8)
    else:
        found.save_to_disk(str(root))
    return f"hf:{root}"


SOURCES = {
    "folder": _flat_folder,
    "wds": _bare_shards,
    "hf-arrow": lambda root: _hf(root, parquet=False),
    "hf-parquet": lambda root: _hf(root, parquet=True),
}


@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_a_source_without_labels_reads_as_one_class_for_masked_patch_prediction(tmp_path: Path, kind: str) -> None:
    uri = SOURCES[kind](tmp_path / "data")
    info = describe(uri, image_size=8, labelled=False)
    assert (info.num_train, info.num_classes) == (COUNT - 8, 1)
    train = load_split(uri, "train", image_size=8, labelled=False)
    test = load_split(uri, "test", image_size=8, labelled=False)
    assert train.class_names == [UNLABELLED] and test.class_names == [UNLABELLED]
    assert (len(train), len(test)) == (COUNT - 8, 8)
    assert sorted(image_ids(train.images) + image_ids(test.images)) == list(range(COUNT))  # every image, once
    assert not train.labels.any() and not test.labels.any()
    with pytest.raises(ValueError, match="pretrain-mpp"):  # a classifier's reading: no labels, no guess
        load_split(uri, "train", image_size=8)


@pytest.mark.parametrize("kind", ["wds", "hf-parquet"])
def test_a_streamed_source_without_labels_yields_class_zero(tmp_path: Path, kind: str) -> None:
    uri = SOURCES[kind](tmp_path / "data")
    stream = load_split(uri, "train", image_size=8, labelled=False, max_in_memory_bytes=0)
    assert isinstance(stream, ShardSet) and stream.class_names == [UNLABELLED]
    samples = read_all(stream)
    assert len(samples) == COUNT - 8 and {s.label for s in samples} == {0}


def test_labelled_shards_keep_their_labels_when_read_without_labels(tmp_path: Path) -> None:
    """Labels where they exist are kept: the same shards read either way give the same classes."""
    from shardkit import numbered_shards

    numbered_shards(tmp_path / "data", [20, 20], classes=4)
    uri = f"wds:{tmp_path / 'data'}"
    plain, bare = load_split(uri, "train", image_size=8), load_split(uri, "train", image_size=8, labelled=False)
    assert plain.class_names == bare.class_names == ["0", "1", "2", "3"]
    assert torch.equal(plain.labels, bare.labels) and torch.equal(plain.images, bare.images)


def test_pretrain_mpp_trains_on_a_flat_folder_that_train_refuses(tmp_path: Path, capsys) -> None:
    uri = _flat_folder(tmp_path / "photos")
    argv = ["--data", uri, "--recipe", "small-32px-tiny", "--img-size", "8", "--epochs", "1", "--batch-size", "8"]
    argv += ["--set", "model.patch_size=4", "--set", "run.tensorboard=false", "--json"]
    assert main(["pretrain-mpp", *argv, "--out", str(tmp_path / "run")]) == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["status"] == "finished" and result["steps"] == (COUNT - 8) // 8
    assert main(["train", *argv, "--out", str(tmp_path / "classifier")]) == 2
    assert "pretrain-mpp" in capsys.readouterr().err
