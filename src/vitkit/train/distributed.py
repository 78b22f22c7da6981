"""One code path for 1 and N processes (DESIGN.md "Scale"): torchrun launches, this module connects.

`torchrun --nproc_per_node N -m vitkit train ...` sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT; `setup()` reads them (the one place below cli.py that reads the environment, as
STYLE.md section 5 asks) and joins the process group: gloo on CPU, NCCL on CUDA.  Under torchrun even one
process joins a group and wraps its model (DDP, or FSDP2 on CUDA), so `--nproc_per_node 1` tries the
multi-device path on one device.  Without the variables the run is a plain process and every collective
here is a no-op.  Only rank 0 writes or logs.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NoReturn

import torch
import torch.distributed as dist
from torch import nn

GROUP_TIMEOUT = datetime.timedelta(minutes=30)  # a collective waits this long for a process that does not come
WAIT_SAID_S = 10.0  # a rendezvous that waits longer for the other processes says so
_joining: threading.Thread | None = None  # the thread of the last join, which a signal may have left waiting


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0  # this process among all
    world: int = 1  # number of processes
    local_rank: int = 0  # this process on its machine (picks the GPU)
    launched: bool = False  # torchrun's variables were set, or a group was joined: a group and a wrapped model

    @property
    def main(self) -> bool:
        return self.rank == 0


def from_env(environ: Mapping[str, str] | None = None) -> DistInfo:
    """The torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK); a single process without them."""
    env = _set_variables(environ)
    if ("WORLD_SIZE" in env) != ("RANK" in env):  # an empty one (a shell template's) counts as unset
        given, missing = ("WORLD_SIZE", "RANK") if "WORLD_SIZE" in env else ("RANK", "WORLD_SIZE")
        raise ValueError(f"{given} is set but {missing} is not: launch with torchrun, which sets both")
    if "WORLD_SIZE" not in env:
        return DistInfo()
    world = _count(env, "WORLD_SIZE")
    if world <= 1 and "MASTER_ADDR" not in env:  # a scheduler's RANK=0 WORLD_SIZE=1, not torchrun: a plain process
        return DistInfo()
    rank = _count(env, "RANK")
    if not 0 <= rank < world:  # a process group would wait 30 minutes for ranks that never come
        raise ValueError(f"RANK={rank} is not in 0..{world - 1} for WORLD_SIZE={world}: launch with torchrun")
    local_rank = _local_rank(env, rank)
    if local_rank < 0:
        raise ValueError(f"LOCAL_RANK={local_rank} is below 0: launch with torchrun, which sets it")
    return DistInfo(rank=rank, world=world, local_rank=local_rank, launched=True)


def _local_rank(env: Mapping[str, str], rank: int) -> int:
    """LOCAL_RANK, or where a launcher other than torchrun left it unset, the rank modulo this machine's GPUs (so
    that processes on one machine do not all take GPU 0)."""
    return _count(env, "LOCAL_RANK", str(rank % max(1, torch.cuda.device_count())))


def _set_variables(environ: Mapping[str, str] | None) -> dict[str, str]:
    """The environment (`os.environ` by default) without its empty variables: a shell template's, read as unset."""
    return {key: value for key, value in (os.environ if environ is None else environ).items() if value != ""}


def _count(env: Mapping[str, str], name: str, default: str | None = None) -> int:
    value = env.get(name, default)
    try:
        return int(value or "")
    except ValueError:
        raise ValueError(f"{name}={str(value)[:40]!r} is not a whole number (torchrun sets it)") from None


def current(environ: Mapping[str, str] | None = None) -> DistInfo:
    """This process's place: an already joined process group (e.g. a test's), else torchrun's variables."""
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        return DistInfo(rank=rank, world=world, local_rank=_local_rank(_set_variables(environ), rank), launched=True)
    return from_env(environ)


def setup(info: DistInfo, device: torch.device) -> bool:
    """Join the process group (gloo on CPU, NCCL on CUDA) unless not launched by torchrun or already joined.

    Returns whether this call joined it (and `teardown` should leave it).
    """
    if not info.launched or dist.is_initialized():
        return False
    if device.type == "cuda":
        torch.cuda.set_device(device)
    _join("nccl" if device.type == "cuda" else "gloo", info)
    return True


