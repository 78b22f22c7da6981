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

import functools
import json
import logging
import re
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from vitkit.data.braces import expand_braces
from vitkit.data.images import IMAGE_EXTENSIONS
from vitkit.data.stream import Sample, Unit
from vitkit.data.tarformat import BLOCK, Member, TarFormatError, read_member, tar_members

__all__ = ["TarReader", "TarFormatError", "tar_members", "split_units", "read_index", "scan_shard", "expand_braces"]

log = logging.getLogger(__name__)

INDEX = "dataset.json"
INDEX_FORMAT = "vitkit-wds/1"
SPLIT_PREFIX = re.compile(r"^(train|val|valid|validation|test)[-_.]")
_SPLIT_NAMES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
_IMAGE_EXTS = frozenset(ext.lstrip(".") for ext in IMAGE_EXTENSIONS)
MAX_CLASSES = 1_000_000  # a label at or above this is corrupt (ImageNet-21k has 21,843 classes)
MAX_LABEL_BYTES = 1 << 16  # a label member larger than this is corrupt
MAX_IMAGE_BYTES = 1 << 29  # an image member larger than this (512 MiB) is corrupt, and not read
MAX_MISSING = 100_000  # samples an index may count beyond what its shard's size can hold (the shard was cut)
MAX_INDEX_BYTES = 64 << 20  # dataset.json larger than this is refused (a million shards take about 50 MB)
_named: set[str] = set()  # shards already named in this process's log: a damaged shard is named once


def _split_name(name: str) -> tuple[str, str] | None:
    """ "dir/abc.input.jpg" -> ("dir/abc", "input.jpg"); a name without an extension is no sample member."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot or not stem:
        return None
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def _parse_label(ext: str, data: bytes) -> int:
    """The class index of a .cls (text) or .json label member; ValueError when it holds none in 0..MAX_CLASSES-1."""
    if len(data) > MAX_LABEL_BYTES:
        raise ValueError(f"{len(data):,} bytes, more than a label holds")
    if ext.rsplit(".", 1)[-1] == "cls":
        value = int(data.decode("utf-8").strip())
    else:
        try:
            record = json.loads(data)
        except RecursionError as error:  # nesting deeper than the parser's stack: not a label record
            raise ValueError("JSON nested too deeply") from error
        value = record.get("label", record.get("cls")) if isinstance(record, dict) else None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError('no integer "label" or "cls" field')
    if not 0 <= value < MAX_CLASSES:
        raise ValueError(f"label {value} is outside 0..{MAX_CLASSES - 1}")
    return value


def _assemble(key: str, members: list[tuple[str, Member]], handle: BinaryIO) -> Sample:
    """Image bytes and label of one group of members (or what is wrong with it)."""
    image = next((m for ext, m in members if ext.rsplit(".", 1)[-1] in _IMAGE_EXTS), None)
    label = next(((ext, m) for ext, m in members if ext.rsplit(".", 1)[-1] == "cls"), None) or next(
        ((ext, m) for ext, m in members if ext.rsplit(".", 1)[-1] == "json"), None
    )
    if image is None or label is None:
        return Sample(key, None, None, f"no {'image' if image is None else 'label (.cls or .json)'} member")
    if label[1].size > MAX_LABEL_BYTES or image.size > MAX_IMAGE_BYTES:
        big = label[1] if label[1].size > MAX_LABEL_BYTES else image
        return Sample(key, None, None, f"member {big.name!r} of {big.size:,} bytes is too large to be read")
    try:
        value = _parse_label(label[0], read_member(handle, label[1]))
    except TarFormatError:
        raise
    except (ValueError, UnicodeDecodeError) as error:
        return Sample(key, None, None, f"unreadable label .{label[0]} ({error})")
    return Sample(key, read_member(handle, image), value)


def _groups(handle: BinaryIO) -> Iterator[tuple[str, list[tuple[str, Member]]]]:
    """(key, [(extension, member), ...]) for each run of consecutive regular files sharing a key."""
    key, group = None, []
    try:
        for member in tar_members(handle):
            parts = _split_name(member.name)
            if parts is None:
                continue
            if parts[0] != key and group:
                yield key, group
                group = []
            key = parts[0]
            group.append((parts[1], member))
    except TarFormatError:
        if group:  # the members before the damage still make a sample (or a visibly incomplete one)
            yield key, group
        raise
    if group:
        yield key, group


def _name_once(path: str, message: str) -> None:
    """Log `message` about shard `path` the first time only (a damaged shard is read again every epoch)."""
    if path not in _named:
        _named.add(path)
        log.warning("%s", message)


class TarReader:
    """Reads the samples of tar shards (`Unit.path`); picklable, so DataLoader workers get their own.

    A sample's key is "SHARD:KEY" (the shard's path and its members' common name), so every message
    about a sample names its file.
    """

    def samples(self, unit: Unit, start: int = 0, wanted: frozenset[int] | None = None) -> Iterator[tuple[int, Sample]]:
        """(ordinal, sample) for ordinals start .. unit.count-1 (those in `wanted` only, when given).

        Exactly `unit.count` ordinals exist: a shard that ends early (truncated, unreadable) yields
        the missing ones as corrupt samples, and members past the count are ignored, so a stream's
        order depends on the index alone.  Skipped samples cost a header read and a seek.  Each call
        opens the shard afresh: nothing read from one shard outlives it.
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
                        yield index, _assemble(f"{unit.path}:{key}", members, handle)
                    seen = index + 1
        except (TarFormatError, OSError) as error:
            problem = f"unreadable shard ({type(error).__name__}: {error})"
            _name_once(unit.path, f"{unit.path}: {problem}; its remaining samples count as corrupt")
        for index in range(max(seen, start), unit.count):  # the shard ended (or broke) before its count
            if wanted is None or index in wanted:
                yield (
                    index,
                    Sample(f"{unit.path}#{index}", None, None, problem or f"the shard ends before sample {index}"),
                )


