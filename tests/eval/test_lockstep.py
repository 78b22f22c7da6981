"""An evaluation whose forward is a collective (FSDP's all-gathers) on two gloo processes whose shares differ in
batches: every process runs as many forward passes, and both get the one-process figures."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from vitkit.data.sources import ImageSet
from vitkit.eval.evaluator import evaluate

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


def _evaluate(model: nn.Module, rank: int = 0, world: int = 1, lockstep: bool = False):
    images = torch.arange(len(LABELS), dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 1, 2, 2).contiguous()
    data = ImageSet(images=images, labels=LABELS, class_names=["a", "b", "c"])
    return evaluate(
        model, data, size=2, mean=(0.5,), std=(0.5,), channels=1, batch_size=2, rank=rank, world=world,
        lockstep=lockstep,
    )  # fmt: skip


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = Lookup(collective=True)
    counts = _evaluate(model, rank, world, lockstep=True)
    result = {"top1": counts.top1, "loss": counts.loss, "count": counts.count, "calls": model.calls}
    Path(out, f"rank{rank}.json").write_text(json.dumps({**result, "confusion": counts.confusion.tolist()}))
    dist.destroy_process_group()


def test_a_collective_forward_runs_as_often_on_every_process_and_the_figures_are_the_whole_split(tmp_path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.start_processes(_worker, args=(2, port, str(tmp_path)), nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 120  # a process left waiting in a collective fails the test here, not hangs it
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise AssertionError("a process waited on a collective its peer never reached")
    alone = _evaluate(Lookup(collective=False))
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for result in results:
        assert result["count"] == 5 and result["top1"] == alone.top1 == 0.6
        assert abs(result["loss"] - alone.loss) < 1e-6 and result["confusion"] == alone.confusion.tolist()
    assert [r["calls"] for r in results] == [2, 2]  # rank 1's second is a blank pass
