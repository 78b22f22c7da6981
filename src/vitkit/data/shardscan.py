"""Scans of shards without an index entry: their sample counts, labels and damage, read from headers and
label members only and cached per file (size and mtime), and the class names that labels alone imply.
"""

from __future__ import annotations

import functools
import itertools
import sys
from array import array
from collections.abc import Container, Mapping
from pathlib import Path
from typing import BinaryIO, NamedTuple

from vitkit.data.readers import DataFormatError, mostly_empty
from vitkit.data.stream import Unit
from vitkit.data.tarformat import Member, TarFormatError, read_member
from vitkit.data.tarsamples import (
    CLASS_FILE,
    MAX_LABEL_BYTES,
    _groups,
    _label_value,
    _name_once,
    damage_message,
    label_member,
)


class ShardScan(NamedTuple):
    """What a scan found in one shard."""

    count: int  # samples (the one the damage cut short included)
    top: int  # the largest label, -1 without one
    problem: str  # the damage found, or ""
    top_key: str  # the key of the first sample holding `top`
    present: bytes  # bit i of byte i // 8 (least significant first) set: some sample has label i
    names: tuple[str, ...]  # the class names labels hold instead of an index, in the order met (interned)


@functools.lru_cache(maxsize=4096)
def _scan(path: str, stamp: tuple[int, int]) -> ShardScan:
    """A shard without an index entry, read from its headers and label members only; a damaged shard counts
    the samples before the damage and is named in the log once."""
    count, top, problem, top_key, present, names = 0, -1, "", "", bytearray(), {}
    with open(path, "rb") as handle:
        try:
            for key, members in _groups(handle):
                count += 1
                label = label_member(members)
                value = None if label is None else _read_label(handle, *label)
                if isinstance(value, str):  # one string for every shard's copy of a name
                    names.setdefault(sys.intern(value), None)
                if value is None or isinstance(value, str):
                    continue
                if value > top:
                    top, top_key = value, key
                if value >> 3 >= len(present):
                    present.extend(bytes((value >> 3) + 1 - len(present)))
                present[value >> 3] |= 1 << (value & 7)
        except TarFormatError as error:  # what could be read counts; the reader stops at the same place
            problem = damage_message(path, count, error)
            _name_once(path, problem, every_process=True)
    return ShardScan(count, top, problem, top_key, bytes(present), tuple(names))


def _read_label(handle: BinaryIO, name: str, member: Member) -> int | str | None:
    """The class index or class name a .cls or .json member holds, or None where it does not parse (a damaged
    file raises)."""
    try:
        return _label_value(name, read_member(handle, member))
    except TarFormatError:  # a ValueError too: damage ends the scan, a bad label only skips the sample
        raise
    except (ValueError, UnicodeDecodeError):
        return None


def scan_shard(path: Path) -> tuple[int, int, str]:
    """(samples, largest label, damage or "") of the shard at `path` (cached while its size and mtime hold)."""
    found = _scanned(path)
    return found.count, found.top, found.problem


def _scanned(path: Path) -> ShardScan:
    stat = path.stat()
    return _scan(str(path), (stat.st_size, stat.st_mtime_ns))


def top_label(units: list[Unit]) -> tuple[int, str]:
    """(the largest label in these shards, "SHARD:KEY" of the first sample holding it), or (-1, "")."""
    found = []
    for path in dict.fromkeys(unit.path for unit in units):
        scan = _scanned(Path(path))
        if scan.top >= 0:
            found.append((scan.top, f"{path}:{scan.top_key}"))
    return max(found, key=lambda item: item[0], default=(-1, ""))


def name_label(units: list[Unit], known: Container[str] = ()) -> tuple[str, str]:
    """(the first class name that labels of these shards hold and `known` lacks, "SHARD:KEY" of the first sample
    holding it), or ("", "")."""
    for path in dict.fromkeys(unit.path for unit in units):
        for name in _scanned(Path(path)).names:
            if name not in known:
                return name, f"{path}:{_holder(path, name)}"
    return "", ""


def _holder(path: str, name: str) -> str:
    """The key of the first sample of a shard whose label is the class name `name` (read again: a scan keeps the
    names alone, not a key each)."""
    with open(path, "rb") as handle:
        try:
            for key, members in _groups(handle):
                label = label_member(members)
                if label is not None and _read_label(handle, *label) == name:
                    return key
        except TarFormatError:
            pass
    return "?"


class _Labels(NamedTuple):
    codes: array  # a sample's class index, -1 where it has none readable, -2 - j where it is names[j]
    names: tuple[str, ...]  # the class names labels hold instead of an index


@functools.lru_cache(maxsize=1024)
def _labels(path: str, stamp: tuple[int, int]) -> _Labels:
    """The label of every sample of a shard in order (.cls before .json, as the reader); the samples before any
    damage only (`_scan` names the damage).  8 bytes a sample in the cache."""
    labels, names = array("q"), {}
    with open(path, "rb") as handle:
        try:
            for _, members in _groups(handle):
                label = label_member(members)
                value = _read_label(handle, *label) if label is not None and label[1].size <= MAX_LABEL_BYTES else None
                if isinstance(value, str):
                    value = -2 - names.setdefault(sys.intern(value), len(names))
                labels.append(-1 if value is None else value)
        except TarFormatError:
            pass
    return _Labels(labels, tuple(names))


def shard_labels(path: Path, classes: Mapping[str, int] | None = None) -> array:
    """The class index of every sample of the shard at `path` (-1: none readable), a class name read through
    `classes` (-1 where it names none); reads label members only (do not modify the array: it is cached while
    the shard's size and mtime hold)."""
    stat = path.stat()
    codes, names = _labels(str(path), (stat.st_size, stat.st_mtime_ns))
    if not names:
        return codes
    index = [(classes or {}).get(name, -1) for name in names]
    return array("q", (code if code >= -1 else index[-2 - code] for code in codes))


def class_names_by_scan(units: list[Unit]) -> list[str]:
    """Class names "0" .. "K-1" from the largest label in the shards (no index to name them): pass every
    split's units, so a test label above the training split's largest still names a class.  Class ids no
    sample holds are a warning (once): a stray label would otherwise silently widen the model; where they are
    most of the ids, an error."""
    top, holder = top_label(units)
    present = 0
    for path in dict.fromkeys(unit.path for unit in units):
        present |= int.from_bytes(_scanned(Path(path)).present, "little")
    missing = top + 1 - present.bit_count()
    if missing > 0:
        bits = f"{present:b}"[::-1].ljust(top + 1, "0")  # bit i is class id i: one linear pass, not a shift an id
        absent = list(itertools.islice((str(i) for i, bit in enumerate(bits) if bit == "0"), 5))
        said = (
            f"{missing} of the {top + 1} class ids 0..{top} have no image in the shards (e.g. "
            f"{', '.join(absent)}): the labels are class indices and no {CLASS_FILE} or dataset.json names "
            f"the classes, so the model would get {top + 1} outputs; the largest label, {top}, is {holder}'s. "
            f"If it is a stray label, fix that sample; else put a {CLASS_FILE} beside the shards"
        )
        if mostly_empty(present.bit_count(), top + 1):  # one stray label would make a model (and its evaluation's
            raise DataFormatError(said)  # K x K confusion matrix) of up to a million classes
        _name_once(f"{holder}#class-ids", said, every_process=True)
    return [str(i) for i in range(top + 1)]


def damage(units: list[Unit]) -> list[str]:
    """What the scans of these shards found damaged ("" entries left out): the reason a split came up short."""
    return [problem for unit in units if (problem := scan_shard(Path(unit.path))[2])]