# --------------------------------------------------------------------------- discovery and splits
def _shard_files(spec: str) -> tuple[Path, list[Path], bool]:
    """(directory, shard files, is_pattern) of a wds: path."""
    if "{" in spec or any(c in Path(spec).name for c in "*?["):
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
    return directory, sorted(directory.glob("*.tar")), False


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
    if channels not in (None, 1, 3) or isinstance(channels, bool):
        raise ValueError(f"{path}: 'channels' must be 1 or 3, got {channels!r:.40}")
    if side is not None and (isinstance(side, bool) or not isinstance(side, int) or side < 0):
        raise ValueError(f"{path}: 'image_size' must be a side length in pixels, got {side!r:.40}")
    return index


@functools.lru_cache(maxsize=4096)
def _scan(path: str, stamp: tuple[int, int]) -> tuple[int, int, str]:
    """(samples, largest label, the damage found or "") of a shard without an index entry: reads headers and
    label members only; a damaged shard counts the samples before the damage and is named in the log once."""
    count, top, problem = 0, -1, ""
    with open(path, "rb") as handle:
        try:
            for _key, members in _groups(handle):
                count += 1
                label = next(((e, m) for e, m in members if e.rsplit(".", 1)[-1] in ("cls", "json")), None)
                if label is not None:
                    try:
                        top = max(top, _parse_label(label[0], read_member(handle, label[1])))
                    except TarFormatError:
                        raise
                    except (ValueError, UnicodeDecodeError):
                        pass
        except TarFormatError as error:  # what could be read counts; the reader stops at the same place
            problem = f"{path}: damaged after {count} samples ({error})"
            _name_once(path, problem)
    return count, top, problem


def scan_shard(path: Path) -> tuple[int, int, str]:
    """(samples, largest label, damage or "") of the shard at `path` (cached while its size and mtime hold)."""
    stat = path.stat()
    return _scan(str(path), (stat.st_size, stat.st_mtime_ns))


@functools.lru_cache(maxsize=1024)
def _labels(path: str, stamp: tuple[int, int]) -> array:
    """The label of every sample of a shard in order, -1 where it has none readable (.cls before .json, as the
    reader); the samples before any damage only (`_scan` names the damage).  8 bytes a sample in the cache."""
    labels = array("q")
    with open(path, "rb") as handle:
        try:
            for _, members in _groups(handle):
                found = [(e, m) for e, m in members if e.rsplit(".", 1)[-1] in ("cls", "json")]
                label = min(found, key=lambda em: em[0].rsplit(".", 1)[-1] != "cls", default=None)
                value = -1
                if label is not None and label[1].size <= MAX_LABEL_BYTES:
                    try:
                        value = _parse_label(label[0], read_member(handle, label[1]))
                    except TarFormatError:
                        raise
                    except (ValueError, UnicodeDecodeError):
                        pass
                labels.append(value)
        except TarFormatError:
            pass
    return labels


def shard_labels(path: Path) -> array:
    """The class index of every sample of the shard at `path` (-1: none readable); reads label members only
    (do not modify the array: it is cached while the shard's size and mtime hold)."""
    stat = path.stat()
    return _labels(str(path), (stat.st_size, stat.st_mtime_ns))


def _by_prefix(files: list[Path]) -> dict[str, list[Path]]:
    splits: dict[str, list[Path]] = {}
    for path in files:
        match = SPLIT_PREFIX.match(path.name)
        if match:
            splits.setdefault(_SPLIT_NAMES[match[1]], []).append(path)
    if not splits:
        return {"train": files} if files else {}
    unnamed = [p.name for p in files if not SPLIT_PREFIX.match(p.name)]
    if unnamed:
        log.warning("ignoring %d shard(s) without a train-/val-/test- prefix, e.g. %s", len(unnamed), unnamed[0])
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
    index = read_index(directory)
    if index is not None:
        counted = _indexed(directory, index)
    else:
        counted = {
            name: [(p, -1) for p in paths]
            for name, paths in _by_prefix(sorted(directory.glob("*.tar")) if pattern else files).items()
        }
    if pattern:  # the pattern's shards are the training split
        known = {str(p): c for p, c in counted.get("train", [])}
        counted["train"] = [(p, known.get(str(p), -1)) for p in files]
    splits = {name: [_unit(spec, name, p, c) for p, c in entries] for name, entries in counted.items() if entries}
    classes = index.get("classes") if index else None
    return splits, classes, index or {}


def class_names_by_scan(units: list[Unit]) -> list[str]:
    """Class names "0" .. "K-1" from the largest label in the shards (no index to name them): pass every
    split's units, so a test label above the training split's largest still names a class."""
    top = max((scan_shard(Path(unit.path))[1] for unit in units), default=-1)
    return [str(i) for i in range(top + 1)]


def damage(units: list[Unit]) -> list[str]:
    """What the scans of these shards found damaged ("" entries left out): the reason a split came up short."""
    return [problem for unit in units if (problem := scan_shard(Path(unit.path))[2])]
