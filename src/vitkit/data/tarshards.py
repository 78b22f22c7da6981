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
import os
import re
from pathlib import Path
from dataclasses import dataclass
from typing import Any, BinaryIO, Iterator

from vitkit.data.images import IMAGE_EXTENSIONS
from vitkit.data.stream import Sample, Unit

log = logging.getLogger(__name__)

INDEX = "dataset.json"
INDEX_FORMAT = "vitkit-wds/1"
SPLIT_PREFIX = re.compile(r"^(train|val|valid|validation|test)[-_.]")
_SPLIT_NAMES = {"train": "train", "val": "val", "valid": "val", "validation": "val", "test": "test"}
_IMAGE_EXTS = frozenset(ext.lstrip(".") for ext in IMAGE_EXTENSIONS)
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def expand_braces(pattern: str) -> list[str]:
    """Bash-style brace expansion: "a-{00..02}.tar" -> a-00.tar a-01.tar a-02.tar; "{x,y}" -> x, y."""
    start = pattern.find("{")
    if start < 0:
        return [pattern]
    depth = 0
    for end in range(start, len(pattern)):
        depth += {"{": 1, "}": -1}.get(pattern[end], 0)
        if depth == 0:
            break
    else:
        raise ValueError(f"unbalanced braces in shard pattern {pattern!r}")
    body, rest = pattern[start + 1:end], pattern[end + 1:]
    ranged = _RANGE.match(body)
    if ranged:
        first, last = int(ranged[1]), int(ranged[2])
        width = len(ranged[1]) if ranged[1].lstrip("-").startswith("0") else 0
        step = 1 if last >= first else -1
        options = [f"{n:0{width}d}" for n in range(first, last + step, step)]
    else:
        options = _top_level_split(body)
    return [head + tail for option in options for head in expand_braces(pattern[:start] + option)
            for tail in expand_braces(rest)]


