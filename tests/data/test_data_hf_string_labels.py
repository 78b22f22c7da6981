"""hf: label columns of class-name strings (a Value("string"), not a ClassLabel), and a column of preprocessed
pixel tensors where images were expected (made in the test with `datasets`, never a hub)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardkit import image_ids, numbered_images
from vitkit.data.sources import describe, load_split
from vitkit.data.stream import read_all

datasets = pytest.importorskip("datasets")
from hfkit import CLASSES, labelled_dataset, truth  # noqa: E402 - after the skip

NAMES = ["dog", "cat", "bee", "ant"]  # class k of hfkit's images is NAMES[k]: sorted, the classes are reversed


def named_dataset(count: int, start: int = 0, column: str = "label"):
    """hfkit's labelled images with their class as a string column `column` (as `datasets` infers it)."""
    rows = labelled_dataset(count, start=start).to_dict()
    rows[column] = [NAMES[label] for label in rows.pop("target")]
    features = datasets.Features({"picture": datasets.Image(), column: datasets.Value("string")})
    return datasets.Dataset.from_dict({key: rows[key] for key in features}, features=features)


def _save(tmp_path: Path, stored: str, splits: dict) -> str:
    if stored == "arrow":
        datasets.DatasetDict(splits).save_to_disk(str(tmp_path))
    else:
        (tmp_path / "data").mkdir()
        for name, split in splits.items():
            split.to_parquet(str(tmp_path / "data" / f"{name}-00000-of-00001.parquet"), batch_size=8)
    return f"hf:{tmp_path}"


def _sorted_index(labels: list[int]) -> list[int]:
    """hfkit's class indices as the sorted names number them."""
    return [sorted(NAMES).index(NAMES[label]) for label in labels]


@pytest.mark.parametrize("stored", ["arrow", "parquet"])
def test_a_string_label_column_is_read_as_the_train_splits_sorted_names(tmp_path: Path, stored: str) -> None:
    """A label column of strings was refused ("holds string values, not class ids"), and --label-column, which
    the refusal pointed at, could not read it."""
    test = named_dataset(8, start=32).filter(lambda row: row["label"] != "dog")  # a class fewer than train's
    uri = _save(tmp_path, stored, {"train": named_dataset(32), "test": test})
    assert describe(uri).num_classes == 4
    train = load_split(uri, "train", image_size=8)
    assert train.class_names == sorted(NAMES) == list(reversed(NAMES))
    assert train.labels.tolist() == _sorted_index(truth(32)[1][image_ids(train.images)].tolist())
    held = load_split(uri, "test", image_size=8)
    assert held.class_names == sorted(NAMES) and len(held) == len(test)
    assert held.labels.tolist() == _sorted_index(truth(40)[1][image_ids(held.images)].tolist())
    if stored == "parquet":  # streamed: the same classes
        streamed = read_all(load_split(uri, "train", image_size=8, max_in_memory_bytes=0))
        assert [s.label for s in streamed] == _sorted_index(truth(32)[1].tolist())


@pytest.mark.parametrize("stored", ["arrow", "parquet"])
def test_a_one_split_string_dataset_holds_out_by_class(tmp_path: Path, stored: str) -> None:
    if stored == "arrow":
        named_dataset(40).save_to_disk(str(tmp_path / "one"))
        uri = f"hf:{tmp_path / 'one'}"
    else:
        uri = _save(tmp_path, stored, {"train": named_dataset(40)})
    test = load_split(uri, "test", image_size=8)
    assert len(test) == 8 and sorted(test.labels.tolist()) == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("stored", ["arrow", "parquet"])
def test_a_test_string_the_train_split_lacks_is_an_error(tmp_path: Path, stored: str) -> None:
    rows = named_dataset(8, start=32).to_dict()
    rows["label"][5] = "eel"
    test = datasets.Dataset.from_dict(rows, features=named_dataset(1).features)
    uri = _save(tmp_path, stored, {"train": named_dataset(32), "test": test})
    with pytest.raises(ValueError, match=r"test split.*row 5.*'eel'.*not one of the train split's 4 classes"):
        load_split(uri, "test", image_size=8)


