"""Streamed splits (tar shards, Parquet row groups) read by every process and worker, resumable exactly.

A *unit* is what is read front to back: a tar shard or a Parquet row group, with its sample count
(from the index or the metadata).  A *lane* is one sequential reader: DataLoader worker slot l of
process r is lane g = r * N + l, with N = max(1, data.workers) lanes per process and L = W * N in all.
The split, its units and their samples are data/shardset.py's `ShardSet`, `Unit` and `Sample`.

Order.  Epoch e permutes the units by (seed, e); the epochs one after another form an endless unit
sequence U, and lane g reads U[g], U[g + L], U[g + 2L], ...  Within an epoch the lanes read disjoint
units whose union is the split, and no lane ever runs dry, whatever the unit counts: with uneven
splits the lanes drift across epoch boundaries at slightly different rates instead of any process
waiting for the others.  A lane takes its units R = ceil(units / L) at a time (a *round*, about one
epoch's share) and shuffles each round's samples within a window: sample i of the round is emitted in
the order of i + window * u_i (u_i uniform, seeded by (seed, lane, round)), so a sample moves at most
`window` places and a lane holds at most about 2 x window encoded samples.

Position.  A micro-batch is `micro` consecutive samples of one lane (corrupt ones are dropped after
reading, so they do not shift the rest); the DataLoader takes micro-batches from its workers in turn,
so after M micro-batches lane l has emitted ceil((M - l) / N) of them.  The position is therefore a
function of the step, as for in-memory data (vitkit.data.loader), and every process restores its own
from the step that rank 0 saved.  On resume worker w plays lane (M + w) mod N (the DataLoader starts
at worker 0) and skips to its position: the round's order is recomputed from the counts, the samples
still waiting in the window are read again, and everything else skipped costs a header read and a seek.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from vitkit.data.imageset import EmptySplitError
from vitkit.data.shardset import (  # noqa: F401 (read_all, sample_problem re-exported)
    Reader,
    Sample,
    ShardSet,
    Unit,
    decode_samples,
    read_all,
    sample_problem,
)
from vitkit.data.workers import batch_bytes, shared_in_worker, started, worker_options

WINDOW = 1000  # shuffle window per lane, in samples (webdataset's customary buffer size)
STATE_KIND = "vitkit-shard-stream/1"


@runtime_checkable
class TrainBatches(Protocol):
    """What the trainer iterates: one item per optimiser step, and the data position for checkpoints."""

    skipped: int  # corrupt samples skipped so far by this process (since this object was made)

    def __iter__(self) -> Iterator[list[tuple[Tensor, Tensor]]]:
        """This process's micro-batches of each step: (uint8 (B, C, H, W), int64 (B,)) on the device."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The position after the last step handed out (ints/strs only: torch.load(weights_only=True) reads it)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state` (called before __iter__ when resuming)."""
        ...


# ------------------------------------------------------------------------------ the order of a lane
ORDER_FACTORS = (1_000_003, 1_000_033)  # primes that fold (seed, epoch or lane, round) into one seed


def order_seed(seed: int, *words: int) -> int:
    """The seed of the data order at `words` of the run seeded `seed`: (seed, epoch) for an epoch's permutation,
    (seed, lane, round) for a shard lane's shuffle window, within torch's 64 bits.  The one rule of every
    data-order stream."""
    folded = seed
    for word, factor in zip(words, ORDER_FACTORS, strict=False):
        folded = folded * factor + word
    return folded % 2**64


class _UnitSequence:
    """U: epoch e (positions e*n .. e*n+n-1) is a permutation of range(n) seeded by (seed, e)."""

    def __init__(self, count: int, seed: int):
        self.count, self.seed, self._cached = count, seed, (-1, torch.empty(0, dtype=torch.int64))

    def __getitem__(self, position: int) -> int:
        epoch, offset = divmod(position, self.count)
        if self._cached[0] != epoch:
            generator = torch.Generator().manual_seed(order_seed(self.seed, epoch))
            self._cached = (epoch, torch.randperm(self.count, generator=generator))
        return int(self._cached[1][offset])


def round_order(size: int, window: int, seed: int, lane: int, round_: int) -> list[int]:
    """Input positions of a round in emission order: sorted by i + window * u_i (a windowed shuffle)."""
    generator = torch.Generator().manual_seed(order_seed(seed, lane, round_))
    keys = torch.arange(size, dtype=torch.float64) + window * torch.rand(size, dtype=torch.float64, generator=generator)
    return torch.argsort(keys, stable=True).tolist()