def _top_level_split(body: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in body:
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def _split_name(name: str) -> tuple[str, str] | None:
    """"dir/abc.input.jpg" -> ("dir/abc", "input.jpg"); a name without an extension is no sample member."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    if not dot or not stem:
        return None
    return (f"{folder}/{stem}" if folder else stem), ext.lower()


def _parse_label(ext: str, data: bytes) -> int:
    if ext.rsplit(".", 1)[-1] == "cls":
        return int(data.decode("utf-8").strip())
    record = json.loads(data)
    value = record.get("label", record.get("cls")) if isinstance(record, dict) else None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError('no integer "label" or "cls" field')
    return value


BLOCK = 512  # tar's record unit: every header, and every member's data padded to a multiple


class TarFormatError(ValueError):
    """A shard whose tar structure does not parse: a damaged header, or the file ends inside a member."""


@dataclass(frozen=True)
class Member:
    name: str
    offset: int  # where the data starts
    size: int


def _number(field: bytes) -> int:
    """A tar numeric field: octal text, or GNU base-256 (top bit set) for large values."""
    if field[:1] and field[0] & 0x80:
        return int.from_bytes(field[1:], "big")
    try:
        return int(field.strip(b" \0") or b"0", 8)
    except ValueError as error:
        raise TarFormatError(f"bad number field {field!r}") from error


def _pax_path(records: bytes) -> bytes | None:
    """The `path` of a pax extended header ("<length> <key>=<value>\\n" records)."""
    position = 0
    while position < len(records):
        space = records.find(b" ", position)
        if space < 0:
            break
        try:
            length = int(records[position:space])
        except ValueError as error:
            raise TarFormatError("damaged pax header") from error
        key, _, value = records[space + 1:position + length - 1].partition(b"=")
        if key == b"path":
            return value
        position += length
    return None


def tar_members(handle: BinaryIO) -> Iterator[Member]:
    """The regular files of an uncompressed tar, front to back: header reads and seeks, no data read.

    Reads ustar, GNU (long names in 'L' records, base-256 sizes) and pax ('path' records) headers;
    a header whose checksum fails raises TarFormatError.  The standard library's tarfile does the same
    at about 3.5 times the cost per member (benchmarks/data_pipeline.py), which counts for small images.
    """
    position, long_name = 0, None
    while True:
        handle.seek(position)
        header = handle.read(BLOCK)
        if not header.strip(b"\0"):  # the end-of-archive zero blocks, or the end of the file
            return
        if len(header) < BLOCK:
            raise TarFormatError(f"the file ends inside a header at byte {position}")
        if _number(header[148:156]) != sum(header[:148]) + 256 + sum(header[156:]):
            raise TarFormatError(f"header checksum mismatch at byte {position}")
        size, kind = _number(header[124:136]), header[156:157]
        data, position = position + BLOCK, position + BLOCK + -(-size // BLOCK) * BLOCK
        if kind in (b"L", b"x"):  # the next member's long name
            extra = _read(handle, Member("", data, size))
            long_name = extra.split(b"\0", 1)[0] if kind == b"L" else (_pax_path(extra) or long_name)
            continue
        if kind in (b"0", b"\0", b"7"):
            name = header[:100].split(b"\0", 1)[0]
            prefix = header[345:500].split(b"\0", 1)[0] if header[257:262] == b"ustar" else b""
            name = long_name or (prefix + b"/" + name if prefix else name)
            yield Member(name.decode("utf-8", "surrogateescape"), data, size)
        long_name = None


def _read(handle: BinaryIO, member: Member) -> bytes:
    handle.seek(member.offset)
    data = handle.read(member.size)
    if len(data) != member.size:
        raise TarFormatError(f"the file ends inside member {member.name or '(header)'}")
    return data


def _assemble(key: str, members: list[tuple[str, Member]], handle: BinaryIO) -> Sample:
    """Image bytes and label of one group of members."""
    image = next((m for ext, m in members if ext.rsplit(".", 1)[-1] in _IMAGE_EXTS), None)
    label = next(((ext, m) for ext, m in members if ext.rsplit(".", 1)[-1] == "cls"), None) or \
        next(((ext, m) for ext, m in members if ext.rsplit(".", 1)[-1] == "json"), None)
    if image is None or label is None:
        return Sample(key, None, None, f"no {'image' if image is None else 'label (.cls or .json)'} member")
    try:
        value = _parse_label(label[0], _read(handle, label[1]))
    except (ValueError, UnicodeDecodeError) as error:
        if isinstance(error, TarFormatError):
            raise
        return Sample(key, None, None, f"unreadable label .{label[0]} ({error})")
    return Sample(key, _read(handle, image), value)


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


class TarReader:
    """Reads the samples of tar shards (`Unit.path`); picklable, so DataLoader workers get their own."""

    def samples(self, unit: Unit, start: int = 0, wanted: frozenset[int] | None = None) -> Iterator[tuple[int, Sample]]:
        """(ordinal, sample) for ordinals start .. unit.count-1 (those in `wanted` only, when given).

        Exactly `unit.count` ordinals exist: a shard that ends early (truncated, unreadable) yields
        the missing ones as corrupt samples, and members past the count are ignored, so a stream's
        order depends on the index alone.  Skipped samples cost a header read and a seek.
        """
        seen, problem = 0, ""  # groups dealt with (yielded or skipped)
        try:
            with open(unit.path, "rb") as handle:
                for index, (key, members) in enumerate(_groups(handle)):
                    if index >= unit.count:
                        log.warning("%s holds more samples than its index says (%d); ignoring the rest",
                                    unit.path, unit.count)
                        return
                    if index >= start and (wanted is None or index in wanted):
                        yield index, _assemble(key, members, handle)
                    seen = index + 1
        except (TarFormatError, OSError) as error:
            problem = f"{unit.path}: unreadable shard ({type(error).__name__}: {error})"
            log.warning("%s; its remaining samples count as corrupt", problem)
        for index in range(max(seen, start), unit.count):  # the shard ended (or broke) before its count
            if wanted is None or index in wanted:
                yield index, Sample(f"{unit.path}#{index}", None, None, problem or f"{unit.path} ends before sample {index}")


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
                raise FileNotFoundError(f"wds:{spec}: shard {part} of the pattern does not exist "
                                        f"({len(expanded)} names in the pattern)")
        files = list(dict.fromkeys(files))
        if not files:
            raise FileNotFoundError(f"wds:{spec}: the pattern matches no shard")
        return Path(expanded[0]).parent, files, True
    directory = Path(spec)
    if not directory.is_dir():
        raise FileNotFoundError(f"wds:{spec}: no such directory (or brace pattern of .tar files)")
    return directory, sorted(directory.glob("*.tar")), False


def read_index(directory: Path) -> dict[str, Any] | None:
    """DIR/dataset.json, checked, or None when absent."""
    path = directory / INDEX
    if not path.is_file():
        return None
    try:
        index = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from error
    if not isinstance(index, dict) or not isinstance(index.get("splits"), dict):
        raise ValueError(f"{path}: expected an object with a 'splits' mapping (as `vitkit shard` writes)")
    return index


@functools.lru_cache(maxsize=4096)
def _scan(path: str, stamp: tuple[int, int]) -> tuple[int, int]:
    """(samples, largest label) of a shard without an index entry: reads headers and label members only."""
    count, top = 0, -1
    with open(path, "rb") as handle:
        try:
            for key, members in _groups(handle):
                count += 1
                label = next(((e, m) for e, m in members if e.rsplit(".", 1)[-1] in ("cls", "json")), None)
                if label is not None:
                    try:
                        top = max(top, _parse_label(label[0], _read(handle, label[1])))
                    except (ValueError, UnicodeDecodeError):
                        pass
        except TarFormatError as error:  # what could be read counts; the reader stops at the same place
            log.warning("%s: damaged after %d samples (%s)", path, count, error)
    return count, top


def scan_shard(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return _scan(str(path), (stat.st_size, stat.st_mtime_ns))


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


def _indexed(directory: Path, index: dict[str, Any]) -> dict[str, list[tuple[Path, int]]]:
    splits = {}
    for name, entries in index["splits"].items():
        if name not in ("train", "val", "test"):
            raise ValueError(f"{directory / INDEX}: unknown split {name!r} (expected train, val, test)")
        splits[name] = [(directory / entry["shard"], int(entry["count"])) for entry in entries]
    return splits


def split_units(spec: str) -> tuple[dict[str, list[Unit]], list[str] | None, dict[str, Any]]:
    """({split: units}, class names from the index or None, the index or {}) of a wds: path."""
    directory, files, pattern = _shard_files(spec)
    index = read_index(directory)
    if index is not None:
        counted = _indexed(directory, index)
    else:
        counted = {name: [(p, -1) for p in paths] for name, paths in _by_prefix(sorted(directory.glob("*.tar"))
                                                                                  if pattern else files).items()}
    if pattern:  # the pattern's shards are the training split
        known = {str(p): c for p, c in counted.get("train", [])}
        counted["train"] = [(p, known.get(str(p), -1)) for p in files]
    splits = {name: [Unit(str(p), c if c >= 0 else scan_shard(p)[0]) for p, c in entries]
              for name, entries in counted.items() if entries}
    for name, units in splits.items():
        for unit in units:
            if not os.path.isfile(unit.path):
                raise FileNotFoundError(f"wds:{spec}: shard {unit.path} of the {name} split is missing")
    classes = index.get("classes") if index else None
    return splits, classes, index or {}


def class_names_by_scan(units: list[Unit]) -> list[str]:
    """Class names "0" .. "K-1" from the largest label in the shards (no index to name them)."""
    top = max(scan_shard(Path(unit.path))[1] for unit in units)
    return [str(i) for i in range(top + 1)]
