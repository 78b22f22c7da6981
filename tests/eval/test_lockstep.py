"""Where processes agree during an evaluation: a forward that is a collective (FSDP's all-gathers) on two gloo
processes whose shares differ in batches, where every process runs as many forward passes and both get the
one-process figures; and a signal on one process, which ends every process's evaluation at the same batch."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from vitkit.data.sources import ImageSet
from vitkit.eval.evaluator import EvaluationInterrupted, evaluate

LOGITS = torch.tensor([[2.0, 0.0, 1.0], [0.0, 3.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 2.0], [0.0, 1.0, 4.0]])
LABELS = torch.tensor([0, 1, 2, 2, 1])  # 5 images, batches of 2: rank 0 has 3 (two batches), rank 1 has 2 (one)


class Lookup(nn.Module):
    """Fixed logits per image (image i is a 1x2x2 tile of value i); `collective`: each forward all-reduces, as a
    sharded model's all-gathers do, and counts itself."""

    def __init__(self, collective: bool):
        super().__init__()
        self.collective, self.calls = collective, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.collective:
            dist.all_reduce(torch.ones(1))
        self.calls += 1
        index = torch.round((x[:, 0, 0, 0] + 1) * 127.5).long().clamp(max=len(LOGITS) - 1)
        return LOGITS[index]


def _evaluate(model: nn.Module, rank: int = 0, world: int = 1, lockstep: bool = False, interrupted=None, progress=None):
    images = torch.arange(len(LABELS), dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 1, 2, 2).contiguous()
    data = ImageSet(images=images, labels=LABELS, class_names=["a", "b", "c"])
    return evaluate(
        model, data, size=2, mean=(0.5,), std=(0.5,), channels=1, batch_size=2, rank=rank, world=world,
        lockstep=lockstep, interrupted=interrupted, progress=progress,
    )  # fmt: skip


def signal_from_read(first: int):
    """An `interrupted` that reads SIGTERM from its `first`-th reading on (1-based), and counts its readings."""
    reads = []

    def interrupted() -> int:
        reads.append(1)
        return int(signal.SIGTERM) if len(reads) >= first else 0

    return interrupted, reads


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = Lookup(collective=True)
    counts = _evaluate(model, rank, world, lockstep=True)
    result = {"top1": counts.top1, "loss": counts.loss, "count": counts.count, "calls": model.calls}
    Path(out, f"rank{rank}.json").write_text(json.dumps({**result, "confusion": counts.confusion.tolist()}))
    dist.destroy_process_group()


def _signalled_worker(rank: int, world: int, port: int, out: str) -> None:
    """Two evaluations where rank 1 reads a signal from its `first` reading on (2: before the second batch; 3:
    after the last one); rank 0 never does (its share is the larger)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = []
    for first in (2, 3):
        model, (interrupted, _) = Lookup(collective=False), signal_from_read(first if rank else 99)
        try:
            _evaluate(model, rank, world, interrupted=interrupted)
            results.append({"signum": 0, "calls": model.calls})
        except EvaluationInterrupted as stopped:
            results.append({"signum": stopped.signum, "calls": model.calls})
        dist.all_reduce(torch.ones(1))  # the group is still in step after it
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def _run_two(worker, out: Path) -> list:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.start_processes(worker, args=(2, port, str(out)), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 120  # a process left waiting in a collective fails the test here, not hangs it
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise AssertionError("a process waited on a collective its peer never reached")
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_a_signal_ends_the_evaluation_before_its_next_batch_and_leaves_the_mode_as_it_was() -> None:
    model = Lookup(collective=False).train()
    interrupted, reads = signal_from_read(2)
    with pytest.raises(EvaluationInterrupted) as stopped:
        _evaluate(model, interrupted=interrupted)
    assert stopped.value.signum == signal.SIGTERM and len(reads) == 2 and model.calls == 1 and model.training
    interrupted, reads = signal_from_read(99)
    assert _evaluate(model, interrupted=interrupted).count == 5 and len(reads) == 3  # never: three batches


def test_progress_is_told_of_every_batch_before_it_runs() -> None:
    """A training run's stall watch hears of each batch of its final evaluation, whose end all-reduces."""
    model, told = Lookup(collective=False), []
    counts = _evaluate(model, progress=lambda: told.append(model.calls))
    assert counts.count == 5 and told == [0, 1, 2]  # three batches of 2, 2 and 1, each told before its forward


def test_one_process_signal_ends_every_process_evaluation_at_the_same_batch(tmp_path) -> None:
    """Without a collective forward each process ran its share alone: a signal on one could not end the others'
    evaluation, so a run under torchrun agreed on it only after the evaluation, however long."""
    (cut, cut_peer), (late, late_peer) = zip(*_run_two(_signalled_worker, tmp_path))
    assert [r["signum"] for r in (cut, cut_peer)] == [int(signal.SIGTERM)] * 2
    assert [r["calls"] for r in (cut, cut_peer)] == [1, 1]
    assert [r["signum"] for r in (late, late_peer)] == [0, 0]  # after every batch: the evaluation is whole
    assert [r["calls"] for r in (late, late_peer)] == [2, 1]


def test_a_collective_forward_runs_as_often_on_every_process_and_the_figures_are_the_whole_split(tmp_path) -> None:
    results = _run_two(_worker, tmp_path)
    alone = _evaluate(Lookup(collective=False))
    for result in results:
        assert result["count"] == 5 and result["top1"] == alone.top1 == 0.6
        assert abs(result["loss"] - alone.loss) < 1e-6 and result["confusion"] == alone.confusion.tolist()
    assert [r["calls"] for r in results] == [2, 2]  # rank 1's second is a blank pass
