"""Sources read without labels (a folder of images, shards without .cls members, an hf dataset without a label
column): masked patch prediction reads every image as class 0 of one class and reads no label; a classifier's
reading refuses a source without labels and names the command that takes it."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitkit
from shardkit import image_ids, numbered_images, png, write_tar
from vitkit.cli import main
from vitkit.data.images import NoLabelsError, decode_image
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
def test_a_streamed_source_without_labels_holds_what_the_in_memory_one_does(tmp_path: Path, kind: str) -> None:
    uri = SOURCES[kind](tmp_path / "data")
    for part in ("train", "test"):
        stream = load_split(uri, part, image_size=8, labelled=False, max_in_memory_bytes=0)
        assert isinstance(stream, ShardSet) and stream.class_names == [UNLABELLED]
        samples = read_all(stream)
        assert {s.label for s in samples} == {0}
        streamed = image_ids(torch.stack([decode_image(s.image, 1, size=8) for s in samples]))
        assert sorted(streamed) == sorted(image_ids(load_split(uri, part, image_size=8, labelled=False).images))


def test_a_folder_read_without_labels_is_every_image_below_it_but_hidden_ones(tmp_path: Path) -> None:
    """Photos beside sub-folders (a year's folder) are all read; hidden copies (.ipynb_checkpoints, .name.png)
    and macOS's ._name.png metadata files are not."""
    root = tmp_path / "photos"
    images = numbered_images(COUNT)[0]
    for i, pixels in enumerate(images):
        folder = root if i < 20 else root / "2019" / ("deep" if i % 2 else "")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / f"img{i:03d}.png")
    (root / ".ipynb_checkpoints").mkdir()
    Image.fromarray(images[0]).save(root / ".ipynb_checkpoints" / "img000-checkpoint.png")
    Image.fromarray(images[1]).save(root / ".img001.png")  # a hidden file: read before, as its folder is not
    (root / "2019" / "._img021.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble")  # macOS metadata: a bad image
    train, test = (load_split(f"folder:{root}", part, image_size=8, labelled=False) for part in ("train", "test"))
    assert sorted(image_ids(train.images) + image_ids(test.images)) == list(range(COUNT))
    assert train.skipped == 0 and test.skipped == 0


def test_labels_are_not_read_without_labels(tmp_path: Path) -> None:
    """Shards where some samples have a label (one unreadable) and some none, and an hf dataset whose label
    column marks rows -1 beside an integer id column: every image is read, as class 0."""
    datasets = pytest.importorskip("datasets")
    images = numbered_images(COUNT)[0]
    members = []
    for i in range(COUNT):
        members.append((f"s{i:06d}.png", png(images[i])))
        if i % 3 == 0:
            members.append((f"s{i:06d}.cls", b"7" if i else b"not a label"))
    (tmp_path / "wds").mkdir()
    write_tar(tmp_path / "wds" / "train-000000.tar", members)
    rows = {
        "picture": [{"bytes": png(pixels), "path": None} for pixels in images],
        "label": [-1 if i % 2 else i % 4 for i in range(COUNT)],
        "id": list(range(COUNT)),
    }
    features = {
        "picture": datasets.Image(),
        "label": datasets.ClassLabel(names=list("abcd")),
        "id": datasets.Value("int64"),
    }
    datasets.Dataset.from_dict(rows, features=datasets.Features(features)).save_to_disk(str(tmp_path / "hf"))
    for uri in (f"wds:{tmp_path / 'wds'}", f"hf:{tmp_path / 'hf'}"):
        train, test = (load_split(uri, part, image_size=8, labelled=False) for part in ("train", "test"))
        assert train.class_names == [UNLABELLED] and not train.labels.any() and not test.labels.any()
        assert sorted(image_ids(train.images) + image_ids(test.images)) == list(range(COUNT)), uri