def lane_samples(data: ShardSet, seed: int, lane: int, lanes: int, window: int, start: int) -> Iterator[Sample]:
    """The endless sample sequence of `lane` (of `lanes`), from its `start`-th sample."""
    if len(data) == 0:
        raise ValueError("the streamed split holds no samples")
    sequence = _UnitSequence(len(data.units), seed)
    per_round = math.ceil(len(data.units) / lanes)
    round_, skip = 0, start
    while True:
        units = [data.units[sequence[lane + (round_ * per_round + k) * lanes]] for k in range(per_round)]
        size = sum(unit.count for unit in units)
        if skip < size:  # rounds before the start are passed over by their counts alone
            yield from _round(data.reader, units, round_order(size, window, seed, lane, round_), skip)
            skip = 0
        else:
            skip -= size
        round_ += 1


def _round(reader: Reader, units: list[Unit], order: list[int], skip: int) -> Iterator[Sample]:
    """The round's samples in `order`, from emission `skip` on; reads each unit front to back once."""
    starts = [0]
    for unit in units:
        starts.append(starts[-1] + unit.count)
    pending: dict[int, Sample] = {}
    read_to = 0
    if skip:  # what the uninterrupted reader would hold now: read up to the furthest emitted input
        read_to = max(order[:skip]) + 1
        emitted = set(order[:skip])
        pending = _fetch(reader, units, starts, [i for i in range(read_to) if i not in emitted])
    source = _sequential(reader, units, starts, read_to)
    for position in order[skip:]:
        while position not in pending:
            index, sample = next(source)
            pending[index] = sample
        yield pending.pop(position)


def _locate(starts: list[int], index: int) -> tuple[int, int]:
    """Round input `index` -> (unit k, ordinal within it)."""
    unit = next(k for k in range(len(starts) - 1) if starts[k] <= index < starts[k + 1])
    return unit, index - starts[unit]


def _sequential(reader: Reader, units: list[Unit], starts: list[int], begin: int) -> Iterator[tuple[int, Sample]]:
    if begin >= starts[-1]:
        return
    first, ordinal = _locate(starts, begin)
    for k in range(first, len(units)):
        for index, sample in reader.samples(units[k], start=ordinal if k == first else 0):
            yield starts[k] + index, sample


def _fetch(reader: Reader, units: list[Unit], starts: list[int], indices: list[int]) -> dict[int, Sample]:
    wanted: dict[int, set[int]] = {}
    for index in indices:
        unit, ordinal = _locate(starts, index)
        wanted.setdefault(unit, set()).add(ordinal)
    found = {}
    for unit, ordinals in wanted.items():
        for ordinal, sample in reader.samples(units[unit], start=min(ordinals), wanted=frozenset(ordinals)):
            found[starts[unit] + ordinal] = sample
    return found


