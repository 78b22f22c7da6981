"""hf: sources made in the test with `datasets` (never a hub): save_to_disk Arrow and Parquet files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from shardkit import image_ids, numbered_images, png
from vitkit.data.images import BadImageError, decode_image
from vitkit.data.loader import FileBatches, IndexStream, eval_batches
from vitkit.data.shard import write_shards
from vitkit.data.sources import describe, load_split
from vitkit.data.stream import ShardBatches, ShardSet, Unit, read_all

datasets = pytest.importorskip("datasets")
CLASSES = ["ant", "bee", "cat", "dog"]


def _dataset(count: int, start: int = 0, extra_image: bool = False, int_labels: bool = False):
    images, labels = numbered_images(start + count, classes=len(CLASSES))
    features = {
        "picture": datasets.Image(),
        "target": datasets.Value("int64") if int_labels else datasets.ClassLabel(names=CLASSES),
        "weight": datasets.Value("float32"),
    }
    rows = {
        "picture": [{"bytes": png(images[i]), "path": None} for i in range(start, start + count)],
        "target": labels[start:].tolist(),
        "weight": [0.5] * count,
    }
    if extra_image:
        features["thumb"] = datasets.Image()
        rows["thumb"] = rows["picture"]
    return datasets.Dataset.from_dict(rows, features=datasets.Features(features))


def _truth(count: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = numbered_images(start + count, classes=len(CLASSES))
    return torch.from_numpy(images[start:, None]), torch.from_numpy(labels[start:])


def test_saved_dataset_dict_is_read_map_style(tmp_path: Path) -> None:
    datasets.DatasetDict({"train": _dataset(30), "validation": _dataset(6, start=30)}).save_to_disk(str(tmp_path))
    uri = f"hf:{tmp_path}"
    info = describe(uri)
    assert (info.num_train, info.num_classes, info.image_size, info.channels, info.in_memory) == (30, 4, 8, 1, True)
    train = load_split(uri, "train", image_size=8)
    assert train.access == "memory" and train.class_names == CLASSES
    assert torch.equal(train.images, _truth(30)[0]) and torch.equal(train.labels, _truth(30)[1])
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
    _dataset(40).to_parquet(str(tmp_path / "data" / "train-00000-of-00001.parquet"), batch_size=8)
    _dataset(8, start=40).to_parquet(str(tmp_path / "data" / "test-00000-of-00001.parquet"), batch_size=8)
    uri = f"hf:{tmp_path}"
    train = load_split(uri, "train", image_size=8, max_in_memory_bytes=0)
    assert isinstance(train, ShardSet) and [u.count for u in train.units] == [8] * 5 and train.class_names == CLASSES
    samples = read_all(train)
    assert [s.label for s in samples] == _truth(40)[1].tolist()
    memory = load_split(uri, "train", image_size=8)
    assert torch.equal(memory.images, _truth(40)[0])
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
    _dataset(12, extra_image=True).save_to_disk(str(tmp_path / "two"))
    with pytest.raises(ValueError, match=r"several \(picture, thumb\) image columns.*--image-column NAME"):
        load_split(f"hf:{tmp_path / 'two'}", "train")
    data = load_split(f"hf:{tmp_path / 'two'}", "train", image_size=8, image_column="thumb")
    assert torch.equal(data.images, _truth(12)[0][image_ids(data.images)])  # one split: less the fixed hold-out
    with pytest.raises(ValueError, match="not a column"):
        load_split(f"hf:{tmp_path / 'two'}", "train", image_column="nope")
    _dataset(12, int_labels=True).save_to_disk(str(tmp_path / "ints"))  # a single Dataset: the train split
    plain = load_split(f"hf:{tmp_path / 'ints'}", "train", image_size=8)
    assert plain.class_names == ["0", "1", "2", "3"]
    assert torch.equal(plain.labels, _truth(12)[1][image_ids(plain.images)])


@pytest.mark.parametrize("stored", ["arrow", "parquet"])
def test_a_dataset_of_one_split_holds_out_the_fixed_test_split(tmp_path: Path, stored: str) -> None:
    """A `Dataset.save_to_disk` or Parquet files of train alone hold out 20% of every class, as every source
    without a test split does (Parquet's "test" was its whole training split)."""
    if stored == "arrow":
        _dataset(40).save_to_disk(str(tmp_path / "one"))
    else:
        (tmp_path / "one" / "data").mkdir(parents=True)
        _dataset(40).to_parquet(str(tmp_path / "one" / "data" / "train-00000-of-00001.parquet"), batch_size=8)
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


def test_a_damaged_row_group_of_a_one_split_parquet_dataset_is_skipped_not_fatal(tmp_path: Path) -> None:
    """Drawing the hold-out reads each row group's labels: a damaged one keeps its rows on the train side, where
    they are skipped as corrupt, as reading the row group itself does."""
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "data" / "train-00000-of-00001.parquet"
    path.parent.mkdir()
    _dataset(20).to_parquet(str(path), batch_size=10)
    group = pq.ParquetFile(str(path)).metadata.row_group(1)
    chunk = next(group.column(c) for c in range(group.num_columns) if group.column(c).path_in_schema == "target")
    damaged = bytearray(path.read_bytes())
    damaged[chunk.data_page_offset : chunk.data_page_offset + chunk.total_compressed_size] = b"\xff" * (
        chunk.total_compressed_size
    )
    path.write_bytes(bytes(damaged))
    train = load_split(f"hf:{tmp_path}", "train", image_size=8)
    test = load_split(f"hf:{tmp_path}", "test", image_size=8)
    assert set(image_ids(test.images)) <= set(range(10))  # drawn from the readable row group
    assert len(test) == 4 and len(train) == 6 and train.skipped == 10  # one a class held out; 10 lost


def test_a_column_of_the_wrong_kind_is_refused_before_any_row_is_read(tmp_path: Path) -> None:
    """Labels named as the image column were decoded as file descriptors: `open(2)` read and closed stderr."""
    _dataset(12).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(ValueError, match=r"image column 'target' holds class labels, not images.*picture"):
        load_split(f"hf:{tmp_path / 'ds'}", "train", image_column="target")
    with pytest.raises(ValueError, match=r"label column 'weight' holds float values, not class ids.*target"):
        load_split(f"hf:{tmp_path / 'ds'}", "train", label_column="weight")
    _dataset(12).add_column("name", ["cat"] * 12).save_to_disk(str(tmp_path / "named"))  # labels as strings
    with pytest.raises(ValueError, match=r"'name' holds string values, not class ids \(Dataset.class_encode_column"):
        load_split(f"hf:{tmp_path / 'named'}", "train", label_column="name")
    for value in (2, 1.5, None):  # never a file descriptor, whatever a reader hands over
        with pytest.raises(BadImageError, match="not an image"):
            decode_image(value)
    os.fstat(2)  # stderr is still open


def test_unlabelled_rows_are_dropped_and_hf_shards_round_trip(tmp_path: Path) -> None:
    rows = _dataset(10).to_dict()
    rows["target"][3] = -1
    datasets.Dataset.from_dict(rows, features=_dataset(1).features).save_to_disk(str(tmp_path / "ds"))
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

    _dataset(24, extra_image=True).save_to_disk(str(tmp_path / "two"))
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
    _dataset(24).to_parquet(str(path), batch_size=8)
    units = [Unit(str(path), 8, part) for part in range(3)]
    opened = []
    real = pq.ParquetFile
    monkeypatch.setattr(pq, "ParquetFile", lambda *args, **kwargs: opened.append(args[0]) or real(*args, **kwargs))
    first = hf.row_group_labels(units, "target")
    assert [label for labels in first for label in labels] == _truth(24)[1].tolist()
    assert hf.row_group_labels(units, "target") == first and len(opened) == 3  # one read of each row group
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert hf.row_group_labels(units, "target") == first and len(opened) == 6


def test_a_row_group_unreadable_once_stays_unreadable_for_the_process(tmp_path: Path, monkeypatch) -> None:
    """A row group whose label column failed to read answers the same way on the next split's load, so the
    train and val draws of one process are made from the same labels and stay disjoint."""
    import pyarrow.parquet as pq

    from vitkit.data import hf

    path = tmp_path / "train-00000-of-00001.parquet"
    _dataset(16).to_parquet(str(path), batch_size=8)
    units = [Unit(str(path), 8, part) for part in range(2)]
    real, calls = pq.ParquetFile, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("transient read error")
        return real(*args, **kwargs)

    monkeypatch.setattr(pq, "ParquetFile", flaky)
    first = hf.row_group_labels(units, "target")
    assert first[0] == [-1] * 8 and first[1] == _truth(16)[1][8:].tolist()
    assert hf.row_group_labels(units, "target") == first


@pytest.mark.parametrize("stored", ["arrow", "parquet"])
def test_a_row_without_a_label_is_dropped_as_minus_one_is(tmp_path: Path, stored: str, caplog) -> None:
    """An integer label column holding None, without class names: "cannot convert float NaN to integer"."""
    rows = _dataset(10, int_labels=True).to_dict()
    rows["target"][3], rows["target"][6] = None, -1
    found = datasets.Dataset.from_dict(rows, features=_dataset(1, int_labels=True).features)
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

    rows = _dataset(40, int_labels=True).to_dict()
    rows["coarse"] = [t // 2 for t in rows["target"]]
    features = datasets.Features({**_dataset(1, int_labels=True).features, "coarse": datasets.Value("int64")})
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


def test_a_damaged_state_json_or_arrow_file_is_named(tmp_path: Path) -> None:
    """A broken state.json said only "Expecting property name ... (char 1)", a garbage Arrow file "Expected to
    read 1651663207 metadata bytes": neither named the file."""
    for damaged in ("state.json", "data-00000-of-00001.arrow"):
        root = tmp_path / damaged
        datasets.DatasetDict({"train": _dataset(8), "test": _dataset(4)}).save_to_disk(str(root))
        (root / "train" / damaged).write_text("{garbage")
        with pytest.raises(ValueError, match=f"{root / 'train' / damaged}: not a readable"):
            load_split(f"hf:{root}", "train", image_size=8)


def test_a_fifo_or_a_place_outside_the_dataset_is_refused_unread(tmp_path: Path) -> None:
    """A FIFO among the data files had hung the reader; a state.json naming ../other read another dataset."""
    saved, parquet = tmp_path / "saved", tmp_path / "parquet"
    _dataset(8).save_to_disk(str(saved))
    state = json.loads((saved / "state.json").read_text())
    name = state["_data_files"][0]["filename"]
    for place in ("../elsewhere.arrow", "/etc/hostname"):
        (saved / "state.json").write_text(json.dumps({**state, "_data_files": [{"filename": place}]}))
        with pytest.raises(ValueError, match="outside the dataset's folder"):
            describe(f"hf:{saved}")
    os.replace(saved / name, saved / "real.arrow")
    os.mkfifo(saved / name)
    (saved / "state.json").write_text(json.dumps(state))
    (parquet / "data").mkdir(parents=True)
    _dataset(8).to_parquet(str(parquet / "data" / "train-00000-of-00002.parquet"))
    os.mkfifo(parquet / "data" / "train-00001-of-00002.parquet")
    for root, fifo in ((saved, saved / name), (parquet, parquet / "data" / "train-00001-of-00002.parquet")):
        with pytest.raises(ValueError, match=f"{fifo}: not a regular file"):
            describe(f"hf:{root}")


def _renamed(dataset, names: list[str]):
    """`dataset` with its ClassLabel names in another order (or others), each row keeping its class by name."""
    labels = [names.index(CLASSES[label]) if CLASSES[label] in names else 0 for label in dataset["target"]]
    features = dataset.features.copy()
    features["target"] = datasets.ClassLabel(names=names)
    return dataset.remove_columns("target").add_column("target", labels).cast(features)


@pytest.mark.parametrize("stored", ["arrow", "parquet"])
def test_a_split_whose_class_names_are_in_another_order_is_read_by_name(tmp_path: Path, stored: str) -> None:
    """`DatasetDict.class_encode_column` encodes every split alone: a test split without one class, or with its
    names met in another order, numbers them otherwise than train.  Read by number, a right model scored 0%."""
    train, test = _dataset(30), _renamed(_dataset(8, start=30), ["dog", "ant", "cat", "bee"])
    if stored == "arrow":
        datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path))
    else:
        (tmp_path / "data").mkdir()
        train.to_parquet(str(tmp_path / "data" / "train-00000-of-00001.parquet"), batch_size=8)
        test.to_parquet(str(tmp_path / "data" / "test-00000-of-00001.parquet"), batch_size=8)
    read = load_split(f"hf:{tmp_path}", "test", image_size=8)  # in memory, a stream decoded
    assert read.class_names == CLASSES and read.labels.tolist() == _truth(8, start=30)[1].tolist()


