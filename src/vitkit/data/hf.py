"""Hugging Face datasets on disk (`hf:DIR`), read with pyarrow (the `datasets` extra); no hub is contacted.

    DIR/dataset_dict.json + DIR/<split>/     DatasetDict.save_to_disk
    DIR/<split>/ (each a saved Dataset)      one sub-directory per split
    DIR itself a saved Dataset               Dataset.save_to_disk: the training split only
    DIR/**/*.parquet                         Parquet files; the split from the parent directory's name or
                                             the file name's prefix (the Hub's data/train-00000-of-00004.parquet)

Split names: train; val = validation, valid or val; test = test, else val.  `save_to_disk` Arrow files
are memory-mapped, so a split is random-access (map-style): it is served exactly like a folder, by the
step-indexed order of vitkit.data.loader.  Parquet stores compressed row groups that cannot be read
one row at a time, so a Parquet split is streamed by row groups (vitkit.data.stream).

Columns are found by feature type (the `huggingface` schema metadata that `datasets` writes): the image
column is the `Image` one (else a struct column with binary `bytes`), the label column the `ClassLabel`
one, whose names are the classes (else the one integer column).  When there are several,
`data.image_column` / `data.label_column` choose.  Rows labelled -1 (unlabelled) are dropped.
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitkit.data import hfnames
from vitkit.data.hfcolumns import choose_columns
from vitkit.data.stream import Sample, Unit

log = logging.getLogger(__name__)

SPLIT_NAMES = {"train": "train", "validation": "val", "valid": "val", "val": "val", "test": "test"}


def _pyarrow() -> Any:
    try:
        import pyarrow as pa  # noqa: F401
        import pyarrow.parquet  # noqa: F401
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("hf: sources need pyarrow: pip install 'vitkit[datasets]'") from error
    return pa


@dataclass(frozen=True)
class HFSplit:
    """Where one split's rows are: memory-mapped Arrow files or Parquet files."""

    kind: str  # "arrow" or "parquet"
    files: tuple[str, ...]


def find_splits(root: Path) -> dict[str, HFSplit]:
    """{train/val/test: files} of an hf: directory (see the module docstring)."""
    if root.is_file():
        raise ValueError(
            f"hf:{root} is a file; hf: takes the directory of a saved dataset or of Parquet files: put it in a "
            "folder, named train-*.parquet (or under train/), and give hf:FOLDER"
        )
    if not root.is_dir():
        raise FileNotFoundError(f"hf:{root}: no such directory")
    if (root / "state.json").is_file():
        return {"train": _arrow_split(root)}
    found: dict[str, HFSplit] = {}
    for child in sorted(p for p in root.iterdir() if p.is_dir() and (p / "state.json").is_file()):
        if child.name in SPLIT_NAMES:
            found[SPLIT_NAMES[child.name]] = _arrow_split(child)
        else:
            log.info("hf:%s: ignoring split %r (not train/validation/test)", root, child.name)
    if found:
        return found
    parquet: dict[str, list[str]] = {}
    configs: set[Path] = set()  # the folder each split's files are in (a Hub dataset's configuration)
    for path in sorted(root.rglob("*.parquet")):
        prefix = path.name.split("-")[0].split("_")[0].split(".")[0]
        split = SPLIT_NAMES.get(path.parent.name) or SPLIT_NAMES.get(prefix)
        parquet.setdefault(split or "", []).append(_regular(path))
        if split:
            configs.add(path.parent.parent if SPLIT_NAMES.get(path.parent.name) else path.parent)
    if len(configs) > 1:
        names = sorted(str(c.relative_to(root)) for c in configs)
        raise ValueError(
            f"hf:{root} holds Parquet files of several configurations ({', '.join(names[:5])}), whose splits and "
            f"classes differ: give one, e.g. hf:{root / names[0]}"
        )
    if not parquet:
        raise FileNotFoundError(f"hf:{root}: neither a saved dataset (state.json, dataset_dict.json) nor Parquet files")
    if set(parquet) == {""}:
        return {"train": HFSplit("parquet", tuple(parquet[""]))}
    if "" in parquet:
        log.warning(
            "hf:%s: ignoring %d Parquet file(s) outside the train/validation/test splits", root, len(parquet[""])
        )
    return {split: HFSplit("parquet", tuple(files)) for split, files in parquet.items() if split}


