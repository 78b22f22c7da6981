"""Batches for training and evaluation, built on vitkit.data.sources and transforms.

The order of training samples is one deterministic stream: the concatenation of per-epoch random
permutations (each seeded by (seed, epoch)).  Optimiser step t consumes stream positions
[t*B, (t+1)*B) for a global batch B; process r of W takes the r-th contiguous slice of B/W, cut
into micro-batches for gradient accumulation.  So the data position is a function of the step
alone (resuming restores it exactly), every process agrees on the order without communicating
(the DistributedSampler idea for in-memory data), and W processes x B/W see exactly the samples
one process sees with B.  The stream has no epoch boundaries to drop or pad.

In-memory sets (`DeviceImages`) are moved to the training device once as uint8 and indexed there;
file-based sets (`FileBatches`) are decoded by DataLoader workers into pinned uint8 batches that
are copied with `non_blocking=True`.  Streamed sets (tar shards, Parquet) have their own order and
`TrainBatches`: vitkit.data.stream.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from vitkit.data import stream as streams
from vitkit.data.sources import BadImageError, ImageSet
from vitkit.data.workers import batch_bytes, shared_in_worker, started, worker_options

log = logging.getLogger(__name__)


class IndexStream:
    """Sample indices of a never-ending sequence of epochs, each a fresh permutation of range(n)."""

    def __init__(self, num_samples: int, seed: int):
        if num_samples < 1:
            raise ValueError("the training split is empty")
        self.num_samples, self.seed = num_samples, seed
        self._cached: tuple[int, Tensor] | None = None

    def permutation(self, epoch: int) -> Tensor:
        if self._cached is None or self._cached[0] != epoch:
            generator = torch.Generator().manual_seed(streams.order_seed(self.seed, epoch))
            self._cached = (epoch, torch.randperm(self.num_samples, generator=generator))
        return self._cached[1]

    def take(self, start: int, stop: int) -> Tensor:
        """Indices at stream positions [start, stop)."""
        parts, position = [], start
        while position < stop:
            epoch, offset = divmod(position, self.num_samples)
            count = min(stop - position, self.num_samples - offset)
            parts.append(self.permutation(epoch)[offset : offset + count])
            position += count
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)


def micro_batches(
    stream: IndexStream, step: int, global_batch: int, rank: int, world: int, micro_batch: int
) -> list[Tensor]:
    """Index tensors of this process's micro-batches for optimiser step `step`."""
    if global_batch % world:
        raise ValueError(f"global batch {global_batch} is not divisible by {world} processes")
    local = global_batch // world
    if local % micro_batch:
        raise ValueError(f"per-process batch {local} is not a multiple of the micro-batch {micro_batch}")
    start = step * global_batch + rank * local
    indices = stream.take(start, start + local)
    return list(indices.split(micro_batch))


class DeviceImages:
    """An in-memory set kept on the training device as uint8, indexed by batch."""

    def __init__(self, data: ImageSet, device: torch.device):
        if data.images is None:
            raise ValueError("DeviceImages needs an in-memory ImageSet")
        self.images = data.images.to(device)
        self.labels = data.labels.to(device)
        self.device = device

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, index: Tensor) -> tuple[Tensor, Tensor]:
        index = index.to(self.device)
        return self.images[index], self.labels[index]


NAMED_SKIPS = 10  # unreadable images a loader (each worker) names, each once; the rest are counted only


class _Files(Dataset):
    """Decodes one file per item; a corrupt file yields None (counted) unless `strict`, and is named with its
    reason the first time (not again each epoch), for the first NAMED_SKIPS."""

    def __init__(self, data: ImageSet, strict: bool):
        self.data, self.strict, self.named = data, strict, set()

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[Tensor, int] | None:
        try:
            return self.data.read(i), int(self.data.labels[i])
        except BadImageError as error:
            if self.strict:
                raise
            if i not in self.named and len(self.named) < NAMED_SKIPS:
                self.named.add(i)
                last = len(self.named) == NAMED_SKIPS
                log.warning("skipping unreadable image %s%s", error, "; more are counted, not named" if last else "")
            return None


def _collate(items: list[tuple[Tensor, int] | None]) -> tuple[Tensor, Tensor, int]:
    good = [item for item in items if item is not None]
    if not good:
        return shared_in_worker((torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.int64), len(items)))
    images = torch.stack([image for image, _ in good])  # (B, C, H, W) uint8
    labels = torch.tensor([label for _, label in good], dtype=torch.int64)
    return shared_in_worker((images, labels, len(items) - len(good)))


class FileBatches:
    """uint8 micro-batches of a file-based set, decoded by DataLoader workers, starting at `step`.

    Yields one list of (images, labels) micro-batches per optimiser step; bad files are dropped from
    their batch and counted in `skipped`.
    """

    def __init__(
        self,
        data: ImageSet,
        stream: IndexStream,
        *,
        start_step: int,
        total_steps: int,
        global_batch: int,
        rank: int,
        world: int,
        micro_batch: int,
        device: torch.device,
        workers: int,
        strict: bool,
    ):
        self.device, self.skipped = device, 0
        self.accum = global_batch // world // micro_batch
        order = (
            idx.tolist()
            for step in range(start_step, total_steps)
            for idx in micro_batches(stream, step, global_batch, rank, world, micro_batch)
        )
        self.loader = DataLoader(
            _Files(data, strict),
            batch_sampler=order,
            collate_fn=_collate,
            pin_memory=device.type == "cuda",
            persistent_workers=False,
            **worker_options(workers, each=batch_bytes(data, micro_batch), prefetch=4),
        )

    def __iter__(self) -> Iterator[list[tuple[Tensor, Tensor]]]:
        step: list[tuple[Tensor, Tensor]] = []
        for images, labels, bad in started(self.loader):
            self.skipped += bad
            step.append((images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)))
            if len(step) == self.accum:
                yield step
                step = []


def eval_batches(
    data: ImageSet | streams.ShardSet,
    batch_size: int,
    device: torch.device,
    *,
    rank: int = 0,
    world: int = 1,
    workers: int = 0,
    strict: bool = False,
) -> Iterator[tuple[Tensor, Tensor]]:
    """This process's share (a strided 1/world of the samples) of `data` in fixed-order uint8 batches."""
    if isinstance(data, streams.ShardSet):
        yield from streams.eval_batches(
            data, batch_size, device, rank=rank, world=world, workers=workers, strict=strict
        )
        return
    mine = torch.arange(rank, len(data), world)
    if data.images is not None:
        images, labels = data.images, data.labels
        for index in mine.split(batch_size):
            yield images[index].to(device, non_blocking=True), labels[index].to(device, non_blocking=True)
        return
    loader = DataLoader(
        _Files(data, strict),
        batch_sampler=[i.tolist() for i in mine.split(batch_size)],
        collate_fn=_collate,
        pin_memory=device.type == "cuda",
        **worker_options(workers, each=batch_bytes(data, batch_size)),
    )
    for images, labels, _ in started(loader):
        if len(labels):
            yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