def test_a_split_with_a_class_train_lacks_is_refused(tmp_path: Path) -> None:
    test = _renamed(_dataset(8, start=30), ["ant", "bee", "cat", "eel"])
    datasets.DatasetDict({"train": _dataset(30), "test": test}).save_to_disk(str(tmp_path))
    with pytest.raises(ValueError, match=r"test split's class names .*eel.* are not all the train split's"):
        load_split(f"hf:{tmp_path}", "test", image_size=8)


@pytest.mark.parametrize("withheld", [-1, None])
def test_an_unlabelled_test_split_gives_way_to_validation(tmp_path: Path, withheld) -> None:
    """ImageNet's layout on the Hub: a test split whose labels are all -1 (or an untyped column of nulls) beside
    a labelled validation split.  The test split's rows were dropped as unlabelled, and the run stopped with
    "no usable sample"."""
    unlabelled = _dataset(6, start=36).remove_columns("target").add_column("target", [withheld] * 6)
    if withheld is not None:
        unlabelled = unlabelled.cast(_dataset(1).features)
    splits = {"train": _dataset(30), "validation": _dataset(6, start=30), "test": unlabelled}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path))
    test = load_split(f"hf:{tmp_path}", "test", image_size=8)
    assert image_ids(test.images) == list(range(30, 36))
    assert "validation split" in test.origin and "test split holds no label" in test.origin


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