def test_a_string_column_not_named_as_labels_is_taken_when_chosen(tmp_path: Path) -> None:
    named_dataset(12, column="species").save_to_disk(str(tmp_path / "ds"))
    with pytest.raises(ValueError, match="--label-column NAME"):
        load_split(f"hf:{tmp_path / 'ds'}", "train", image_size=8)
    data = load_split(f"hf:{tmp_path / 'ds'}", "train", image_size=8, label_column="species")
    assert data.class_names == sorted(NAMES)


def test_preprocessed_pixel_values_are_refused_saying_what_is_read(tmp_path: Path) -> None:
    """A processor's float pixel_values (no image column) got "choose one with --image-column NAME", which no
    column could answer."""
    images, labels = numbered_images(6)
    rows = {"pixel_values": (images[:, None] / 255.0).astype("float32").tolist(), "label": labels.tolist()}
    features = datasets.Features(
        {
            "pixel_values": datasets.Sequence(datasets.Sequence(datasets.Sequence(datasets.Value("float32")))),
            "label": datasets.ClassLabel(names=[str(k) for k in range(10)]),
        }
    )
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "ds"))
    for chosen in ("", "pixel_values"):
        with pytest.raises(ValueError) as caught:
            load_split(f"hf:{tmp_path / 'ds'}", "train", image_size=8, image_column=chosen)
        said = str(caught.value)
        assert "'pixel_values'" in said and "preprocessed" in said and "choose one with" not in said
        assert "datasets.Image()" in said and "PIL" in said


def test_class_label_columns_read_as_before(tmp_path: Path) -> None:
    labelled_dataset(12).save_to_disk(str(tmp_path / "ds"))
    assert load_split(f"hf:{tmp_path / 'ds'}", "train", image_size=8).class_names == CLASSES


@pytest.mark.parametrize("kind", ["string", "int64"])
def test_a_column_named_label_is_the_label_beside_other_integer_columns(tmp_path: Path, kind: str) -> None:
    """A string `label` beside an integer `image_id` took the ids for labels (1,040 classes, a warning of 1,000
    with no image); two integer columns were refused as ambiguous though one is named `label`."""
    rows = named_dataset(16).to_dict()
    rows["image_id"] = list(range(1000, 1016))
    if kind == "int64":
        rows["label"] = [NAMES.index(name) for name in rows["label"]]
    features = datasets.Features(
        {"picture": datasets.Image(), "label": datasets.Value(kind), "image_id": datasets.Value("int64")}
    )
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path))
    train = load_split(f"hf:{tmp_path}", "train", image_size=8, val_fraction=0.0)
    assert len(train.class_names) == 4 and sorted(set(train.labels.tolist())) == [0, 1, 2, 3]


def test_class_names_written_in_digits_are_in_numeric_order() -> None:
    """Strings "0".."10" sorted as text made "2" class 3 (after "10"), where a .cls "2" in shards is class 2."""
    from vitkit.data.hfnames import string_classes

    values = np.array([*(str(k) for k in (10, 2, 0, 1, 3, 4, 5, 6, 7, 8, 9)), None], dtype=object)  # None: no label
    assert string_classes(values, "label", "hf:x") == [str(k) for k in range(11)]
    assert string_classes(np.array(["b10", "b2"], dtype=object), "label", "hf:x") == ["b10", "b2"]  # text: as text


def test_label_strings_are_read_as_names_without_spaces_and_composed() -> None:
    """A "cat " and a decomposed "é" (as macOS folder names are) were classes of their own, beside "cat" and "é";
    wds labels and classes.txt lines are read stripped.  An empty string named no row."""
    from vitkit.data.hfnames import encode, string_classes

    values = np.array(["cat", "cat ", " dog", "caf\u00e9", "cafe\u0301", None], dtype=object)
    names = string_classes(values, "label", "hf:x")
    assert names == ["caf\u00e9", "cat", "dog"]
    assert encode(values, names, "hf:x").tolist() == [1, 1, 2, 0, 0, -1]
    with pytest.raises(ValueError, match="row 2 of the label column 'label' is an empty string"):
        string_classes(np.array(["cat", "dog", "  "], dtype=object), "label", "hf:x")