@contextmanager
def _naming(path: str | Path, what: str) -> Iterator[None]:
    """A damaged file's error (a JSON or Arrow reader's, which names no file) re-raised naming it."""
    try:
        yield
    except (ValueError, OSError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{path}: not a readable {what} ({error})") from error


def _arrow_split(directory: Path) -> HFSplit:
    with _naming(directory / "state.json", "datasets state.json"):
        state = json.loads((directory / "state.json").read_text())
        names = [str(entry["filename"]) for entry in state.get("_data_files", [])]
    for name in names:  # `save_to_disk` names its own files: another place is a damaged or hostile state.json
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ValueError(f"{directory}/state.json names {name!r}, outside the dataset's folder")
    if not names:
        raise ValueError(f"{directory}/state.json lists no Arrow data files")
    return HFSplit("arrow", tuple(_regular(directory / name) for name in names))


def _regular(path: Path) -> str:
    """`path` where it is a regular file (through links: a Hub snapshot's files link to its blobs); a FIFO or
    device would hang the Arrow reader or never end, and a missing file is named before any is read."""
    try:
        mode = path.stat().st_mode
    except OSError as error:
        raise FileNotFoundError(f"{path}: the dataset's data file is missing ({error.strerror})") from None
    if not stat.S_ISREG(mode):
        raise ValueError(f"{path}: not a regular file (a FIFO, device or folder is not a dataset file)")
    return str(path)


def schema(split: HFSplit) -> Any:
    """The Arrow schema (with the `huggingface` metadata) of a split's first file, without reading rows."""
    pa = _pyarrow()
    with _naming(split.files[0], f"{split.kind} file"):
        if split.kind == "parquet":
            return pa.parquet.ParquetFile(split.files[0]).schema_arrow
        with pa.memory_map(split.files[0]) as source:
            return pa.ipc.open_stream(source).schema


def split_label_map(
    split: HFSplit, name: str, image: str, label: str, names: list[str] | None, where: str
) -> tuple[int, ...]:
    """The train split's class of each of `split`'s ClassLabel names, where they differ from the train split's
    `names` (`DatasetDict.class_encode_column` encodes every split alone); () where they do not.  A ValueError
    where `split` names a class the train split lacks."""
    if not names or not label:
        return ()
    own = choose_columns(schema(split), image, label, where)[2]
    if not own or list(own) == list(names):
        return ()
    index = {class_name: i for i, class_name in enumerate(names)}
    if not all(class_name in index for class_name in own):
        raise ValueError(
            f"{where}: the {name} split's class names ({', '.join(map(str, own))[:200]}) are not all the train "
            f"split's ({', '.join(map(str, names))[:200]}): encode the splits' labels together (cast each "
            "split's label column to the train split's ClassLabel)"
        )
    log.info("%s: the %s split's classes read by name, in the train split's order", where, name)
    return tuple(index[class_name] for class_name in own)


def _image_value(value: Any) -> bytes | str | None:
    """An Image cell (struct of bytes/path, or plain binary) -> encoded bytes, or the file path stored instead."""
    if isinstance(value, dict):
        return value.get("bytes") or value.get("path")
    return value


# ------------------------------------------------------------------------------ map-style (Arrow)
def open_arrow_table(files: tuple[str, ...]) -> Any:
    """The rows of `files` as one table whose buffers are memory-mapped (nothing is copied)."""
    pa = _pyarrow()
    tables = []
    for path in files:
        with _naming(path, "Arrow file"):
            tables.append(pa.ipc.open_stream(pa.memory_map(path)).read_all())
        _same_columns(path, tables[-1].schema.names, files[0], tables[0].schema.names)
    with _naming(Path(files[0]).parent, "Arrow split (its files' column types differ)"):
        return pa.concat_tables(tables)


def _same_columns(path: str, names: list[str], first: str, first_names: list[str]) -> None:
    """A ValueError naming `path` where its columns are not those of the split's `first` file."""
    if names != first_names:
        raise ValueError(
            f"{path}: its columns ({', '.join(names)[:200]}) are not those of {first} "
            f"({', '.join(first_names)[:200]}): the files of one split must share their columns"
        )


class ArrowImages:
    """The image column of memory-mapped Arrow files as a sequence: item i -> encoded bytes (or a path).

    Picklable without its table: each DataLoader worker maps the files again instead of copying rows.
    """

    def __init__(self, files: tuple[str, ...], column: str, rows: np.ndarray | None = None, count: int = 0):
        self.files, self.column, self.rows = files, column, rows  # rows: positions in the files (None: all)
        self.count = len(rows) if rows is not None else count
        self._chunks: tuple[list[int], list[Any]] | None = None

    def __len__(self) -> int:
        return self.count

    def _row(self, i: int) -> int:
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        return int(self.rows[i]) if self.rows is not None else i % len(self)

    def __getitem__(self, i: int) -> bytes | str:
        if self._chunks is None:
            chunks = open_arrow_table(self.files).column(self.column).chunks
            self._chunks = (list(np.cumsum([0] + [len(c) for c in chunks])), chunks)
        row = self._row(i)
        offsets, chunks = self._chunks
        k = bisect.bisect_right(offsets, row) - 1
        return _image_value(chunks[k][row - offsets[k]].as_py()) or b""

    def take(self, index: Any) -> ArrowImages:
        index = np.asarray(index, dtype=np.int64)
        return ArrowImages(self.files, self.column, self.rows[index] if self.rows is not None else index)

    def name(self, i: int) -> str:
        return f"{Path(self.files[0]).parent} row {self._row(i)}"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_chunks": None}


_DROPPED: set[tuple[tuple[str, ...], str, int]] = set()  # (files, label column, rows) already said dropped


def arrow_rows(
    split: HFSplit, image: str, label: str, where: str, classes: int, names: tuple[str, ...] = ()
) -> tuple[ArrowImages, np.ndarray]:
    """The split's images (lazily read) and int64 labels, each below `classes` (the split's class names), a label
    column of strings read through the train split's `names`; unlabelled (-1) rows dropped.  Without a label
    column (`label` ""), every row, each of class 0."""
    table = open_arrow_table(split.files)
    if not label:
        return ArrowImages(split.files, image, None, count=table.num_rows), np.zeros(table.num_rows, np.int64)
    labels = label_values(table.column(label))
    if names:
        labels = hfnames.encode(labels, names, where)
    if labels.dtype.kind not in "iu":
        raise ValueError(f"{where}: label column {label!r} is {labels.dtype}, not integer class indices")
    labels = labels.astype(np.int64)
    if (labels < -1).any():  # -1 is the Hub's "no label"; any other negative is damage
        row = int(np.flatnonzero(labels < -1)[0])
        raise ValueError(f"{where}: row {row}'s label is {labels[row]}; class indices are 0 or more (-1: unlabelled)")
    if (labels >= classes).any():  # past the names (damaged metadata): no class to train or count it as
        row = int(np.flatnonzero(labels >= classes)[0])
        raise ValueError(
            f"{where}: row {row}'s label is {labels[row]}, beyond the {classes} classes 0..{classes - 1} (the split's "
            "class names, or the train split's labels where none are named)"
        )
    keep = np.flatnonzero(labels >= 0)
    dropped = (tuple(split.files), label, len(labels) - len(keep))
    if dropped[2] and dropped not in _DROPPED:  # once a process: every split of a run reads these rows again
        _DROPPED.add(dropped)
        log.warning("%s: dropping %d unlabelled row(s) (label -1 or none)", where, dropped[2])
    rows = keep if len(keep) < len(labels) else None
    return ArrowImages(split.files, image, rows, count=len(labels)), labels[keep]


# ------------------------------------------------------------------------------ streamed (Parquet)
def parquet_units(split: HFSplit, columns: tuple[str, ...]) -> list[Unit]:
    """One unit per Parquet row group (from the footers; no rows read); every file must hold the `columns` read
    (by name: in any order, beside any others)."""
    pq = _pyarrow().parquet
    units = []
    for path in split.files:
        with _naming(path, "Parquet file"):
            file = pq.ParquetFile(path)
            meta, names = file.metadata, file.schema_arrow.names
        missing = [column for column in columns if column and column not in names]
        if missing:
            raise ValueError(
                f"{path}: no column {', '.join(map(repr, missing))} (the split's first file has it; columns here: "
                f"{', '.join(names)[:200]}): the files of one split must share their columns"
            )
        units += [Unit(path, meta.row_group(g).num_rows, g) for g in range(meta.num_row_groups)]
    return units


def row_group_labels(units: list[Unit], label: str, names: tuple[str, ...] = ()) -> list[list[int]]:
    """The label of every row of each row group (`Unit.part`), strings read through `names`, -1 where it has none
    or the row group is unreadable; all 0 without a label column (`label` "").  One column read, once a process
    while the file's size and mtime hold: what a fixed hold-out is drawn from."""
    if not label:
        return [[0] * unit.count for unit in units]
    found = []
    for unit in units:
        try:
            stat = Path(unit.path).stat()
        except OSError:
            values = []
        else:
            values = _label_column(unit.path, unit.part, label, (stat.st_size, stat.st_mtime_ns), names).tolist()
        found.append(values[: unit.count] + [-1] * (unit.count - len(values)))
    return found


def split_labels(split: HFSplit, label: str) -> np.ndarray:
    """Every label of the split (one column: cheap), Arrow or Parquet (`label_values`), to count the classes when
    they have no names or to find a split whose labels are all withheld."""
    if split.kind != "parquet":
        return label_values(open_arrow_table(split.files).column(label))
    pq = _pyarrow().parquet
    columns = []
    for path in split.files:
        with _naming(path, "Parquet file"):
            columns.append(label_values(pq.read_table(path, columns=[label]).column(label)))
    return np.concatenate(columns)


def label_values(column: Any) -> np.ndarray:
    """An Arrow label column as numpy: an integer one with its missing labels as -1 (unlabelled), where numpy
    would make them NaN in floats; another kind as it is (its readers refuse it)."""
    if _pyarrow().types.is_integer(column.type):
        column = column.fill_null(-1)
    return column.to_numpy(zero_copy_only=False)


@functools.lru_cache(maxsize=4096)
def _label_column(path: str, part: int, label: str, stamp: tuple[int, int], names: tuple[str, ...]) -> np.ndarray:
    """The `label` column of row group `part` of a Parquet file as int64, -1 where a row has none, and empty
    where the row group is unreadable (its rows stay on the train side, read as corrupt).  `stamp` (size,
    mtime) keys the cache, which holds 8 bytes a row, and an unreadable row group's answer too: every split
    of a process draws its hold-out from the same labels."""
    try:
        table = _pyarrow().parquet.ParquetFile(path).read_row_group(part, columns=[label])
        values = table.column(label).to_pylist()
    except (OSError, ValueError, KeyError):  # ArrowInvalid/ArrowIOError are ValueError/OSError subclasses
        values = []
    return np.array(hfnames.indices(values, names) if names else [_label(value) for value in values], dtype=np.int64)


def _label(value: Any) -> int:
    """A row's class id; -1 (no label: the row is left out) for None and for what is no whole number, which the
    column's integer type rules out but a file's bytes need not."""
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


@dataclass(frozen=True)
class ParquetReader:
    """Reads one row group (`Unit.part`) of a Parquet file at a time; picklable."""

    image_column: str
    label_column: str  # "": a dataset without labels, every row of class 0
    label_map: tuple[int, ...] = ()  # the train split's class of each of this split's (`split_label_map`)
    label_names: tuple[str, ...] = ()  # a label column of strings: the train split's (vitkit.data.hfnames)

    def labels(self, units: list[Unit]) -> list[list[int]]:
        found = row_group_labels(units, self.label_column, self.label_names)
        return [[self._class(label) for label in unit] for unit in found]

    def _class(self, label: int) -> int:
        return self.label_map[label] if 0 <= label < len(self.label_map) else label

    def samples(self, unit: Unit, start: int = 0, wanted: frozenset[int] | None = None) -> Iterator[tuple[int, Sample]]:
        pq = _pyarrow().parquet
        try:
            columns = [self.image_column, self.label_column] if self.label_column else [self.image_column]
            table = pq.ParquetFile(unit.path).read_row_group(unit.part, columns=columns)
            images = table.column(self.image_column).to_pylist()
            labels = table.column(self.label_column).to_pylist() if self.label_column else [0] * len(images)
            labels = hfnames.indices(labels, self.label_names) if self.label_names else labels
        except (OSError, ValueError) as error:  # ArrowInvalid/ArrowIOError are ValueError/OSError subclasses
            images, labels = [], []
            log.warning("%s row group %d is unreadable (%s); its samples count as corrupt", unit.path, unit.part, error)
        for j in range(start, unit.count):
            if wanted is not None and j not in wanted:
                continue
            key = f"{unit.path}:{unit.part}:{j}"
            if j >= len(images) or _label(labels[j]) < 0:
                yield j, Sample(key, None, None, "missing row or label")
            else:
                yield j, Sample(key, _image_value(images[j]) or b"", self._class(labels[j]))