def test_parquet_files_of_several_configurations_are_refused(tmp_path: Path) -> None:
    """A Hub download of two configurations (DIR/digits/, DIR/letters/, each with train-*.parquet) was read as
    one train split of both, their classes merged by number."""
    for config in ("digits", "letters"):
        (tmp_path / config).mkdir()
        _dataset(8).to_parquet(str(tmp_path / config / "train-00000-of-00001.parquet"))
    with pytest.raises(ValueError, match=r"several configurations \(digits, letters\).*hf:.*digits"):
        load_split(f"hf:{tmp_path}", "train", image_size=8)
    assert len(load_split(f"hf:{tmp_path / 'digits'}", "test", image_size=8)) > 0  # one of them reads


def test_a_val_split_asked_of_a_one_split_dataset_names_its_test_hold_out(tmp_path: Path) -> None:
    """The error said "(it has: train)" of a dataset whose test split is its fixed hold-out."""
    _dataset(12).save_to_disk(str(tmp_path))
    with pytest.raises(ValueError, match=r"no val split \(it has: train, and its fixed test hold-out\)"):
        load_split(f"hf:{tmp_path}", "val")


def test_a_row_without_an_image_is_named_by_its_row(tmp_path: Path, caplog) -> None:
    """A row whose image is missing was logged as "<bytes>: not a readable image"; it is named by its row."""
    dataset = _dataset(12).to_dict()
    dataset["picture"][3] = None
    features = _dataset(1).features
    train = datasets.Dataset.from_dict(dataset, features=features)
    datasets.DatasetDict({"train": train, "test": _dataset(4, start=12)}).save_to_disk(str(tmp_path))
    with caplog.at_level("WARNING", logger="vitkit"):
        train = load_split(f"hf:{tmp_path}", "train", image_size=8, val_fraction=0.0)
    assert image_ids(train.images) == [i for i in range(12) if i != 3] and train.skipped == 1
    assert f"skipping bad image {tmp_path / 'train'} row 3: no image data (empty)" in caplog.text
    assert "<bytes>" not in caplog.text
    files = load_split(f"hf:{tmp_path}", "train", image_size=8, val_fraction=0.0, max_in_memory_bytes=0)
    with pytest.raises(BadImageError, match=r"train row 3: no image data \(empty\)"):
        files.read(3)


