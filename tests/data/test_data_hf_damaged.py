"""hf: damaged, hostile and ambiguous Hugging Face datasets (made in the test with `datasets`, never a hub):
each refused or skipped with its file, row or column named, before anything is read that need not be."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from shardkit import image_ids
from vitkit.data.images import BadImageError, decode_image
from vitkit.data.sources import describe, load_split
from vitkit.data.stream import Unit

datasets = pytest.importorskip("datasets")
from hfkit import labelled_dataset, renamed, truth  # noqa: E402 - after the skip


def test_a_damaged_row_group_of_a_one_split_parquet_dataset_is_skipped_not_fatal(tmp_path: Path) -> None:
    """Drawing the hold-out reads each row group's labels: a damaged one keeps its rows on the train side, where
    they are skipped as corrupt, as reading the row group itself does."""
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "data" / "train-00000-of-00001.parquet"
    path.parent.mkdir()
    labelled_dataset(20).to_parquet(str(path), batch_size=10)
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
    labelled_dataset(12).save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(ValueError, match=r"image column 'target' holds class labels, not images.*picture"):
        load_split(f"hf:{tmp_path / 'ds'}", "train", image_column="target")
    with pytest.raises(
        ValueError, match=r"label column 'weight' holds float values, not class ids or class names.*target"
    ):
        load_split(f"hf:{tmp_path / 'ds'}", "train", label_column="weight")
    for value in (2, 1.5, None):  # never a file descriptor, whatever a reader hands over
        with pytest.raises(BadImageError, match="not an image"):
            decode_image(value)
    os.fstat(2)  # stderr is still open


def test_a_row_group_unreadable_once_stays_unreadable_for_the_process(tmp_path: Path, monkeypatch) -> None:
    """A row group whose label column failed to read answers the same way on the next split's load, so the
    train and val draws of one process are made from the same labels and stay disjoint."""
    import pyarrow.parquet as pq

    from vitkit.data import hf

    path = tmp_path / "train-00000-of-00001.parquet"
    labelled_dataset(16).to_parquet(str(path), batch_size=8)
    units = [Unit(str(path), 8, part) for part in range(2)]
    real, calls = pq.ParquetFile, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise OSError("transient read error")
        return real(*args, **kwargs)

    monkeypatch.setattr(pq, "ParquetFile", flaky)
    first = hf.row_group_labels(units, "target")
    assert first[0] == [-1] * 8 and first[1] == truth(16)[1][8:].tolist()
    assert hf.row_group_labels(units, "target") == first


def test_a_damaged_state_json_or_arrow_file_is_named(tmp_path: Path) -> None:
    """A broken state.json said only "Expecting property name ... (char 1)", a garbage Arrow file "Expected to
    read 1651663207 metadata bytes": neither named the file."""
    for damaged in ("state.json", "data-00000-of-00001.arrow"):
        root = tmp_path / damaged
        datasets.DatasetDict({"train": labelled_dataset(8), "test": labelled_dataset(4)}).save_to_disk(str(root))
        (root / "train" / damaged).write_text("{garbage")
        with pytest.raises(ValueError, match=f"{root / 'train' / damaged}: not a readable"):
            load_split(f"hf:{root}", "train", image_size=8)


def test_a_fifo_or_a_place_outside_the_dataset_is_refused_unread(tmp_path: Path) -> None:
    """A FIFO among the data files had hung the reader; a state.json naming ../other read another dataset."""
    saved, parquet = tmp_path / "saved", tmp_path / "parquet"
    labelled_dataset(8).save_to_disk(str(saved))
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
    labelled_dataset(8).to_parquet(str(parquet / "data" / "train-00000-of-00002.parquet"))
    os.mkfifo(parquet / "data" / "train-00001-of-00002.parquet")
    for root, fifo in ((saved, saved / name), (parquet, parquet / "data" / "train-00001-of-00002.parquet")):
        with pytest.raises(ValueError, match=f"{fifo}: not a regular file"):
            describe(f"hf:{root}")


def test_a_split_with_a_class_train_lacks_is_refused(tmp_path: Path) -> None:
    test = renamed(labelled_dataset(8, start=30), ["ant", "bee", "cat", "eel"])
    datasets.DatasetDict({"train": labelled_dataset(30), "test": test}).save_to_disk(str(tmp_path))
    with pytest.raises(ValueError, match=r"test split's class names .*eel.* are not all the train split's"):
        load_split(f"hf:{tmp_path}", "test", image_size=8)


def test_parquet_files_of_several_configurations_are_refused(tmp_path: Path) -> None:
    """A Hub download of two configurations (DIR/digits/, DIR/letters/, each with train-*.parquet) was read as
    one train split of both, their classes merged by number."""
    for config in ("digits", "letters"):
        (tmp_path / config).mkdir()
        labelled_dataset(8).to_parquet(str(tmp_path / config / "train-00000-of-00001.parquet"))
    with pytest.raises(ValueError, match=r"several configurations \(digits, letters\).*hf:.*digits"):
        load_split(f"hf:{tmp_path}", "train", image_size=8)
    assert len(load_split(f"hf:{tmp_path / 'digits'}", "test", image_size=8)) > 0  # one of them reads


