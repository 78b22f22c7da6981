"""Fixed class-stratified hold-outs: the test split of a source that has none, for every kind of source.

A source without a test split of its own (digits, an `images, labels` npz, a folder without DIR/test or
DIR/val, tar shards with only train-* shards) holds out FIXED_TEST_FRACTION of every class, at most
FIXED_TEST_MAX images in all, drawn by FIXED_TEST_SEED: the same images on every call, process and
DataLoader worker, and never in the training split.  `stratified_split` draws it from the labels; for tar
shards the labels come from a scan of the label members (no image is decoded), and `PickedReader` reads
only one side of the draw from each shard, so a streamed split and the in-memory one hold the same samples.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from vitkit.data.imageset import ImageSet
from vitkit.data.stream import Reader, Sample, ShardSet, Unit

FIXED_TEST_SEED = 0  # seed of the fixed test hold-out
FIXED_TEST_FRACTION = 0.2
FIXED_TEST_MAX = 10_000  # a large source without a test part holds out at most this many images
WHOLE_UNIT_TOLERANCE = 0.2  # a val hold-out of whole shards is used where it holds the asked share within 20% of it


def fixed_test_fraction(count: int) -> float:
    """The share of a source of `count` images held out as its fixed test split (20%, at most 10,000 images)."""
    return min(FIXED_TEST_FRACTION, FIXED_TEST_MAX / max(count, 1))


def stratified_split(labels: torch.Tensor, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(keep, held) sorted indices; `held` has round(fraction * n_c) of each class's n_c samples.

    Each class keeps at least one sample and, when fraction > 0, gives at least one if it has two.
    The choice depends only on (labels, fraction, seed).
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {fraction}")
    labels = torch.as_tensor(labels)
    generator = torch.Generator().manual_seed(seed)
    held = []
    for cls in torch.unique(labels).tolist():
        members = torch.nonzero(labels == cls).flatten()
        count = round(fraction * len(members))
        if fraction > 0 and len(members) > 1:
            count = min(max(count, 1), len(members) - 1)
        held.append(members[torch.randperm(len(members), generator=generator)[:count]])
    mask = torch.zeros(len(labels), dtype=torch.bool)
    mask[torch.cat(held) if held else torch.empty(0, dtype=torch.int64)] = True
    return torch.nonzero(~mask).flatten(), torch.nonzero(mask).flatten()


def fixed_test_split(whole: ImageSet, part: str, where: str) -> ImageSet:
    """The fixed class-stratified test hold-out of a source without a test split (or the rest, for train)."""
    fraction = fixed_test_fraction(len(whole))
    keep, held = stratified_split(whole.labels, fraction, FIXED_TEST_SEED)
    if part == "test":  # of unlabelled images (one class): a plain hold-out
        kind = "class-stratified " if whole.num_classes > 1 else ""
        return replace(whole.subset(held), origin=f"a fixed {fraction:.0%} {kind}hold-out of {where}")
    return replace(whole.subset(keep), origin=f"{where} minus the fixed {fraction:.0%} test hold-out")


@dataclass(frozen=True)
class PickedReader:
    """A reader of some samples of each unit: ordinal j of a unit is the j-th sample on `side` of the draw.

    `held` maps a unit (path, part) to its raw sample count and the sorted raw ordinals held out; side "held"
    reads those, side "kept" the others.  Picklable: DataLoader workers receive the draw, they do not redo it.
    """

    inner: Reader
    held: dict[tuple[str, int], tuple[int, tuple[int, ...]]]
    side: str  # "kept" or "held"

    def ordinals(self, unit: Unit) -> list[int]:
        """The raw ordinals this side reads of `unit`, in order."""
        count, held = self.held[(unit.path, unit.part)]
        if self.side == "held":
            return list(held)
        out = set(held)
        return [i for i in range(count) if i not in out]

    def _whole(self, unit: Unit) -> Unit:
        """`unit` as the inner reader counts it: every sample of both sides."""
        return Unit(unit.path, self.held[(unit.path, unit.part)][0], unit.part)

    def labels(self, units: list[Unit]) -> list[list[int]]:
        """The label of each sample this side reads of each unit (-1 where none is readable)."""
        raw = self.inner.labels([self._whole(unit) for unit in units])
        return [[labels[i] for i in self.ordinals(unit)] for unit, labels in zip(units, raw)]

    def samples(self, unit: Unit, start: int = 0, wanted: frozenset[int] | None = None) -> Iterator[tuple[int, Sample]]:
        """(ordinal, sample) for ordinals start .. unit.count-1 of this side (those in `wanted`, when given)."""
        raw = self.ordinals(unit)
        picked = [j for j in range(start, len(raw)) if wanted is None or j in wanted]
        if not picked:
            return
        back = {raw[j]: j for j in picked}
        for ordinal, sample in self.inner.samples(self._whole(unit), start=raw[picked[0]], wanted=frozenset(back)):
            yield back[ordinal], sample


def hold_out_shards(data: ShardSet, labels: list[list[int]], part: str, where: str) -> ShardSet:
    """The train ("kept") or test ("held") side of the fixed test hold-out of a streamed split.

    `labels[k]` holds the class index of every sample of `data.units[k]` (-1 where unreadable: such samples
    stay on the train side, where they are skipped as corrupt).  The draw is `stratified_split` over the
    readable labels, as for a folder.
    """
    fraction = fixed_test_fraction(sum(label >= 0 for unit_labels in labels for label in unit_labels))
    side = "held" if part == "test" else "kept"
    origin = (
        f"a fixed {fraction:.0%} class-stratified hold-out of {where}"
        if side == "held"
        else f"{where} minus the fixed {fraction:.0%} test hold-out"
    )
    return replace(_pick(data, labels, fraction, FIXED_TEST_SEED, side), origin=origin)


def hold_out_val(data: ShardSet, fraction: float, seed: int, part: str) -> tuple[ShardSet, str]:
    """The train or val side of a `fraction` validation hold-out of a streamed split, and how it was drawn.

    Whole units (shards, row groups), chosen by `seed`, where such a draw holds the asked share within
    WHOLE_UNIT_TOLERANCE of it: a validation pass then reads its own units alone.  Otherwise (a few large
    units: one shard of two would be half the data) a class-stratified draw of samples by `seed`, as a
    folder's, from the units' labels; a validation pass then reads every unit and decodes its own samples.
    """
    if len(data.units) > 1:
        kept, held = data.hold_out(fraction, seed)
        if abs(len(held) / max(len(data), 1) - fraction) <= WHOLE_UNIT_TOLERANCE * fraction:
            return (held if part == "val" else kept), "whole-shard"
    side = "held" if part == "val" else "kept"
    return _pick(data, data.reader.labels(data.units), fraction, seed, side), "class-stratified"


def _pick(data: ShardSet, labels: list[list[int]], fraction: float, seed: int, side: str) -> ShardSet:
    """One side ("kept" or "held") of a class-stratified draw of `fraction` of the samples with a readable
    label (`labels[k]`: those of `data.units[k]`, -1 unreadable, always kept)."""
    flat = [(k, i, label) for k, unit_labels in enumerate(labels) for i, label in enumerate(unit_labels) if label >= 0]
    if flat:
        held_index = stratified_split(torch.tensor([label for _, _, label in flat]), fraction, seed)[1]
    else:
        held_index = torch.empty(0, dtype=torch.int64)
    held: dict[int, list[int]] = {}
    for index in held_index.tolist():
        held.setdefault(flat[index][0], []).append(flat[index][1])
    table = {(u.path, u.part): (u.count, tuple(sorted(held.get(k, [])))) for k, u in enumerate(data.units)}
    units = []
    for unit in data.units:
        out = len(table[(unit.path, unit.part)][1])
        size = out if side == "held" else unit.count - out
        if size:
            units.append(Unit(unit.path, size, unit.part))
    return replace(data, units=units, reader=PickedReader(data.reader, table, side))