def test_an_absurd_integer_label_is_refused_before_any_class_is_listed(tmp_path: Path) -> None:
    """One label of 2**40 in an integer column listed 2**40 class names: memory grew until the host gave out."""
    dataset = _dataset(12, int_labels=True).to_dict()
    dataset["target"][5] = 2**40
    train = datasets.Dataset.from_dict(dataset, features=_dataset(1, int_labels=True).features)
    datasets.DatasetDict({"train": train, "test": _dataset(4, start=12, int_labels=True)}).save_to_disk(str(tmp_path))
    with pytest.raises(ValueError, match=r"'target' holds 1,099,511,627,776, outside the class indices 0\.\.999,999"):
        describe(f"hf:{tmp_path}")


def test_hostile_hugging_face_metadata_is_named_not_a_traceback(tmp_path: Path) -> None:
    """Parquet `huggingface` metadata of `[1,2]`, features of a list, ClassLabel names of 5, or bad JSON
    ended in an AttributeError or TypeError traceback."""
    import pyarrow as pa

    from vitkit.data.hfcolumns import choose_columns

    fields = [
        pa.field("image", pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        pa.field("label", pa.int64()),
    ]
    ok = choose_columns(pa.schema(fields, metadata={b"huggingface": b"[1, 2]"}), where="d")
    assert ok == ("image", "label", None)  # no usable metadata: the columns' own types
    label = '{"info": {"features": {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel", "names": 5}}}}'
    for metadata, words in (
        (b"{not json", r"d: its Hugging Face metadata is not valid JSON"),
        (b'{"info": {"features": [1, 2]}}', r"d: its Hugging Face metadata's features are not a mapping"),
        (label.encode(), r"d: the ClassLabel names of 'label' are not a list of strings \(5\)"),
    ):
        with pytest.raises(ValueError, match=words):
            choose_columns(pa.schema(fields, metadata={b"huggingface": metadata}), where="d")


def test_a_negative_label_other_than_minus_one_is_damage_not_unlabelled(tmp_path: Path) -> None:
    """-7 was dropped as "unlabelled (label -1 or none)"; the Hub writes -1 alone for a withheld label."""
    dataset = _dataset(12, int_labels=True).to_dict()
    dataset["target"][4] = -7
    train = datasets.Dataset.from_dict(dataset, features=_dataset(1, int_labels=True).features)
    datasets.DatasetDict({"train": train, "test": _dataset(4, start=12, int_labels=True)}).save_to_disk(str(tmp_path))
    with pytest.raises(ValueError, match=r"row 4's label is -7; class indices are 0 or more \(-1: unlabelled\)"):
        load_split(f"hf:{tmp_path}", "train", image_size=8, val_fraction=0.0)


@pytest.mark.parametrize("values", [["abc", "1"], [0.7, 1.7]])
def test_a_label_column_whose_metadata_says_class_label_but_whose_type_does_not_is_refused(
    tmp_path: Path, values: list
) -> None:
    """The Hugging Face metadata is the file's word: strings under a ClassLabel had failed with an unnamed "invalid
    literal for int()", and floats were truncated to classes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    _dataset(2).to_parquet(str(tmp_path / "made.parquet"))
    table = pq.read_table(tmp_path / "made.parquet")
    column = table.schema.get_field_index("target")
    forged = table.set_column(column, "target", pa.array(values)).replace_schema_metadata(table.schema.metadata)
    (tmp_path / "data").mkdir()
    pq.write_table(forged, tmp_path / "data" / "train-00000-of-00001.parquet")
    with pytest.raises(ValueError, match="column 'target' is declared a ClassLabel but holds (string|double) values"):
        describe(f"hf:{tmp_path / 'data'}")


def test_class_label_names_are_checked_as_a_class_list_is(tmp_path: Path) -> None:
    """Names that `datasets` itself refuses (one twice) came through a file's metadata unchecked."""
    import pyarrow.parquet as pq

    _dataset(4).to_parquet(str(tmp_path / "made.parquet"))
    table = pq.read_table(tmp_path / "made.parquet")
    meta = table.schema.metadata[b"huggingface"].replace(b'"ant", "bee"', b'"ant", "ant"')
    (tmp_path / "data").mkdir()
    forged = table.replace_schema_metadata({**table.schema.metadata, b"huggingface": meta})
    pq.write_table(forged, tmp_path / "data" / "train-00000-of-00001.parquet")
    with pytest.raises(ValueError, match="the ClassLabel names of 'target': the class name 'ant' appears twice"):
        describe(f"hf:{tmp_path / 'data'}")
