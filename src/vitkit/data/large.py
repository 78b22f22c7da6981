"""The sources for large data, `wds:` (tar shards) and `hf:` (Hugging Face datasets on disk): one split
each as vitkit.data.sources wants it, and their description from the index or metadata alone.

Splits follow the folder rules: "test" is the test split if there is one, else the val split; "val"
(with val_fraction 0) is the val split; a missing one is an error that says so.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitkit.data import hf, hfnames, holdout, tarshards
from vitkit.data.hfcolumns import is_strings
from vitkit.data.images import IMAGE_EXTENSIONS, NoLabelsError, probe_images, spread
from vitkit.data.imageset import NO_LABELS_HINT, UNLABELLED, VAL_HINT, ImageSet, SourceInfo, fits_in_memory
from vitkit.data.shardscan import CLASS_FILE, name_label, top_label
from vitkit.data.stream import ShardSet, Unit
from vitkit.data.tarsamples import ClassNames, check_class_names, check_number_names, class_name

PROBED = 16  # images whose headers give the typical side and the channels when no index says
PER_UNIT = 4  # ... at most this many of each shard or row group, where there are several
MAX_CLASS_FILE_BYTES = 64 << 20


def _part(splits: dict[str, Any], part: str, where: str) -> Any:
    wanted = "val" if part == "test" and "test" not in splits else part
    if wanted not in splits:
        held = ", and its fixed test hold-out" if set(splits) == {"train"} else ""
        have = (", ".join(sorted(splits)) or "none") + held
        raise ValueError(
            f"{where} has no {part} split{' (nor a val split to stand in)' if part == 'test' else ''} "
            f"(it has: {have}); "
            + (
                VAL_HINT
                if part == "val"
                else "save a DatasetDict with a test (or validation) split"
                if where.startswith("hf:")
                else "name shards train-*/val-*/test-* or list the splits in dataset.json"
            )
        )
    return splits[wanted]


def _probe_stream(units: list[Unit], reader: Any) -> tuple[int, int]:
    """(typical shorter side, channels) from the headers of PROBED images: the first few of units spread over the
    split (of one unit, its first PROBED), so that a run of gray images at its start does not make a colour set
    gray."""
    step = max(1, len(units) // (PROBED // PER_UNIT))
    chosen = units[::step][: PROBED // PER_UNIT]
    each = PER_UNIT if len(chosen) > 1 else PROBED
    images: list[bytes] = []
    for unit in chosen:
        images += itertools.islice((s.image for _, s in reader.samples(unit) if s.image is not None), each)
    return probe_images(images)


def index_mirror_rule(path: str) -> bool | None:
    """Whether a mirror keeps the label, as the shards' dataset.json says (`vitkit shard` writes its source's
    rule), or None."""
    try:
        rule = tarshards.split_units(path)[2].get("mirror_keeps_label")
    except (OSError, ValueError):  # no shards (yet) or no readable index: nothing says
        return None
    return rule if isinstance(rule, bool) else None


def split_names(kind: str, path: str, reading: Mapping[str, Any] | None = None) -> list[str]:
    """The splits a wds: or hf: source holds of its own, as `reading` (load_split's `image_column`,
    `label_column`, `labelled`) reads it: an hf: test split without labels is none for a reading of labels."""
    if kind == "wds":
        return list(tarshards.split_units(path)[0])
    splits = hf.find_splits(Path(path))
    reading = reading or {}
    if not reading.get("labelled", True) or "train" not in splits:
        return list(splits)
    try:
        label = hf.choose_columns(
            hf.schema(splits["train"]), reading.get("image_column", ""), reading.get("label_column", ""), path, True
        )[1]
    except ValueError:  # no label column, or several and none chosen: reading it is refused, naming them
        return list(splits)
    return list(labelled_splits(splits, label)[0])


def labelled_splits(splits: dict[str, Any], label: str) -> tuple[dict[str, Any], bool]:
    """(an hf: source's `splits` less a test split that holds no `label`, and whether it was left out): a
    benchmark's withheld answers (every label -1 or none) or a competition's images alone, for which the validation
    split, or the fixed test hold-out of train, stands in.  `label` "": read without labels, nothing left out."""
    if "test" not in splits or "train" not in splits or not label or not _unlabelled(splits["test"], label):
        return splits, False
    return {name: split for name, split in splits.items() if name != "test"}, True


HF_SAVED = frozenset({"dataset_info.json", "dataset_dict.json", "state.json"})  # save_to_disk's files


def reader_for(directory: Path) -> str | None:
    """The kind of source a directory's first entries call for: "wds" (tar shards, or vitkit's index), "hf" (a
    dataset saved to disk), "folder" (sub-folders with images in them), None where none of these shows."""
    first = lambda folder: list(itertools.islice(folder.iterdir(), 100))  # noqa: E731 - a look, not a scan
    entries = first(directory)
    names = {entry.name for entry in entries}
    if any(name.endswith(".tar") for name in names) or tarshards.INDEX in names:
        return "wds"
    if names & HF_SAVED:
        return "hf"
    images = lambda child: any(f.name.lower().endswith(IMAGE_EXTENSIONS) for f in first(child))  # noqa: E731
    return "folder" if any(child.is_dir() and images(child) for child in entries) else None


# ------------------------------------------------------------------------------ wds:
def read_wds(path: str, part: str, size: int, channels: int | None, labelled: bool = True) -> ShardSet:
    """One split of `wds:path` as a ShardSet (nothing read but the index, or the shards' headers without one;
    and their labels where a classes.txt names the classes, to refuse a label past its names).  Labels that are
    class names ("n01443537" in a .cls, "label": "cat" in a .json) are read as their line of classes.txt.

    Shards with neither test-* nor val-* shards (nor such splits in dataset.json) hold out a fixed
    class-stratified test split as a folder does (vitkit.data.holdout): "test" is that hold-out, "train"
    the rest; drawing it reads every training shard's label members once per process.  Read without labels
    (`labelled=False`), every image is class 0 of one class, UNLABELLED, and no label is read.
    """
    splits, classes, index = tarshards.split_units(path)
    where = f"wds:{path}"
    if "train" not in splits:
        images = any(d.is_dir() and reader_for(d) == "folder" for d in (Path(path), Path(path) / "train"))
        hint = f"; it holds no .tar shards but folders of images: read it with folder:{path}" if images else ""
        raise ValueError(f"{where} has no train split (no train-* shards and none listed in dataset.json){hint}")
    fixed = part in ("train", "test") and not {"val", "test"} & set(splits)  # no held-out split of its own
    units = splits["train"] if fixed else _part(splits, part, where)
    every = [unit for found in splits.values() for unit in found]
    by_name = None  # the classes' names, through which labels that are class names are read
    if labelled:
        listed = None if classes else class_file_names(path, every)  # a label past it, or not in it: named
        names = classes or listed or _names_by_scan(every, path)
        if not classes and top_label(every)[0] < 0 and not name_label(every)[0]:  # classes.txt, yet no label reads
            _names_by_scan(every, path)  # the one line it says where no label reads
        if listed or classes:  # classes.txt's names, or those an index (dataset.json) gives
            file = _class_file(path) if listed else _class_file(path).with_name(tarshards.INDEX)
            by_name = ClassNames(str(file), {name: i for i, name in enumerate(listed or classes)})
    else:
        names = [UNLABELLED]
    reader = tarshards.TarReader(labelled, by_name)
    if not channels:
        channels = index.get("channels") or _probe_stream(units, reader)[1]
    data = ShardSet(
        units=units,
        reader=reader,
        class_names=list(names),
        load_size=size,
        channels=int(channels),
        origin=f"{len(units)} {part if part in splits else 'val'} shard(s) of {where}",
        problems=[] if index else tarshards.damage(units),
    )
    if fixed:
        data = holdout.hold_out_shards(data, reader.labels(units), part, f"{len(units)} train shard(s) of {where}")
    return data


def _names_by_scan(units: list[Unit], path: str) -> list[str]:
    """Class names from the labels the shards hold (no classes.txt beside them); shards without any label that
    reads as a class index are an error, which says how to read labels that are class names, or else names the
    first label member that does not parse."""
    where = f"wds:{path}"
    if top_label(units)[0] >= 0:
        return tarshards.class_names_by_scan(units)
    name, holder = name_label(units)
    if name:
        raise ValueError(
            f"{where}: the labels are class names, not class indices ({holder} holds {name[:80]!r}), and no "
            f"{CLASS_FILE} lists the classes: write {_class_file(path)}, one class name a line (line i = class i), "
            "holding every name the labels use"
        )
    unparsed = next((problem for problem in _label_problems(units) if "label ." in problem), "")
    if unparsed:
        raise ValueError(
            f"{where}: no sample has a label that reads as a class index; the first: {unparsed} (a .cls member or "
            f'a .json "label" holds the class index, a line of classes.txt; shards without labels: {NO_LABELS_HINT})'
        )
    damaged = tarshards.damage(units)
    if damaged:  # a shard that is no tar at all (gzip data under a .tar name) holds no label either
        raise ValueError(f"{where}: no sample has a label, and {len(damaged)} shard(s) are damaged: {damaged[0]}")
    raise NoLabelsError(
        f"{where}: no sample has a label (a .cls or .json member) to train a classifier on; {NO_LABELS_HINT}"
    )


def _label_problems(units: list[Unit], most: int = 20) -> Iterator[str]:
    """ "KEY: problem" of the first `most` samples of the first shard (its label members parsed)."""
    reader = tarshards.TarReader(True)
    for index, sample in reader.samples(units[0]) if units else ():
        if index >= most:
            return
        if sample.problem:
            yield f"{sample.key}: {sample.problem}"


def class_file_names(path: str, scanned: list[Unit] | None) -> list[str] | None:
    """Class names from CLASS_FILE beside the shards (one a line, line i = class i), or None without one.

    Read as untrusted input: UTF-8, at most MAX_CLASS_FILE_BYTES, no empty or repeated name.  With `scanned`
    (the units whose labels were counted by a scan), a label beyond the names is an error naming both.
    """
    file = _class_file(path)
    if not file.is_file():
        return None
    if file.stat().st_size > MAX_CLASS_FILE_BYTES:
        raise ValueError(f"{file}: {file.stat().st_size:,} bytes, more than a class list holds")
    try:
        text = file.read_bytes().decode("utf-8-sig")  # a byte-order mark dropped
        names = [class_name(line) for line in text.split("\n")]  # not splitlines: \f is no line end
    except UnicodeDecodeError as error:
        raise ValueError(f"{file}: not UTF-8 text ({error})") from error
    while names and not names[-1]:
        names.pop()
    if not names or len(names) > tarshards.MAX_CLASSES:
        raise ValueError(f"{file}: expected one class name per line, 1 to {tarshards.MAX_CLASSES:,} of them")
    check_class_names(names, str(file), "line")
    check_number_names(names, str(file))
    top, holder = top_label(scanned or [])
    if top >= len(names):
        raise ValueError(
            f"{file} names {len(names)} classes, but {holder} holds label {top}: fix that sample's label, "
            f"or name every class in {file} (line i = class i)"
        )
    unknown, holder = name_label(scanned or [], frozenset(names))
    if unknown:
        raise ValueError(
            f"{holder}: its label {unknown[:80]!r} is a class name that {file} does not hold (it names "
            f"{len(names)} classes, one a line): add it to {file}, or fix that sample's label"
        )
    return names


def _class_file(path: str) -> Path:
    """Where CLASS_FILE is for `wds:path`: in the directory of the shards (of the pattern's first)."""
    spec = Path(path)
    return (spec if spec.is_dir() else Path(tarshards.expand_braces(path)[0]).parent) / CLASS_FILE


def describe_wds(uri: str, path: str, size: int, max_in_memory_bytes: int, labelled: bool = True) -> SourceInfo:
    index = tarshards.split_units(path)[2]
    data = read_wds(path, "train", size, index.get("channels"), labelled)
    side = index.get("image_size") or _probe_stream(data.units, data.reader)[0]
    fits = fits_in_memory(len(data), data.channels, size, max_in_memory_bytes)
    return SourceInfo(
        uri=uri,
        num_train=len(data),
        num_classes=data.num_classes,
        image_size=int(side),
        channels=data.channels,
        in_memory=fits,
        access="memory" if fits else "stream",
    )


# ------------------------------------------------------------------------------ hf:
def _hf_classes(train: hf.HFSplit, label: str, names: list[str] | None, where: str) -> list[str]:
    """The classes: the ClassLabel's `names`, else the train split's sorted strings (a label column of class
    names), else "0" .. the largest label."""
    if names:
        return list(names)
    if not label:  # read without labels
        return [UNLABELLED]
    labels = hf.split_labels(train, label)
    if is_strings(hf.schema(train), label):
        return hfnames.string_classes(labels, label, where)
    top = int(np.max(labels, initial=-1))
    if top < 0:
        raise ValueError(f"{train.files[0]}: the label column {label!r} holds no class index >= 0")
    if top >= tarshards.MAX_CLASSES:  # one stray label would plan (and list) that many classes
        raise ValueError(
            f"{train.files[0]}: the label column {label!r} holds {top:,}, outside the class indices "
            f"0..{tarshards.MAX_CLASSES - 1:,}: a corrupt label (fix or drop that row)"
        )
    return [str(i) for i in range(top + 1)]


def read_hf(
    path: str,
    part: str,
    size: int,
    channels: int | None,
    image_column: str = "",
    label_column: str = "",
    labelled: bool = True,
) -> ImageSet | ShardSet:
    """One split of `hf:path`: an Arrow split as a random-access ImageSet, a Parquet split as a ShardSet.
    Read without labels (`labelled=False`), no label column is read: every row is class 0 of one class,
    UNLABELLED."""
    where = f"hf:{path}"
    splits = hf.find_splits(Path(path))
    if "train" not in splits:
        raise ValueError(f"{where} has no train split (found: {', '.join(sorted(splits))})")
    image, label, names = hf.choose_columns(hf.schema(splits["train"]), image_column, label_column, where, labelled)
    splits, withheld = labelled_splits(splits, label)
    held_out = splits.keys() == {"train"}  # one split alone: the fixed test hold-out of every source without one
    split = splits["train"] if held_out and part == "test" else _part(splits, part, where)
    class_names = _hf_classes(splits["train"], label, names, where)
    by_name = tuple(class_names) if label and not names and is_strings(hf.schema(splits["train"]), label) else ()
    name, note = _split_name(splits, split, part)
    if by_name and split is not splits["train"]:  # a string the train split lacks: named before any row is read
        hfnames.encode(hf.split_labels(split, label), by_name, f"{where} {name} split")
    if withheld and part == "test" and not held_out:
        note = " (its test split holds no label: it stands in)"
    label_map = () if split is splits["train"] else hf.split_label_map(split, name, image, label, names, where)
    if split.kind == "parquet":
        units = hf.parquet_units(split, (image, label))
        reader = hf.ParquetReader(image, label, label_map, by_name)
        channels = channels or _probe_stream(units, reader)[1]
        data = ShardSet(
            units=units,
            reader=reader,
            class_names=class_names,
            load_size=size,
            channels=channels,
            origin=f"{len(split.files)} Parquet file(s) of {where} {name} split ({len(units)} row groups){note}",
        )
        if held_out and part in ("train", "test"):
            data = holdout.hold_out_shards(data, reader.labels(units), part, data.origin)
        return data
    classes = len(label_map or class_names)  # the split's own names, or the train split's
    images, labels = hf.arrow_rows(split, image, label, f"{where} ({part})", classes, by_name)
    if label_map:
        known = (labels >= 0) & (labels < len(label_map))
        labels[known] = np.asarray(label_map)[labels[known]]
    channels = channels or probe_images([images[i] for i in spread(len(images), PROBED)])[1]
    rows = ImageSet(
        images=None,
        files=images,
        labels=torch.from_numpy(labels),
        class_names=class_names,
        load_size=size,
        channels=channels,
        origin=f"{where} {name} split Arrow rows{note}",
    )
    return holdout.fixed_test_split(rows, part, where) if held_out and part in ("train", "test") else rows


_UNLABELLED: dict[tuple[Any, ...], bool] = {}  # (the split's files as they stand, label) -> `_unlabelled`


def _unlabelled(split: hf.HFSplit, label: str) -> bool:
    """Whether no row of `split` has a label (-1 or none: a benchmark's hidden test labels; no such column), read
    once a process while its files stay as they are (every command asks it several times)."""
    key = (label, *((f, os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in map(str, split.files)))
    if key not in _UNLABELLED:
        _UNLABELLED[key] = _read_unlabelled(split, label)
    return _UNLABELLED[key]


def _read_unlabelled(split: hf.HFSplit, label: str) -> bool:
    if label not in hf.schema(split).names:
        return True
    labels = hf.split_labels(split, label)
    if labels.dtype.kind not in "iu":  # a column of nulls only (untyped), or of another kind: its readers judge it
        return bool(len(labels)) and all(value is None for value in labels)
    return bool(len(labels)) and bool((labels < 0).all())


def _split_name(splits: dict[str, Any], split: Any, part: str) -> tuple[str, str]:
    """(the name of the split read for `part`, as HF names it; a note where it stands in for another)."""
    name = next(key for key, value in splits.items() if value is split)
    note = f" (no {part} split: it stands in)" if name not in (part, "train") else ""
    return {"val": "validation"}.get(name, name), note


def describe_hf(
    uri: str,
    path: str,
    size: int,
    max_in_memory_bytes: int,
    image_column: str = "",
    label_column: str = "",
    labelled: bool = True,
) -> SourceInfo:
    data = read_hf(path, "train", size, None, image_column, label_column, labelled)
    if isinstance(data, ShardSet):
        side = _probe_stream(data.units, data.reader)[0]
    else:
        side = probe_images([data.files[i] for i in spread(len(data), PROBED)])[0]
    fits = fits_in_memory(len(data), data.channels, size, max_in_memory_bytes)
    return SourceInfo(
        uri=uri,
        num_train=len(data),
        num_classes=data.num_classes,
        image_size=side,
        channels=data.channels,
        in_memory=fits,
        access="memory" if fits else data.access,
    )