def test_a_row_without_an_image_is_named_by_its_row(tmp_path: Path, caplog) -> None:
    """A row whose image is missing was logged as "<bytes>: not a readable image"; it is named by its row."""
    dataset = labelled_dataset(12).to_dict()
    dataset["picture"][3] = None
    features = labelled_dataset(1).features
    train = datasets.Dataset.from_dict(dataset, features=features)
    datasets.DatasetDict({"train": train, "test": labelled_dataset(4, start=12)}).save_to_disk(str(tmp_path))
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
    dataset = labelled_dataset(12, int_labels=True).to_dict()
    dataset["target"][5] = 2**40
    train = datasets.Dataset.from_dict(dataset, features=labelled_dataset(1, int_labels=True).features)
    datasets.DatasetDict({"train": train, "test": labelled_dataset(4, start=12, int_labels=True)}).save_to_disk(
        str(tmp_path)
    )
    with pytest.raises(ValueError, match=r"'target' holds 1,099,511,627,776, outside the class indices 0\.\.1,048,575"):
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
    dataset = labelled_dataset(12, int_labels=True).to_dict()
    dataset["target"][4] = -7
    train = datasets.Dataset.from_dict(dataset, features=labelled_dataset(1, int_labels=True).features)
    datasets.DatasetDict({"train": train, "test": labelled_dataset(4, start=12, int_labels=True)}).save_to_disk(
        str(tmp_path)
    )
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

    labelled_dataset(2).to_parquet(str(tmp_path / "made.parquet"))
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

    labelled_dataset(4).to_parquet(str(tmp_path / "made.parquet"))
    table = pq.read_table(tmp_path / "made.parquet")
    meta = table.schema.metadata[b"huggingface"].replace(b'"ant", "bee"', b'"ant", "ant"')
    (tmp_path / "data").mkdir()
    forged = table.replace_schema_metadata({**table.schema.metadata, b"huggingface": meta})
    pq.write_table(forged, tmp_path / "data" / "train-00000-of-00001.parquet")
    with pytest.raises(ValueError, match="the ClassLabel names of 'target': the class name 'ant' appears twice"):
        describe(f"hf:{tmp_path / 'data'}")


@pytest.mark.parametrize("bad", [4, 7])
def test_an_arrow_label_beyond_its_class_names_names_the_row(tmp_path: Path, bad: int) -> None:
    """An Arrow split whose label column holds an index past its ClassLabel's names (damaged or hand-edited
    metadata) ended `vitkit train` in an IndexError, or a RuntimeError in the first step; Parquet rows like it
    are skipped by name."""
    rows = labelled_dataset(10, int_labels=True).to_dict()
    rows["target"][6] = bad
    data = datasets.Dataset.from_dict(rows, features=labelled_dataset(1, int_labels=True).features)
    data.info.features = labelled_dataset(1).features  # ClassLabel(names=CLASSES): 4 names
    data.save_to_disk(str(tmp_path))
    with pytest.raises(ValueError, match=rf"row 6's label is {bad}, beyond the 4 classes 0\.\.3 \(the split's class"):
        load_split(f"hf:{tmp_path}", "train", image_size=8)


@pytest.mark.parametrize("damage", ["footer", "columns", "order", "extra"])
def test_a_damaged_parquet_file_of_a_split_is_named(tmp_path: Path, damage: str) -> None:
    """A second Parquet file that was not one, or lacked the label column, ended in pyarrow's traceback
    ("Couldn't deserialize thrift", 'Field "target" does not exist') naming no file; one whose columns come in
    another order or beside others reads as before."""
    (tmp_path / "data").mkdir()
    labelled_dataset(8).to_parquet(str(tmp_path / "data" / "train-00000-of-00002.parquet"))
    second = tmp_path / "data" / "train-00001-of-00002.parquet"
    if damage == "footer":
        second.write_bytes(b"PAR1" + bytes(100) + b"PAR1")
    elif damage == "columns":
        datasets.Dataset.from_dict({"foo": [1, 2]}).to_parquet(str(second))
    else:
        rows = labelled_dataset(4, start=8)
        rows = rows.add_column("id", list(range(4))) if damage == "extra" else rows
        rows.select_columns(["weight", "target", "picture", *(["id"] if damage == "extra" else [])]).to_parquet(
            str(second)
        )
        parts = [load_split(f"hf:{tmp_path}", part, image_size=8) for part in ("train", "test")]
        assert sum(len(part) for part in parts) == 12 and all(part.images is not None for part in parts)
        return
    problem = "not a readable Parquet file" if damage == "footer" else r"no column 'picture', 'target'"
    with pytest.raises(ValueError, match=rf"{second}: {problem}"):
        load_split(f"hf:{tmp_path}", "train", image_size=8)


def test_a_parquet_file_given_as_the_source_says_hf_takes_its_folder(tmp_path: Path) -> None:
    """`--data hf:train.parquet` said "no such directory" of a file that exists, and not what to give instead."""
    labelled_dataset(4).to_parquet(str(tmp_path / "train.parquet"))
    with pytest.raises(ValueError, match=r"is a file; hf: takes the directory of a saved dataset or of Parquet files"):
        describe(f"hf:{tmp_path / 'train.parquet'}")
