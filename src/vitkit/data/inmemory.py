"""Small splits decoded into memory up front, and the one error for a split left with no usable sample.

A corrupt sample or file is skipped and counted, and named in the log (the first few one by one);
a split in which nothing is left is an `EmptySplitError` that says how many samples were skipped and
why, naming the files, instead of a run that trains on nothing.
"""

from __future__ import annotations

import logging

import torch

from vitkit.data.images import MAX_PIXELS, BadImageError, decode_files
from vitkit.data.imageset import MAX_FILES_IN_MEMORY, EmptySplitError, ImageSet, fits_in_memory
from vitkit.data.shardset import Sample, decode_sample, name_once
from vitkit.data.stream import ShardSet, read_all, sample_problem
from vitkit.data.tarsamples import loading

log = logging.getLogger(__name__)

MAX_LOGGED = 10  # corrupt samples named one by one in the log; the rest are counted
SHOWN = 3  # problems quoted in an EmptySplitError


def _sample_sources(subset: ShardSet, strict: bool) -> tuple[list[bytes], torch.Tensor, list[str], list[str]]:
    """(encoded images, labels, names) of a streamed split's usable samples, and each unusable one's problem
    (`strict`: the first is a BadImageError)."""
    with loading():  # every process reads every shard: the main process names what is damaged
        samples = read_all(subset)
    problems = [sample_problem(sample, subset.num_classes) for sample in samples]
    kept = [i for i, problem in enumerate(problems) if not problem]
    reasons = [f"{samples[i].key}: {problem}" for i, problem in enumerate(problems) if problem]
    if strict and reasons:
        raise BadImageError(f"sample {reasons[0]}")
    for reason in reasons[:MAX_LOGGED]:
        log.warning("skipping corrupt sample %s", reason)
    if len(reasons) > MAX_LOGGED:
        log.warning("skipped %d corrupt samples of %d in all", len(reasons), len(samples))
    labels = torch.tensor([samples[i].label for i in kept], dtype=torch.int64)
    return [samples[i].image for i in kept], labels, [samples[i].key for i in kept], reasons


class _Names:
    """What each sample of an ImageSet is called in messages (its file, or its row), read when asked."""

    def __init__(self, subset: ImageSet) -> None:
        self.subset = subset

    def __len__(self) -> int:
        return len(self.subset)

    def __getitem__(self, i: int) -> str:
        return self.subset.name(i)


def materialise(
    subset: ImageSet | ShardSet,
    *,
    strict: bool,
    max_in_memory_bytes: int,
    num_workers: int | None,
    max_pixels: int = MAX_PIXELS,
) -> tuple[ImageSet | ShardSet, list[str]]:
    """(the set, decoded into memory when it is small (imageset.fits_in_memory), and the problem of each sample
    left out, naming its file); larger sets come back as they are, their bad samples surface while reading."""
    if subset.images is not None:
        return subset, []
    size, channels = subset.load_size, subset.channels
    if not fits_in_memory(len(subset), channels, size, max_in_memory_bytes):
        if max_in_memory_bytes <= 0:  # read from files on purpose (vitkit shard): no limit was passed
            return subset, []
        log.info(
            "%d images: %s, so %s",
            len(subset),
            f"more than {MAX_FILES_IN_MEMORY:,} images"
            if len(subset) > MAX_FILES_IN_MEMORY
            else f"more than data.max_in_memory_mb ({max_in_memory_bytes / 2**20:g} MB) holds decoded at {size}x{size}",
            "streamed from shards" if subset.access == "stream" else "decoded on the fly",
        )
        return subset, []
    if isinstance(subset, ShardSet):
        sources, labels, names, reasons = _sample_sources(subset, strict)
    else:
        sources, labels, names, reasons = subset.files, subset.labels, _Names(subset), []
    images, good, errors = decode_files(
        sources, channels, size, strict=strict, num_workers=num_workers, max_pixels=max_pixels, names=names
    )
    return ImageSet(
        images=images,
        labels=labels[good],
        class_names=subset.class_names,
        load_size=size,
        skipped=(len(sources) + len(reasons) if isinstance(subset, ShardSet) else len(subset)) - len(good),
        channels=channels,
        origin=subset.origin,
        names=[str(names[i]) for i in good],
    ), reasons + errors


def drawn_sample(data: ImageSet | ShardSet, count: int, seed: int = 0) -> ImageSet:
    """`count` samples drawn by `seed` (all where there are no more), in their order in the split: the same ones
    whether `data` is in memory, read from files (`ImageSet.fixed_sample`) or streamed (`samples_at`), where every
    sample decodes (a split decoded into memory has left out those that do not, which moves the positions after
    them)."""
    if not isinstance(data, ShardSet):
        return data.fixed_sample(count, seed)
    drawn = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))[:count].sort().values
    return samples_at(data, drawn.tolist())[0]


def samples_at(data: ShardSet, positions: list[int]) -> tuple[ImageSet, list[int]]:
    """(the samples of a streamed split at sorted `positions` decoded into memory, the positions that did not
    decode): only the shards holding one are read, and a corrupt sample is skipped, counted and named."""
    images, labels, names, bad = [], [], [], []
    for position, sample in _read_at(data, positions):
        image = "not in its shard" if sample.absent else decode_sample(sample, data)
        if isinstance(image, str):
            name_once(sample.key, image)
            bad.append(position)
            continue
        images.append(image)
        labels.append(sample.label)
        names.append(sample.key)
    side = data.load_size or 0
    stacked = torch.stack(images) if images else torch.empty(0, data.channels, side, side, dtype=torch.uint8)
    kept = ImageSet(
        images=stacked,
        labels=torch.tensor(labels, dtype=torch.int64),
        class_names=data.class_names,
        load_size=data.load_size,
        skipped=len(bad),
        channels=data.channels,
        origin=data.origin,
        names=names,
    )
    return kept, bad


def _read_at(data: ShardSet, positions: list[int]) -> list[tuple[int, Sample]]:
    """(position, sample) of a streamed split at sorted `positions`, reading each unit that holds one once."""
    found, start, index = [], 0, 0
    for unit in data.units:
        wanted = []
        while index < len(positions) and positions[index] < start + unit.count:
            wanted.append(positions[index] - start)
            index += 1
        if wanted:
            found += [(start + o, sample) for o, sample in data.reader.samples(unit, wanted[0], frozenset(wanted))]
        start += unit.count
    return found


def check_usable(result: ImageSet | ShardSet, uri: str, split: str, reasons: list[str], damage: list[str]) -> None:
    """Raise EmptySplitError when `result` holds no sample, saying how many were skipped and why."""
    if len(result):
        return
    skipped = getattr(result, "skipped", 0)
    parts = [f"{uri} {split} split has no usable sample: {skipped:,} skipped as corrupt"]
    if damage:
        parts.append(f"{len(damage)} shard(s) damaged: " + "; ".join(damage[:SHOWN]))
    if reasons:
        parts.append("first problems: " + "; ".join(reasons[:SHOWN]))
    if not damage and not reasons:
        parts.append("the source lists no sample for it")
    raise EmptySplitError(", ".join(parts[:1]) + (" (" + "; ".join(parts[1:]) + ")" if parts[1:] else ""))
