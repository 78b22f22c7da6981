"""A streamed split (tar shards, Parquet row groups) as data: its units, their samples, and how a sample
is checked and decoded.  How the units are ordered and read by processes and workers is vitkit.data.stream's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import ClassVar, NamedTuple, Protocol

import torch
from torch import Tensor

from vitkit.data.images import MAX_PIXELS, BadImageError, decode_image

log = logging.getLogger("vitkit.data.stream")  # the stream's messages, wherever they are said

MAX_NAMED = 10_000  # corrupt samples named in this process's log, each once; beyond that only counted
_named: set[str] = set()


@dataclass(frozen=True)
class Unit:
    """A tar shard (part -1) or one row group `part` of a Parquet file, holding `count` samples."""

    path: str
    count: int
    part: int = -1


class Sample(NamedTuple):
    """One sample as stored: encoded image bytes (or a file path) and class index, or what is wrong with it."""

    key: str
    image: bytes | str | None
    label: int | None
    problem: str = ""  # non-empty: corrupt (skipped and counted)
    absent: bool = False  # an ordinal the index counts but a whole shard does not hold: dropped, not counted


class Reader(Protocol):
    def samples(self, unit: Unit, start: int = 0, wanted: frozenset[int] | None = None) -> Iterator[tuple[int, Sample]]:
        """(ordinal, sample) for ordinals start .. unit.count - 1 (only those in `wanted`, when given)."""
        ...

    def labels(self, units: list[Unit]) -> list[list[int]]:
        """The class index of each sample of each unit, -1 where none is readable (label members or the label
        column alone are read: what a class-stratified hold-out is drawn from)."""
        ...


@dataclass
class ShardSet:
    """One split of a streamed source: its units, read in order by `reader` (picklable)."""

    units: list[Unit]
    reader: Reader
    class_names: list[str]
    load_size: int | None  # side images are decoded to (shorter side resized, centre-cropped)
    channels: int = 3
    skipped: int = 0
    max_pixels: int = MAX_PIXELS
    origin: str = ""  # where this split came from (shards of a directory, a hold-out), for the plan
    problems: list[str] = field(default_factory=list)  # damage found while counting the units (shard scans)
    images: ClassVar[None] = None  # an ImageSet-like split that is neither in memory ...
    files: ClassVar[None] = None  # ... nor a list of files
    access: ClassVar[str] = "stream"  # how training reads it: see vitkit.data.sources.ImageSet.access

    def __len__(self) -> int:
        return sum(unit.count for unit in self.units)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def labels(self) -> Tensor:
        raise ValueError(
            "a streamed split (tar shards, Parquet) has no label index in memory; this use needs a "
            "random-access source (folder:, hf: Arrow) or a split small enough to be decoded "
            "(data.max_in_memory_mb)"
        )

    def hold_out(self, fraction: float, seed: int) -> tuple[ShardSet, ShardSet]:
        """(kept, held): round(fraction x units) whole units held out, at least one and never all (a split of two
        units or more: vitkit.data.holdout.hold_out_val draws samples otherwise), chosen by `seed`."""
        count = len(self.units)
        held_count = min(max(round(fraction * count), 1), count - 1)
        order = torch.randperm(count, generator=torch.Generator().manual_seed(seed)).tolist()
        held, kept = sorted(order[:held_count]), sorted(order[held_count:])
        return replace(self, units=[self.units[i] for i in kept]), replace(self, units=[self.units[i] for i in held])


def sample_problem(sample: Sample, num_classes: int) -> str:
    """What makes `sample` unusable before decoding ("" when nothing does): its own problem, or its label."""
    if sample.problem:
        return sample.problem
    if not 0 <= sample.label < num_classes:
        return f"label {sample.label} is outside 0..{num_classes - 1}"
    return ""


def name_once(key: str, problem: str) -> None:
    """Log a corrupt sample the first time this process meets it (a stream reads it again every epoch)."""
    if key not in _named and len(_named) < MAX_NAMED:
        _named.add(key)
        log.warning("skipping corrupt sample %s", problem if problem.startswith(f"{key}: ") else f"{key}: {problem}")


def decode_samples(samples: list[Sample], data: ShardSet, strict: bool) -> tuple[Tensor, Tensor, int]:
    """uint8 (B, C, S, S) images and int64 (B,) labels of the good samples, and how many were bad (absent
    samples are neither)."""
    images, labels = [], []
    samples = [sample for sample in samples if not sample.absent]
    for sample in samples:
        image = decode_sample(sample, data)
        if not isinstance(image, str):
            images.append(image)
            labels.append(sample.label)
            continue
        if strict:  # the decoder's message names the sample already
            raise BadImageError(f"sample {image if image.startswith(f'{sample.key}: ') else f'{sample.key}: {image}'}")
        name_once(sample.key, image)
    side = data.load_size or 0
    stacked = torch.stack(images) if images else torch.empty(0, data.channels, side, side, dtype=torch.uint8)
    return stacked, torch.tensor(labels, dtype=torch.int64), len(samples) - len(images)


def decode_sample(sample: Sample, data: ShardSet) -> Tensor | str:
    """A sample's image as `data` reads it, uint8 (C, S, S), or what makes it unusable."""
    problem = sample_problem(sample, data.num_classes)
    if problem:
        return problem
    try:
        return decode_image(
            sample.image, data.channels, size=data.load_size, max_pixels=data.max_pixels, name=sample.key
        )
    except BadImageError as error:
        return str(error)


def label_index(data: ShardSet) -> Tensor:
    """The class index of every sample of the split in unit order, -1 where none is readable: only the label
    members (or column) are read, so a split of any size fits (what few-shot draws its shots by)."""
    return torch.tensor([label for labels in data.reader.labels(data.units) for label in labels], dtype=torch.int64)


def read_all(data: ShardSet) -> list[Sample]:
    """Every sample of the split in unit order (for small splits that are decoded into memory), absent ones
    (counted by an index out of date) left out."""
    return [sample for unit in data.units for _, sample in data.reader.samples(unit) if not sample.absent]