def test_pretrain_mpp_trains_on_a_flat_folder_that_train_refuses(tmp_path: Path, capsys) -> None:
    """The encoder it writes embeds the same folder: a run's own data is read as the run read it."""
    uri = _flat_folder(tmp_path / "photos")
    argv = ["--data", uri, "--recipe", "small-32px-tiny", "--img-size", "8", "--epochs", "1", "--batch-size", "8"]
    argv += ["--set", "model.patch_size=4", "--set", "run.tensorboard=false", "--json"]
    mpp = ["--set", "mpp.color_bits=2"]  # was refused: "mpp.* fields configure masked patch prediction"
    assert main(["pretrain-mpp", *argv, *mpp, "--out", str(tmp_path / "run")]) == 0, capsys.readouterr().err
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["status"] == "finished" and result["steps"] == (COUNT - 8) // 8
    assert json.loads((tmp_path / "run" / "config.json").read_text())["mpp"]["color_bits"] == 2
    embed = ["embed", str(tmp_path / "run"), "--data", uri, "--split", "train", "--out", str(tmp_path / "e.npy")]
    assert main([*embed, "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["shape"][0] == COUNT - 8
    assert main(["fewshot", str(tmp_path / "run"), "--data", uri, "--shots", "2"]) == 2  # it reported 100% of 1 class
    assert "needs 2 classes or more" in capsys.readouterr().err
    assert main(["train", *argv, "--out", str(tmp_path / "classifier")]) == 2
    assert "pretrain-mpp" in capsys.readouterr().err


def test_vitkit_shard_writes_a_folder_without_labels_as_shards_that_pretrain_mpp_reads(tmp_path: Path, capsys) -> None:
    """A large unlabelled collection goes to shards as a labelled one does: --no-labels writes images alone (no
    .cls, no classes), the fixed hold-out as the test shards; without the flag the refusal names it."""
    uri, out = _flat_folder(tmp_path / "photos"), tmp_path / "wds"
    assert main(["shard", uri, "--out", str(out), "--samples-per-shard", "10"]) == 2
    assert "vitkit shard --no-labels" in capsys.readouterr().err
    assert (
        main(["shard", uri, "--out", str(out), "--samples-per-shard", "10", "--no-labels", "--label-column", "y"]) == 2
    )
    assert "writing without labels leaves out" in capsys.readouterr().err
    assert main(["shard", uri, "--out", str(out), "--samples-per-shard", "10", "--no-labels", "--json"]) == 0
    written = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["splits"]
    assert {s: c["samples"] for s, c in written.items()} == {"train": COUNT - 8, "test": 8}
    index = json.loads((out / "dataset.json").read_text())
    assert index["classes"] is None
    members = [name for tar in sorted(out.glob("*.tar")) for name in tarfile.open(tar).getnames()]
    assert len(members) == COUNT and all(name.endswith(".png") for name in members)
    shards = {split: load_split(f"wds:{out}", split, image_size=8, labelled=False) for split in ("train", "test")}
    folder = {split: load_split(uri, split, image_size=8, labelled=False) for split in ("train", "test")}
    for split in ("train", "test"):  # the same images on the same side of the hold-out
        assert sorted(image_ids(shards[split].images)) == sorted(image_ids(folder[split].images))
    with pytest.raises(NoLabelsError, match="pretrain-mpp"):
        load_split(f"wds:{out}", "train", image_size=8)


def test_a_source_labelled_in_train_only_is_refused_before_anything_is_written(tmp_path: Path, capsys) -> None:
    """train/<class>/ beside a flat test/: the refusal names the unlabelled split and does not suggest dropping
    train's labels, and nothing is left in --out (a corrected re-run needs no clean-up)."""
    root = tmp_path / "src"
    images = numbered_images(12)[0]
    for i, pixels in enumerate(images):
        folder = root / "train" / "ab"[i % 2] if i < 8 else root / "test"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(folder / f"{i}.png")
    out = tmp_path / "wds"
    assert main(["shard", f"folder:{root}", "--out", str(out), "--samples-per-shard", "4"]) == 2
    error = capsys.readouterr().err
    assert "the train split has labels; give the test split its labels too" in error and "--no-labels" not in error
    assert not out.exists()


def test_an_encoder_pretrained_on_labelled_images_is_probed_with_their_labels(tmp_path: Path, capsys) -> None:
    """pretrain-mpp on class folders reads them without labels; fewshot and embed on the same folders read the
    labels (they were read as the run read them: one class, and fewshot reported a meaningless 100%)."""
    root = tmp_path / "classes"
    images, labels = numbered_images(COUNT, classes=4)
    for i, (pixels, label) in enumerate(zip(images, labels)):
        (root / f"c{label}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels).save(root / f"c{label}" / f"img{i:03d}.png")
    uri, run = f"folder:{root}", str(tmp_path / "run")
    argv = ["--data", uri, "--recipe", "small-32px-tiny", "--img-size", "8", "--epochs", "1", "--batch-size", "8"]
    argv += ["--set", "model.patch_size=4", "--set", "run.tensorboard=false", "--out", run]
    assert main(["pretrain-mpp", *argv]) == 0, capsys.readouterr().err
    capsys.readouterr()
    out = tmp_path / "e.npy"
    assert main(["embed", run, "--data", uri, "--split", "train", "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "e.json").read_text())["class_names"] == ["c0", "c1", "c2", "c3"]
    assert sorted(set(np.load(tmp_path / "e.labels.npy").tolist())) == [0, 1, 2, 3]
    assert main(["fewshot", run, "--data", uri, "--shots", "2", "--json"]) == 0, capsys.readouterr().err
    probed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert probed["num_classes"] == 4 and probed["num_test"] == 8


def test_an_encoder_without_a_head_is_no_classifier(tmp_path: Path, capsys) -> None:
    """predict showed a softmax over the encoder's 32 features as class probabilities; eval said the model
    "predicts 32 classes"; serve served it."""
    from vitkit.serve.model import load_model

    uri, run = _flat_folder(tmp_path / "photos"), str(tmp_path / "run")
    argv = ["--data", uri, "--recipe", "small-32px-tiny", "--img-size", "8", "--epochs", "1", "--batch-size", "8"]
    assert main(["pretrain-mpp", *argv, "--set", "model.patch_size=4", "--out", run]) == 0
    capsys.readouterr()
    image = str(tmp_path / "photos" / "img000.png")
    for verb in (["predict", run, image], ["eval", run, "--data", "digits"]):
        assert main(verb) == 2
        err = capsys.readouterr().err
        assert "has no classification head" in err and "vitkit finetune" in err, err
    with pytest.raises(ValueError, match="has no classification head"):
        load_model(run)
    with pytest.raises(ValueError, match="has no classification head"):  # the Python API as the command
        vitkit.predict(run, image)


def test_predict_reads_a_folder_as_training_does(tmp_path: Path) -> None:
    """Hidden files and folders were predicted (and macOS's ._x.png metadata reported as bad images)."""
    from vitkit.eval.predict import expand_inputs

    root = tmp_path / "photos"
    (root / "a" / ".ipynb_checkpoints").mkdir(parents=True)
    for path in (
        root / "a" / "x.png",
        root / "a" / ".x.png",
        root / "._x.png",
        root / "a" / ".ipynb_checkpoints" / "y.png",
    ):
        Image.new("L", (4, 4)).save(path, format="PNG")
    assert expand_inputs([root]) == [root / "a" / "x.png"]
    assert expand_inputs([root / "._x.png"]) == [root / "._x.png"]  # a file named is read, hidden or not


def test_vitkit_shard_of_one_class_does_not_suggest_a_classifier(tmp_path: Path, capsys) -> None:
    """One labelled class folder was written and followed by "train with: vitkit train --data wds:OUT", which
    then fails for having one class."""
    (tmp_path / "one" / "only").mkdir(parents=True)
    for i in range(12):
        Image.fromarray(np.full((8, 8, 3), 20 * i, np.uint8)).save(tmp_path / "one" / "only" / f"{i}.png")
    out = tmp_path / "wds"
    assert main(["shard", f"folder:{tmp_path / 'one'}", "--out", str(out), "--samples-per-shard", "10"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "vitkit train" not in last and f"vitkit pretrain-mpp --data wds:{out}" in last and "1 class" in last


def test_a_flat_folder_is_said_as_images_of_one_class_and_a_plain_hold_out(tmp_path: Path, caplog) -> None:
    """It was "40 images, 1 classes" with "a fixed 20% class-stratified hold-out": no class was read."""
    import logging

    uri = _flat_folder(tmp_path / "flat")
    with caplog.at_level(logging.INFO, logger="vitkit"):
        test = load_split(uri, "test", image_size=8, labelled=False)
    assert test.origin.startswith("a fixed 20% hold-out of ") and "classes" not in caplog.text
    assert f"{uri} test: 8 images, 1 class, in memory" in caplog.text
