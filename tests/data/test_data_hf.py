"""hf: sources made in the test with `datasets` (never a hub): save_to_disk Arrow and Parquet files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from shardkit import image_ids, numbered_images, png
from vitkit.data.images import decode_image
from vitkit.data.loader import FileBatches, IndexStream, eval_batches
from vitkit.data.shard import write_shards
from vitkit.data.sources import describe, load_split
from vitkit.data.stream import ShardBatches, ShardSet, Unit, read_all

datasets = pytest.importorskip("datasets")
from hfkit import CLASSES, labelled_dataset, renamed, truth  # noqa: E402 - after the skip


def test_saved_dataset_dict_is_read_map_style(tmp_path: Path) -> None:
    datasets.DatasetDict({"train": labelled_dataset(30), "validation": labelled_dataset(6, start=30)}).save_to_disk(
        str(tmp_path)
    )
    uri = f"hf:{tmp_path}"
    info = describe(uri)
    assert (info.num_train, info.num_classes, info.image_size, info.channels, info.in_memory) == (30, 4, 8, 1, True)
    train = load_split(uri, "train", image_size=8)
    assert train.access == "memory" and train.class_names == CLASSES
    assert torch.equal(train.images, truth(30)[0]) and torch.equal(train.labels, truth(30)[1])
    test = load_split(uri, "test", image_size=8)  # no test split: validation stands in
    assert image_ids(test.images) == list(range(30, 36))
    assert test.origin == f"{uri} validation split Arrow rows (no test split: it stands in)"  # it said "test"
    files = load_split(uri, "train", image_size=8, val_fraction=0.25, seed=3, max_in_memory_bytes=0)
    assert files.access == "files" and len(files) == 22 and "row" in files.name(0)
    loader = FileBatches(
        files,
        IndexStream(len(files), 0),
        start_step=0,
        total_steps=2,
        global_batch=11,
        rank=0,
        world=1,
        micro_batch=11,
        device=torch.device("cpu"),
        workers=2,
        strict=False,
    )
    seen = [i for step in loader for images, labels in step for i in image_ids(images)]  # rows read in workers
    held = load_split(uri, "val", image_size=8, val_fraction=0.25, seed=3)
    assert sorted(seen + image_ids(held.images)) == list(range(30))


def test_parquet_files_are_streamed_by_row_group(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    labelled_dataset(40).to_parquet(str(tmp_path / "data" / "train-00000-of-00001.parquet"), batch_size=8)
    labelled_dataset(8, start=40).to_parquet(str(tmp_path / "data" / "test-00000-of-00001.parquet"), batch_size=8)
    uri = f"hf:{tmp_path}"
    train = load_split(uri, "train", image_size=8, max_in_memory_bytes=0)
    assert isinstance(train, ShardSet) and [u.count for u in train.units] == [8] * 5 and train.class_names == CLASSES
    samples = read_all(train)
    assert [s.label for s in samples] == truth(40)[1].tolist()
    memory = load_split(uri, "train", image_size=8)
    assert torch.equal(memory.images, truth(40)[0])
    stream = ShardBatches(
        train,
        seed=0,
        global_batch=10,
        rank=0,
        world=1,
        micro_batch=5,
        device=torch.device("cpu"),
        workers=0,
        strict=False,
        window=8,
    )
    iterator = iter(stream)
    first = [i for _ in range(4) for images, _ in next(iterator) for i in image_ids(images)]
    assert sorted(first) == list(range(40)) and first != list(range(40))  # one epoch, shuffled
    test = load_split(uri, "test", image_size=8, max_in_memory_bytes=0)
    assert test.origin == f"1 Parquet file(s) of {uri} test split (1 row groups)"
    evaluated = [i for images, _ in eval_batches(test, 3, torch.device("cpu"), workers=2) for i in image_ids(images)]
    assert sorted(evaluated) == list(range(40, 48))


def test_columns_by_type_or_by_name_and_integer_labels(tmp_path: Path) -> None:
    labelled_dataset(12, extra_image=True).save_to_disk(str(tmp_path / "two"))
    with pytest.raises(ValueError, match=r"several \(picture, thumb\) image columns.*--image-column NAME"):
        load_split(f"hf:{tmp_path / 'two'}", "train")
    data = load_split(f"hf:{tmp_path / 'two'}", "train", image_size=8, image_column="thumb")
    assert torch.equal(data.images, truth(12)[0][image_ids(data.images)])  # one split: less the fixed hold-out
    with pytest.raises(ValueError, match="not a column"):
        load_split(f"hf:{tmp_path / 'two'}", "train", image_column="nope")
    labelled_dataset(12, int_labels=True).save_to_disk(str(tmp_path / "ints"))  # a single Dataset: the train split
    plain = load_split(f"hf:{tmp_path / 'ints'}", "train", image_size=8)
    assert plain.class_names == ["0", "1", "2", "3"]
    assert torch.equal(plain.labels, truth(12)[1][image_ids(plain.images)])


@pytest.mark.parametrize("stored", ["arrow", "parquet"])
def test_a_dataset_of_one_split_holds_out_the_fixed_test_split(tmp_path: Path, stored: str) -> None:
    """A `Dataset.save_to_disk` or Parquet files of train alone hold out 20% of every class, as every source
    without a test split does (Parquet's "test" was its whole training split)."""
    if stored == "arrow":
        labelled_dataset(40).save_to_disk(str(tmp_path / "one"))
    else:
        (tmp_path / "one" / "data").mkdir(parents=True)
        labelled_dataset(40).to_parquet(str(tmp_path / "one" / "data" / "train-00000-of-00001.parquet"), batch_size=8)
    uri = f"hf:{tmp_path / 'one'}"
    train, test = (load_split(uri, part, image_size=8) for part in ("train", "test"))
    assert len(test) == 8 and len(train) == 32 and "hold-out" in test.origin
    assert sorted(image_ids(train.images) + image_ids(test.images)) == list(range(40))
    assert torch.bincount(test.labels).tolist() == [2, 2, 2, 2]
    assert describe(uri, image_size=8).num_train == 32
    if stored == "parquet":  # streamed, the same hold-out
        streamed = read_all(load_split(uri, "test", image_size=8, max_in_memory_bytes=0))
        pixels = torch.stack([decode_image(s.image, 1, size=8) for s in streamed])
        assert sorted(image_ids(pixels)) == sorted(image_ids(test.images))


def test_unlabelled_rows_are_dropped_and_hf_shards_round_trip(tmp_path: Path) -> None:
    rows = labelled_dataset(10).to_dict()
    rows["target"][3] = -1
    datasets.Dataset.from_dict(rows, features=labelled_dataset(1).features).save_to_disk(str(tmp_path / "ds"))
    uri = f"hf:{tmp_path / 'ds'}"
    source = {part: load_split(uri, part, image_size=8) for part in ("train", "test")}  # one split: a hold-out
    assert sorted(image_ids(source["train"].images) + image_ids(source["test"].images)) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    write_shards(uri, tmp_path / "wds", 4)
    # the source's fixed hold-out is written as the test shards: each side holds the same rows and labels
    for part in ("train", "test"):
        shards = load_split(f"wds:{tmp_path / 'wds'}", part, image_size=8)
        assert shards.class_names == CLASSES and len(shards) >= 1
        want = dict(zip(image_ids(source[part].images), source[part].labels.tolist()))
        assert dict(zip(image_ids(shards.images), shards.labels.tolist())) == want


def test_train_cli_threads_the_column_choice(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from vitkit.cli import main

    labelled_dataset(24, extra_image=True).save_to_disk(str(tmp_path / "two"))
    command = [
        "train",
        "--data",
        f"hf:{tmp_path / 'two'}",
        "--recipe",
        "small-8px-tiny",
        "--out",
        str(tmp_path / "run"),
        "--json",
        "--set",
        "run.threads=1",
        "--set",
        "data.steps=2",
        "--set",
        "data.val_fraction=0.25",
        "--set",
        "eval.final_split=val",
    ]
    assert main(command) == 2 and "choose one with --image-column NAME" in capsys.readouterr().err
    assert main([*command, "--image-column", "thumb"]) == 0  # as eval, fewshot, embed, inspect and shard take it
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # 24 rows of one split: 20 train after the fixed test hold-out, then round(0.25 x 5) = 1 of each class for val
    assert result["step"] == 2 and result["val"]["count"] == 4
    # the verbs that read the run's own data read it with the run's columns
    run, uri = str(tmp_path / "run"), f"hf:{tmp_path / 'two'}"
    assert main(["eval", run, "--data", uri, "--split", "train", "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["num_images"] == 20
    assert main(["embed", run, "--data", uri, "--split", "train", "--out", str(tmp_path / "e.npy")]) == 0


def test_row_group_labels_are_read_once_while_the_file_is_unchanged(tmp_path: Path, monkeypatch) -> None:
    """Each load of a one-split Parquet dataset draws its fixed test hold-out from the label column; the column
    is read once a process while the file's size and mtime hold, and again once it changes."""
    import pyarrow.parquet as pq

    from vitkit.data import hf

    path = tmp_path / "train-00000-of-00001.parquet"
    labelled_dataset(24).to_parquet(str(path), batch_size=8)
    units = [Unit(str(path), 8, part) for part in range(3)]
    opened = []
    real = pq.ParquetFile
    monkeypatch.setattr(pq, "ParquetFile", lambda *args, **kwargs: opened.append(args[0]) or real(*args, **kwargs))
    first = hf.row_group_labels(units, "target")
    assert [label for labels in first for label in labels] == truth(24)[1].tolist()
    assert hf.row_group_labels(units, "target") == first and len(opened) == 3  # one read of each row group
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert hf.row_group_labels(units, "target") == first and len(opened) == 6


@pytest.mark.parametrize("stored", ["arrow", "parquet"])
def test_a_row_without_a_label_is_dropped_as_minus_one_is(tmp_path: Path, stored: str, caplog) -> None:
    """An integer label column holding None, without class names: "cannot convert float NaN to integer"."""
    rows = labelled_dataset(10, int_labels=True).to_dict()
    rows["target"][3], rows["target"][6] = None, -1
    found = datasets.Dataset.from_dict(rows, features=labelled_dataset(1, int_labels=True).features)
    if stored == "arrow":
        found.save_to_disk(str(tmp_path / "ds"))
    else:
        (tmp_path / "ds" / "data").mkdir(parents=True)
        found.to_parquet(str(tmp_path / "ds" / "data" / "train-00000-of-00001.parquet"))
    uri = f"hf:{tmp_path / 'ds'}"
    with caplog.at_level("WARNING"):
        parts = [load_split(uri, part, image_size=8) for part in ("train", "test")]
    kept = sorted(i for part in parts for i in image_ids(part.images))
    assert kept == [0, 1, 2, 4, 5, 7, 8, 9] and parts[0].class_names == ["0", "1", "2", "3"]
    if stored == "arrow":  # said once, not at every read of the split (4 times a run)
        assert caplog.text.count("dropping 2 unlabelled row(s)") == 1


def test_the_evaluating_verbs_take_the_column_choice(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A dataset of two label columns, evaluated with a checkpoint that is no run of it: the error said
    "choose one with --set data.label_column=NAME", a flag eval, fewshot, embed and inspect do not have."""
    import vitkit
    from vitkit.cli import main

    rows = labelled_dataset(40, int_labels=True).to_dict()
    rows["coarse"] = [t // 2 for t in rows["target"]]
    features = datasets.Features({**labelled_dataset(1, int_labels=True).features, "coarse": datasets.Value("int64")})
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "ds"))
    uri, model = f"hf:{tmp_path / 'ds'}", tmp_path / "model"
    vitkit.save(vitkit.create_model("vit_ti16", img_size=8, patch_size=4, num_classes=4, in_chans=1), model)
    assert main(["eval", str(model), "--data", uri]) == 2
    assert "--label-column NAME" in capsys.readouterr().err
    picked = ["--label-column", "target"]
    assert main(["eval", str(model), "--data", uri, *picked, "--json"]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["num_images"] == 8
    assert main(["fewshot", str(model), "--data", uri, *picked, "--shots", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["num_classes"] == 4
    embedded = ["embed", str(model), "--data", uri, *picked, "--out", str(tmp_path / "e.npy"), "--json"]
    assert main(embedded) == 0, capsys.readouterr().err
    inspected = ["inspect", str(model), "--data", uri, *picked, "--num-images", "2", "--no-figures"]
    assert main([*inspected, "--out", str(tmp_path / "fig")]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("stored", ["arrow", "parquet"])
def test_a_split_whose_class_names_are_in_another_order_is_read_by_name(tmp_path: Path, stored: str) -> None:
    """`DatasetDict.class_encode_column` encodes every split alone: a test split without one class, or with its
    names met in another order, numbers them otherwise than train.  Read by number, a right model scored 0%."""
    train, test = labelled_dataset(30), renamed(labelled_dataset(8, start=30), ["dog", "ant", "cat", "bee"])
    if stored == "arrow":
        datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path))
    else:
        (tmp_path / "data").mkdir()
        train.to_parquet(str(tmp_path / "data" / "train-00000-of-00001.parquet"), batch_size=8)
        test.to_parquet(str(tmp_path / "data" / "test-00000-of-00001.parquet"), batch_size=8)
    read = load_split(f"hf:{tmp_path}", "test", image_size=8)  # in memory, a stream decoded
    assert read.class_names == CLASSES and read.labels.tolist() == truth(8, start=30)[1].tolist()


@pytest.mark.parametrize("withheld", [-1, None])
def test_an_unlabelled_test_split_gives_way_to_validation(tmp_path: Path, withheld) -> None:
    """ImageNet's layout on the Hub: a test split whose labels are all -1 (or an untyped column of nulls) beside
    a labelled validation split.  The test split's rows were dropped as unlabelled, and the run stopped with
    "no usable sample"."""
    unlabelled = labelled_dataset(6, start=36).remove_columns("target").add_column("target", [withheld] * 6)
    if withheld is not None:
        unlabelled = unlabelled.cast(labelled_dataset(1).features)
    splits = {"train": labelled_dataset(30), "validation": labelled_dataset(6, start=30), "test": unlabelled}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path))
    test = load_split(f"hf:{tmp_path}", "test", image_size=8)
    assert image_ids(test.images) == list(range(30, 36))
    assert "validation split" in test.origin and "test split holds no label" in test.origin
    _validation_is_the_test_split(f"hf:{tmp_path}", tmp_path / "shards")


def _validation_is_the_test_split(uri: str, shards: Path) -> None:
    """Validation standing in for the test split is the test split: a run validates on a hold-out of train (it
    validated on the test images), `--split val` is refused, and `vitkit shard` writes it once (val-* and test-*
    shards were byte-identical)."""
    from vitkit.data.sources import check_named_split, separate_val

    assert not separate_val(uri)
    val = load_split(uri, "val", image_size=8, val_fraction=0.2)
    assert "hold-out" in val.origin and set(image_ids(val.images)) < set(range(30))
    with pytest.raises(ValueError, match="its val split is also its test split"):
        check_named_split(uri, "val")
    write_shards(uri, shards, 100)
    assert sorted(p.name for p in shards.glob("*.tar")) == ["train-000000.tar", "val-000000.tar"]


def test_a_test_split_without_the_label_column_gives_way(tmp_path: Path) -> None:
    """A competition's test split holds images only: reading it was a KeyError traceback ('Field "label" does not
    exist in schema').  It is a test split without labels: validation stands in, or the fixed test hold-out."""
    images_only = labelled_dataset(6, start=36).remove_columns("target")
    splits = {"train": labelled_dataset(30), "validation": labelled_dataset(6, start=30), "test": images_only}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "with_val"))
    test = load_split(f"hf:{tmp_path / 'with_val'}", "test", image_size=8)
    assert image_ids(test.images) == list(range(30, 36)) and "test split holds no label" in test.origin
    _validation_is_the_test_split(f"hf:{tmp_path / 'with_val'}", tmp_path / "shards")
    # read without labels (pretrain-mpp, shard --no-labels) the test split is one of its splits
    from vitkit.data.sources import separate_val

    assert separate_val(f"hf:{tmp_path / 'with_val'}", {"labelled": False})
    test = load_split(f"hf:{tmp_path / 'with_val'}", "test", image_size=8, labelled=False)
    assert image_ids(test.images) == list(range(36, 42))
    write_shards(f"hf:{tmp_path / 'with_val'}", tmp_path / "unlabelled", 100, labelled=False)
    assert len(list((tmp_path / "unlabelled").glob("test-*.tar"))) == 1
    # two label columns: the one the flags choose says whether the test split holds labels
    two = {name: ds.add_column("coarse", [0] * len(ds)) for name, ds in splits.items() if name != "test"}
    datasets.DatasetDict({**two, "test": images_only}).save_to_disk(str(tmp_path / "two"))
    chosen = {"label_column": "target"}
    assert not separate_val(f"hf:{tmp_path / 'two'}", chosen)
    val = load_split(f"hf:{tmp_path / 'two'}", "val", image_size=8, val_fraction=0.2, **chosen)
    assert set(image_ids(val.images)) < set(range(30))  # a hold-out of train, not the validation split
    datasets.DatasetDict({"train": labelled_dataset(30), "test": images_only}).save_to_disk(str(tmp_path / "alone"))
    test = load_split(f"hf:{tmp_path / 'alone'}", "test", image_size=8)  # the fixed 20% hold-out of train
    assert set(image_ids(test.images)) < set(range(30)) and "hold-out" in test.origin


def test_a_plain_parquet_column_of_image_bytes_named_image_is_the_image_column(tmp_path: Path) -> None:
    """Parquet written by pandas or pyarrow, no Hugging Face features: a binary column `image` beside an integer
    `label` was "no image columns among image, label"."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    images, labels = numbered_images(10, classes=len(CLASSES))
    table = pa.table({"image": [png(images[i]) for i in range(10)], "label": labels.tolist()})
    (tmp_path / "data").mkdir()
    pq.write_table(table, tmp_path / "data" / "train-00000-of-00001.parquet")
    data = load_split(f"hf:{tmp_path}", "train", image_size=8)
    assert torch.equal(data.images, torch.from_numpy(images[:, None])[image_ids(data.images)])
    assert data.labels.tolist() == labels[image_ids(data.images)].tolist()


def test_a_val_split_asked_of_a_one_split_dataset_names_its_test_hold_out(tmp_path: Path) -> None:
    """The error said "(it has: train)" of a dataset whose test split is its fixed hold-out."""
    labelled_dataset(12).save_to_disk(str(tmp_path))
    with pytest.raises(ValueError, match=r"no val split \(it has: train, and its fixed test hold-out\)"):
        load_split(f"hf:{tmp_path}", "val")


def test_channels_and_side_are_probed_across_a_class_sorted_split(tmp_path: Path) -> None:
    """Rows built from class folders are sorted by class, and the first 16 (one grayscale class, of small images)
    made a colour set grayscale, at the small class's side; folder: of the same images said 3 channels."""
    import io

    import numpy as np
    from PIL import Image

    def encoded(mode: str, side: int, k: int) -> dict:
        out = io.BytesIO()
        Image.fromarray(np.full((side, side, 3), k, np.uint8)).convert(mode).save(out, format="PNG")
        return {"bytes": out.getvalue(), "path": None}

    pictures = [encoded("L", 8, k) for k in range(20)] + [encoded("RGB", 24, k) for k in range(40)]
    features = datasets.Features({"picture": datasets.Image(), "target": datasets.ClassLabel(names=["a", "b"])})
    rows = {"picture": pictures, "target": [0] * 20 + [1] * 40}
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path))
    info = describe(f"hf:{tmp_path}")
    assert (info.channels, info.image_size) == (3, 24)