def _join(backend: str, info: DistInfo) -> None:
    """`init_process_group` in a thread while this one waits in Python: the rendezvous waits in C++ for every
    process of WORLD_SIZE, deaf to Ctrl-C and SIGTERM, for up to GROUP_TIMEOUT where one never starts (a
    hand-set WORLD_SIZE, a node not launched), and said nothing.  A wait past WAIT_SAID_S is said; a signal
    stops it (the thread, a daemon, is left to the process's exit; a later join while it waits is refused)."""
    global _joining
    if _joining is not None and _joining.is_alive():
        raise RuntimeError("an earlier, interrupted join of the process group is still waiting for its peers")
    failed: list[BaseException] = []

    def join() -> None:
        try:
            dist.init_process_group(backend, rank=info.rank, world_size=info.world, timeout=GROUP_TIMEOUT)
        except BaseException as error:  # noqa: BLE001 - raised again in the waiting thread
            failed.append(error)

    thread = _joining = threading.Thread(target=join, name="vitkit-rendezvous", daemon=True)
    thread.start()
    thread.join(WAIT_SAID_S)
    if thread.is_alive():
        where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
        print(
            f"process {info.rank} of {info.world}: waiting at {where} for the other processes to join (each of the "
            f"WORLD_SIZE={info.world} must start: torchrun starts them); it waits up to "
            f"{GROUP_TIMEOUT.total_seconds() / 60:.0f} min, Ctrl-C stops it",
            file=sys.stderr,
            flush=True,
        )
    while thread.is_alive():
        thread.join(0.2)  # in Python between waits: a signal's handler runs
    if failed:
        raise failed[0]


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def held(info: DistInfo, device: torch.device) -> Iterator[None]:
    """The process group, joined (`setup`) for what runs inside and left after, unless already joined: a run's,
    or that of several runs of one command (an LR sweep's trials and final run), each of which then leaves it
    be: DDP keeps the group it was given alive (`leave`), so a group left and joined again between runs would
    hang the next DDP's first broadcast under torchrun."""
    joined = setup(info, device)
    try:
        yield
    finally:
        if joined:
            teardown()


@contextlib.contextmanager
def entered_on_main(
    enter: Callable[[], contextlib.AbstractContextManager], info: DistInfo, what: str
) -> Iterator[None]:
    """`enter()` (a context manager, e.g. the run directory's lock) held by the main process alone for the block,
    every process told whether it could be: where it raises there, it raises on the main process and the others
    say that process 0 could not `what`, not that a peer died.  A collective where several processes run."""
    stack, error = contextlib.ExitStack(), None
    with stack:
        if info.main:
            try:
                stack.enter_context(enter())
            except Exception as caught:  # noqa: BLE001 - re-raised below, once every process knows
                error = caught
        if info.world > 1 and any_each([error is not None], _collective_device())[0] and error is None:
            raise ValueError(f"process 0 could not {what} (its message says why); nothing was trained")
        if error is not None:
            raise error
        yield


def leave(code: int) -> NoReturn:
    """End a process that trained under DDP with exit status `code`, without finalizing the interpreter.

    DDP keeps its gloo process group alive past `teardown` (its reducer holds it), and a gloo worker thread
    may still be releasing the last backward pass's collectives, whose state holds a Python object.  If the
    interpreter is finalizing when it takes the GIL, the thread exits mid-destructor and the process aborts
    (SIGABRT, "terminate called without an active exception") after a finished run: about one exit in 50 on
    a loaded 2-core host.  So the exit handlers run and the streams are flushed while the interpreter is
    whole, and the process ends with `os._exit`, which stops every thread at once.  Before that it does what
    a normal exit does first: waits for the threads that are not daemons (`threading._shutdown`, which also
    lets unfinished thread pools wind down), then runs the exit handlers.
    """
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own first step of an exit
    atexit._run_exitfuncs()  # logging's flush, torch.compile's worker pool, ...: what a normal exit runs
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:  # None: the process has no such stream
                stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(code)


