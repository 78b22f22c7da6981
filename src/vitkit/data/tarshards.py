"""webdataset tar shards (`wds:`): where they are, their splits and classes, and their samples.

    wds:DIR          the shards DIR/*.tar; splits by the index DIR/dataset.json (written by `vitkit shard`)
                     or by name prefix (train-*, val-*, test-*; no prefix at all = everything is train)
    wds:PATTERN      e.g. wds:/data/in21k/train-{000000..001023}.tar ({a..b} zero-padded ranges, {x,y}
                     alternatives, nestable): those shards are the training split; val/test come from the
                     pattern's directory as for wds:DIR

A sample is a run of consecutive tar members sharing a key (the path up to the first "." of the file
name, webdataset's grouping): an image (extension .jpg, .jpeg, .png, .webp, ...; of "x.input.jpg" the
last part counts) and a label (.cls: the class index as text, or .json with an integer "label" or
"cls").  `vitkit shard` and webdataset's `ShardWriter` both write this layout.

Shards are read by a small tar reader of our own, not the `webdataset` package: resuming a stream
mid-epoch needs to skip to a member without reading the data before it (tar headers carry sizes, so
the skip is a seek), which webdataset's pipeline does not expose; the reader lists members about
3.5x as fast as the standard library's tarfile (which webdataset uses), and per worker the whole
path decodes as fast as the folder path (benchmarks/data_pipeline.py).  Shards must be uncompressed `.tar` (their
images are compressed already).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vitkit.data.braces import expand_braces
from vitkit.data.images import MAX_PIXELS
from vitkit.data.shardscan import class_names_by_scan, damage, scan_shard, shard_labels
from vitkit.data.stream import Sample, Unit
from vitkit.data.tarformat import BLOCK, TarFormatError, tar_members
from vitkit.data.tarsamples import (
    MAX_CLASSES,
    ClassNames,
    _assemble,
    _groups,
    _name_once,
    check_class_names,
    damage_message,
    loading_log,
)

__all__ = [
    "INCOMPLETE",
    "MAX_CLASSES",
    "TarReader",
    "TarFormatError",
    "tar_members",
    "split_units",
    "read_index",
    "scan_shard",
    "shard_labels",
    "class_names_by_scan",
    "damage",
    "expand_braces",
]

INDEX = "dataset.json"
INCOMPLETE = ".shard-incomplete"  # `vitkit shard` writes it first and removes it last: a run killed part-way
INDEX_FORMAT = "vitkit-wds/1"
# A split's name as a word of a shard's name: train-000.tar, imagenet1k-validation-00.tar (timm's and HF's naming)
SPLIT_WORD = re.compile(r"(?:^|[-_.])(train|val|valid|validation|test)(?=[-_.])")
_SPLIT_NAMES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
MAX_MISSING = 100_000  # samples an index may count beyond what its shard's size can hold (the shard was cut)
MAX_INDEX_BYTES = 64 << 20  # dataset.json larger than this is refused (a million shards take about 50 MB)
MAX_SIDE = math.isqrt(MAX_PIXELS)  # an image's shorter side under the readers' pixel limit: 9,459


def stale_count_message(path: str, count: int, held: int) -> str:
    """The index counts `count` samples in a whole shard that holds `held` (fewer): the index is out of date."""
    return (
        f"{INDEX} says {path} holds {count} samples, but the file holds {held} (it ends cleanly): the index "
        f"is out of date; re-run `vitkit shard` or fix {INDEX}. Reading the {held} it holds"
    )


class TarReader:
    """Reads the samples of tar shards (`Unit.path`); picklable, so DataLoader workers get their own.

    A sample's key is "SHARD:KEY" (the shard's path and its members' common name), so every message
    about a sample names its file.  Made with `labelled=False` (an objective that uses no labels), no label
    member is read and every image is class 0; otherwise a sample without a label is corrupt.  A label that is a
    class name ("cat" for "3") is read through `classes` (the names of a classes.txt).
    """

    def __init__(self, labelled: bool = True, classes: ClassNames | None = None) -> None:
        self.labelled = labelled
        self.classes = classes

    def labels(self, units: list[Unit]) -> list[list[int]]:
        """The label of each of a unit's `count` samples (-1 where none is readable or the shard ends early;
        read without labels, 0 for every sample the shard holds)."""
        found = []
        for unit in units:
            labels = list(shard_labels(Path(unit.path), self.classes and self.classes.index)[: unit.count])
            labels = labels if self.labelled else [0] * len(labels)
            found.append(labels + [-1] * (unit.count - len(labels)))
        return found

    def samples(self, unit: Unit, start: int = 0, wanted: frozenset[int] | None = None) -> Iterator[tuple[int, Sample]]:
        """(ordinal, sample) for ordinals start .. unit.count-1 (those in `wanted` only, when given).

        Exactly `unit.count` ordinals exist: a shard that breaks early (truncated, damaged, unreadable)
        yields the missing ones as corrupt samples, one that ends cleanly before its count (an index out
        of date, named once) as absent ones (neither used nor counted as corrupt), and members past the
        count are ignored, so a stream's order depends on the index alone.  Skipped samples cost a header
        read and a seek.  Each call opens the shard afresh: nothing read from one shard outlives it.
        """
        seen, problem = 0, ""  # groups dealt with (yielded or skipped)
        try:
            with open(unit.path, "rb") as handle:
                for index, (key, members) in enumerate(_groups(handle)):
                    if index >= unit.count:
                        _name_once(
                            unit.path,
                            f"{unit.path} holds more samples than its index says ({unit.count}); ignoring the rest",
                        )
                        return
                    if index >= start and (wanted is None or index in wanted):
                        yield index, _assemble(f"{unit.path}:{key}", members, handle, self.labelled, self.classes)
                    seen = index + 1
        except (TarFormatError, OSError) as error:
            problem = f"unreadable shard ({type(error).__name__}: {error})"
            described = damage_message(unit.path, seen, error) if isinstance(error, TarFormatError) else problem
            _name_once(unit.path, f"{described}; its remaining samples count as corrupt")
        if not problem and seen < unit.count:
            _name_once(unit.path, stale_count_message(unit.path, unit.count, seen))
        for index in range(max(seen, start), unit.count):  # the shard ended (or broke) before its count
            if wanted is None or index in wanted:
                yield index, Sample(f"{unit.path}#{index}", None, None, problem, absent=not problem)


# --------------------------------------------------------------------------- discovery and splits
def _shard_files(spec: str) -> tuple[Path, list[Path], bool]:
    """(directory, shard files, is_pattern) of a wds: path."""
    if "{" in spec or any(c in Path(spec).name for c in "*?[") or (spec.endswith(".tar") and Path(spec).is_file()):
        expanded = expand_braces(spec)
        files: list[Path] = []
        for part in map(Path, expanded):
            if any(c in part.name for c in "*?["):
                files += sorted(part.parent.glob(part.name))
            elif part.is_file():
                files.append(part)
            else:
                raise FileNotFoundError(
                    f"wds:{spec}: shard {part} of the pattern does not exist ({len(expanded)} names in the pattern)"
                )
        files = list(dict.fromkeys(files))
        if not files:
            raise FileNotFoundError(f"wds:{spec}: the pattern matches no shard")
        return Path(expanded[0]).parent, files, True
    directory = Path(spec)
    if not directory.is_dir():
        raise FileNotFoundError(f"wds:{spec}: no such directory (or brace pattern of .tar files)")
    shards = _shards_in(directory) or _split_folder_shards(directory)
    packed = [p for p in directory.iterdir() if p.name.endswith((".tar.gz", ".tgz"))]
    if packed and shards:
        loading_log.warning("wds:%s: ignoring %d gzip-compressed shard(s) beside the .tar ones", spec, len(packed))
    elif packed:
        raise ValueError(
            f"wds:{spec}: holds gzip-compressed shards ({len(packed)} .tar.gz), which are not read: decompress them "
            f"(gunzip {directory}/*.tar.gz) into .tar shards"
        )
    return directory, shards, False


def _shards_in(directory: Path) -> list[Path]:
    """The .tar files of `directory`, sorted, hidden ones left out (macOS writes a ._NAME of metadata beside each
    file it copies to a foreign disk, which is no shard)."""
    return sorted(p for p in directory.glob("*.tar") if not p.name.startswith("."))


def _split_folder_shards(directory: Path) -> list[Path]:
    """The shards of DIR/train/, DIR/val/, DIR/test/ (any split word) where DIR itself holds none."""
    folders = [p for p in sorted(directory.iterdir()) if p.name in _SPLIT_NAMES and p.is_dir()]
    return [shard for folder in folders for shard in _shards_in(folder)]


def read_index(directory: Path) -> dict[str, Any] | None:
    """DIR/dataset.json, checked field by field (it is read as untrusted input), or None when absent."""
    path = directory / INDEX
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_INDEX_BYTES:
        raise ValueError(f"{path}: {path.stat().st_size:,} bytes, larger than an index can be ({MAX_INDEX_BYTES:,})")
    try:
        index = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError, nesting too deep
        raise ValueError(f"{path}: not valid JSON ({type(error).__name__}: {error})") from error
    if not isinstance(index, dict) or not isinstance(index.get("splits"), dict):
        raise ValueError(f"{path}: expected an object with a 'splits' mapping (as `vitkit shard` writes)")
    classes, channels, side = index.get("classes"), index.get("channels"), index.get("image_size")
    if classes is not None and not (
        isinstance(classes, list) and all(isinstance(c, str) for c in classes) and 0 < len(classes) <= MAX_CLASSES
    ):
        raise ValueError(f"{path}: 'classes' must be a list of 1..{MAX_CLASSES:,} names")
    if classes is not None:
        check_class_names(classes, str(path), "class")
    if channels not in (None, 1, 3) or isinstance(channels, bool):
        raise ValueError(f"{path}: 'channels' must be 1 or 3, got {channels!r:.40}")
    if side is not None and (isinstance(side, bool) or not isinstance(side, int) or not 0 <= side <= MAX_SIDE):
        raise ValueError(
            f"{path}: 'image_size' must be a side length in pixels, at most {MAX_SIDE:,} (the readers' pixel limit), "
            f"got {side!r:.40}"
        )
    return index


def _by_prefix(files: list[Path], directory: Path) -> dict[str, list[Path]]:
    """{split: shards} by the split word in each shard's name, else by its folder's (DIR/test/0000.tar)."""
    splits: dict[str, list[Path]] = {}
    for path in files:
        words = SPLIT_WORD.findall(path.name) or ([path.parent.name] if path.parent != directory else [])
        if words:  # the last, nearest the shard's number
            splits.setdefault(_SPLIT_NAMES[words[-1]], []).append(path)
    if not splits:
        return {"train": files} if files else {}
    unnamed = [p.name for p in files if not SPLIT_WORD.search(p.name) and p.parent == directory]
    if unnamed:
        loading_log.warning(  # every process lists the shards
            "ignoring %d shard(s) whose names name no split (train, val, test), e.g. %s", len(unnamed), unnamed[0]
        )
    return splits


def _entry(directory: Path, split: str, entry: Any) -> tuple[Path, int]:
    """(shard path, count) of one index entry {"shard": NAME, "count": N}: a relative path inside DIR, N >= 0."""
    shard, count = (entry.get("shard"), entry.get("count")) if isinstance(entry, dict) else (None, None)
    inside = isinstance(shard, str) and shard and not Path(shard).is_absolute() and ".." not in Path(shard).parts
    if not inside or isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(
            f"{directory / INDEX}: bad entry {str(entry)[:80]!r} in the {split} split (expected "
            '{"shard": NAME inside the directory, "count": N >= 0})'
        )
    return directory / shard, count


def _indexed(directory: Path, index: dict[str, Any]) -> dict[str, list[tuple[Path, int]]]:
    splits = {}
    for name, entries in index["splits"].items():
        if name not in ("train", "val", "test") or not isinstance(entries, list):
            raise ValueError(
                f"{directory / INDEX}: split {name!r} must be train, val or test, holding a list of shards"
            )
        splits[name] = [_entry(directory, name, entry) for entry in entries]
    seen: set[object] = set()
    for path, _ in (pair for entries in splits.values() for pair in entries):  # each listing read as more samples
        try:  # one file under two names (a link) is listed twice too
            same: object = (path.stat().st_dev, path.stat().st_ino)
        except OSError:  # missing: said where its split is read
            same = path
        if same in seen:
            raise ValueError(f"{directory / INDEX} lists {path.name} more than once; a shard belongs to one split once")
        seen.add(same)
    return splits


def _unit(spec: str, split: str, path: Path, count: int) -> Unit:
    """The unit of one shard: counted by the index, else by a scan.  An index may count samples a truncated
    shard lost (read as corrupt), up to MAX_MISSING more than the file can hold; more is a broken index."""
    if not path.is_file():
        raise FileNotFoundError(f"wds:{spec}: shard {path} of the {split} split is missing")
    if count < 0:
        return Unit(str(path), scan_shard(path)[0])
    room = path.stat().st_size // (2 * BLOCK)  # a sample takes at least two 512-byte headers
    if count > room + MAX_MISSING:
        raise ValueError(
            f"wds:{spec}: {INDEX} says {path} holds {count:,} samples; its {path.stat().st_size:,} "
            f"bytes hold at most {room:,}"
        )
    return Unit(str(path), count)


def split_units(spec: str) -> tuple[dict[str, list[Unit]], list[str] | None, dict[str, Any]]:
    """({split: units}, class names from the index or None, the index or {}) of a wds: path."""
    directory, files, pattern = _shard_files(spec)
    if (directory / INCOMPLETE).exists():
        raise ValueError(
            f"wds:{spec}: an interrupted `vitkit shard` left {directory} half written (no {INDEX}); run the "
            "shard command again, which starts it over"
        )
    index = read_index(directory)
    if index is not None:
        counted = _indexed(directory, index)
    else:
        counted = {
            name: [(p, -1) for p in paths]
            for name, paths in _by_prefix(_shards_in(directory) if pattern else files, directory).items()
        }
    if pattern:  # the pattern's shards are the training split, and no other's
        known = {str(p): c for p, c in counted.get("train", [])}
        counted = {name: [(p, c) for p, c in entries if p not in files] for name, entries in counted.items()}
        counted["train"] = [(p, known.get(str(p), -1)) for p in files]
    splits = {name: [_unit(spec, name, p, c) for p, c in entries] for name, entries in counted.items() if entries}
    classes = index.get("classes") if index else None
    return splits, classes, index or {}