# ------------------------------------------------------------------------------ training batches
class _LaneBatches(IterableDataset):
    """Decoded micro-batches of this worker's lane, endlessly (DataLoader worker w plays lane (M + w) mod N)."""

    def __init__(
        self,
        data: ShardSet,
        *,
        seed: int,
        rank: int,
        world: int,
        lanes: int,
        window: int,
        micro: int,
        start: int,
        strict: bool,
    ):
        self.data, self.seed, self.rank, self.world, self.lanes = data, seed, rank, world, lanes
        self.window, self.micro, self.start, self.strict = window, micro, start, strict

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor, int]]:
        worker = get_worker_info()
        logical = (self.start + (worker.id if worker else 0)) % self.lanes
        done = max(0, -(-(self.start - logical) // self.lanes))  # micro-batches this lane gave before `start`
        samples = lane_samples(
            self.data,
            self.seed,
            self.rank * self.lanes + logical,
            self.world * self.lanes,
            self.window,
            done * self.micro,
        )
        while True:
            yield decode_samples([next(samples) for _ in range(self.micro)], self.data, self.strict)


class ShardBatches:
    """TrainBatches over a ShardSet: this process's lanes, decoded by DataLoader workers (see the module doc)."""

    def __init__(
        self,
        data: ShardSet,
        *,
        seed: int,
        global_batch: int,
        rank: int,
        world: int,
        micro_batch: int,
        device: torch.device,
        workers: int,
        strict: bool,
        window: int = WINDOW,
        total_steps: int = 0,
    ):
        # total_steps: accepted for the trainer's uniform call; a stream is endless, the trainer stops it
        if global_batch % world or (global_batch // world) % micro_batch:
            raise ValueError(
                f"global batch {global_batch} does not split into {world} processes x micro-batches of {micro_batch}"
            )
        self.data, self.seed, self.rank, self.world, self.micro = data, seed, rank, world, micro_batch
        self.accum = global_batch // world // micro_batch
        self.device, self.workers, self.strict, self.window = device, workers, strict, window
        self.skipped, self._step = 0, 0

    def _layout(self) -> dict[str, Any]:
        return {
            "kind": STATE_KIND,
            "seed": self.seed,
            "processes": self.world,
            "lanes_per_process": max(1, self.workers),
            "micro_batch": self.micro,
            "micro_batches_per_step": self.accum,
            "window": self.window,
            "units": len(self.data.units),
            "samples": len(self.data),
        }

    @property
    def path(self) -> str:
        """How the data arrives, for the plan."""
        return (
            f"streamed from {len(self.data.units)} shard(s) by {self.world} process(es) x "
            f"{max(1, self.workers)} DataLoader lane(s), shuffled within {self.window} samples"
        )

    def state_dict(self) -> dict[str, Any]:
        return {**self._layout(), "step": self._step}

    def _nothing_usable(self, run: int) -> str:
        damage = "; ".join(self.data.problems[:3])
        return (
            f"the training split ({self.data.origin or 'streamed'}, {len(self.data):,} samples) has no usable "
            f"sample: the last {run:,} read were all skipped as corrupt (each is named in the log)"
            + (f"; {damage}" if damage else "")
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "kind" not in state:  # a checkpoint that kept only the step (written before the stream's state)
            self._step = int(state["step"])
            return
        ours = self._layout()
        changed = [f"{key} {state.get(key)!r} -> {value!r}" for key, value in ours.items() if state.get(key) != value]
        if changed:
            raise ValueError(
                "cannot resume the shard stream exactly: its layout changed ("
                + ", ".join(changed)
                + "); resume with the same number of processes, data.workers and shards, or start a "
                "new run from its weights (--set run.init_from=THIS_RUN with another --out)"
            )
        self._step = int(state["step"])

    def __iter__(self) -> Iterator[list[tuple[Tensor, Tensor]]]:
        lanes = max(1, self.workers)
        dataset = _LaneBatches(
            self.data,
            seed=self.seed,
            rank=self.rank,
            world=self.world,
            lanes=lanes,
            window=self.window,
            micro=self.micro,
            start=self._step * self.accum,
            strict=self.strict,
        )
        loader = DataLoader(
            dataset,
            batch_size=None,
            collate_fn=shared_in_worker,
            pin_memory=self.device.type == "cuda",
            **worker_options(self.workers, each=batch_bytes(self.data, self.micro), lanes=True),
        )
        step: list[tuple[Tensor, Tensor]] = []
        run = 0  # corrupt samples read one after another
        for images, labels, bad in started(loader):
            self.skipped += bad
            run = 0 if len(labels) else run + bad
            if run >= len(self.data):
                raise EmptySplitError(self._nothing_usable(run))
            step.append((images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)))
            if len(step) == self.accum:
                self._step += 1  # handed out = consumed: the trainer asks for the next step only after this one
                yield step
                step = []


# ------------------------------------------------------------------------------ evaluation
class _EvalSamples(IterableDataset):
    """Every sample of `units` once, in order, in batches; DataLoader workers split the units."""

    def __init__(self, data: ShardSet, units: list[Unit], batch_size: int, strict: bool):
        self.data, self.units, self.batch_size, self.strict = data, units, batch_size, strict

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor, int]]:
        worker = get_worker_info()
        mine = self.units[worker.id :: worker.num_workers] if worker else self.units
        batch: list[Sample] = []
        for unit in mine:
            for _, sample in self.data.reader.samples(unit):
                batch.append(sample)
                if len(batch) == self.batch_size:
                    yield decode_samples(batch, self.data, self.strict)
                    batch = []
        if batch:
            yield decode_samples(batch, self.data, self.strict)


def eval_batches(
    data: ShardSet,
    batch_size: int,
    device: torch.device,
    *,
    rank: int = 0,
    world: int = 1,
    workers: int = 0,
    strict: bool = False,
) -> Iterator[tuple[Tensor, Tensor]]:
    """This process's share (units rank, rank + W, ...) of a streamed split, every sample once, in batches."""
    units = data.units[rank::world]
    loader = DataLoader(
        _EvalSamples(data, units, batch_size, strict),
        batch_size=None,
        collate_fn=shared_in_worker,
        pin_memory=device.type == "cuda",
        **worker_options(min(workers, len(units)), each=batch_bytes(data, batch_size)),
    )
    for images, labels, _ in started(loader):
        if len(labels):
            yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