def wrap(model: nn.Module, info: DistInfo, device: torch.device, parallel: Literal["ddp", "fsdp"]) -> nn.Module:
    """Replicate (DDP) or shard (FSDP2 `fully_shard`, CUDA only) `model` across the processes of the group."""
    if not info.launched:
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


def any_each(flags: Sequence[bool], device: torch.device) -> list[bool]:
    """Each flag true on every process when it is true on any, in one collective (the stop policy agrees on all
    of its flags at once, so every process stops or saves at the same step)."""
    return [bool(value) for value in max_each([1.0 if flag else 0.0 for flag in flags], device)]


def max_across(value: float, device: torch.device) -> float:
    """The largest of each process's `value`, on every process (the value itself with one process, without a
    collective: one process under torchrun syncs nothing)."""
    return max_each([value], device)[0]


def max_each(values: Sequence[float], device: torch.device) -> list[float]:
    """`max_across` of each value, in one collective."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(values)
    tensor = torch.tensor(list(values), dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [float(value) for value in tensor.tolist()]


def min_across(value: float, device: torch.device) -> float:
    """The smallest of each process's `value`, on every process (the value itself with one process)."""
    return -max_across(-value, device)


def sum_across(value: int, device: torch.device) -> int:
    """The sum of each process's count `value`, on every process."""
    tensor = torch.tensor([float(value)], dtype=torch.float64, device=device)
    all_reduce_sum(tensor)
    return int(tensor.item())


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _collective_device() -> torch.device:
    """Where a collective's tensors live: this process's CUDA device under NCCL, the CPU under gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_gather_bytes(parts: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    """Every process's `parts` (uint8 tensors, flattened; the same names on every process, any lengths), indexed
    by rank, on the CPU of every process: a collective every process calls.  `[parts]` without a group.

    Tensors only (no pickling): the lengths travel first, then the bytes, padded to the longest process's.
    """
    if not dist.is_initialized():
        return [{name: part.reshape(-1).cpu() for name, part in parts.items()}]
    device, world, names = _collective_device(), dist.get_world_size(), list(parts)
    if not names:  # the same names on every process: all return here, or none
        return [{} for _ in range(world)]
    lengths = torch.tensor([parts[name].numel() for name in names], dtype=torch.int64, device=device)
    every_lengths = [torch.empty_like(lengths) for _ in range(world)]
    dist.all_gather(every_lengths, lengths)
    counts = [[int(n) for n in each.tolist()] for each in every_lengths]
    local = torch.zeros(max(sum(each) for each in counts), dtype=torch.uint8, device=device)
    flat = torch.cat([parts[name].reshape(-1).to(torch.uint8) for name in names])
    local[: flat.numel()] = flat.to(device)
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)
    return [
        dict(zip(names, (piece.clone() for piece in torch.split(data.cpu()[: sum(each)], each))))
        for data, each in zip(gathered, counts)
    ]


def differences_from_rank_0(
    facts: dict[str, object], alike: Callable[[str, dict, dict], bool] | None = None
) -> list[str]:
    """The keys of `facts` (JSON values: the resolved config, the data's counts) whose value on some process is
    not rank 0's, as "KEY (rank R: VALUE, rank 0: VALUE)": a collective every process calls, which gives every
    process the same answer.  Processes launched with other flags or other data would train replicas that drift
    apart, or die in a mismatched collective, and report figures of no one model.  `alike(key, theirs, ours)`
    (their facts, rank 0's) may count two different values of `key` as one."""
    text = json.dumps(facts, sort_keys=True, default=str).encode()
    gathered = all_gather_bytes({"facts": torch.frombuffer(bytearray(text), dtype=torch.uint8)})
    ours = [json.loads(bytes(part["facts"].tolist())) for part in gathered]
    said = []
    for rank, other in enumerate(ours[1:], start=1):
        for key in sorted(set(ours[0]) | set(other)):
            if other.get(key) != ours[0].get(key) and not (alike and alike(key, other, ours[0])):
                said.append(f"{key} (rank {rank}: {str(other.get(key))[:60]}, rank 0: {str(ours[0].get(key))[:60]})")
    return said
