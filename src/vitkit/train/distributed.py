"""One code path for 1 and N processes (DESIGN.md "Scale"): torchrun launches, this module connects.

`torchrun --nproc_per_node N -m vitkit train ...` sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT; `setup()` reads them (the one place below cli.py that reads the environment, as
STYLE.md section 5 asks) and joins the process group: gloo on CPU, NCCL on CUDA.  Without them the
run is a single process and every collective here is a no-op.  Only rank 0 writes or logs.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Literal, Mapping

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0  # this process among all
    world: int = 1  # number of processes
    local_rank: int = 0  # this process on its machine (picks the GPU)

    @property
    def main(self) -> bool:
        return self.rank == 0


def from_env(environ: Mapping[str, str] | None = None) -> DistInfo:
    """The torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK); a single process without them."""
    env = os.environ if environ is None else environ
    world = int(env.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    return DistInfo(rank=int(env["RANK"]), world=world, local_rank=int(env.get("LOCAL_RANK", "0")))


def pick_device(requested: str, info: DistInfo) -> torch.device:
    """"auto" = this process's GPU when CUDA is available, else the CPU."""
    if requested == "auto":
        return torch.device("cuda", info.local_rank) if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("run.device asks for CUDA but torch.cuda.is_available() is False")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", info.local_rank)
    return device


def setup(info: DistInfo, device: torch.device) -> None:
    """Join the process group (gloo on CPU, NCCL on CUDA) unless single-process or already joined."""
    if info.world == 1 or dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=info.rank, world_size=info.world, timeout=datetime.timedelta(minutes=30))


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: nn.Module, info: DistInfo, device: torch.device, parallel: Literal["ddp", "fsdp"]) -> nn.Module:
    """Replicate (DDP) or shard (FSDP2 `fully_shard`, CUDA only) `model` across the processes."""
    if info.world == 1:
        return model
    if parallel == "fsdp":
        if device.type != "cuda":
            raise ValueError("FSDP2 sharding needs CUDA; use run.parallel=ddp on CPU")
        from torch.distributed.fsdp import fully_shard

        for block in getattr(model, "blocks", []):  # shard each encoder layer, then the rest (root)
            fully_shard(block)
        return fully_shard(model)
    ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=ids)


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def any_true(flag: bool, device: torch.device) -> bool:
    """True on every process when `flag` is true on any (so all stop at the same step)."""
    return bool(max_across(1.0 if flag else 0.0, device))


def max_across(value: float, device: torch.device) -> float:
    """The largest of each process's `value`, on every process (the value itself with one process)."""
    if not dist.is_initialized():
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return float(tensor.item())


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
