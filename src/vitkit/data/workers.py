"""How every DataLoader of vitkit's starts its worker processes: their signals, start method and seed source.

A stop signal often reaches a whole process group: Ctrl-C in a terminal sends SIGINT to the foreground group,
and torchrun, systemd or `kill -TERM -PGID` send SIGTERM to every process.  The main process handles both (it
saves at the step, then stops); a worker that ended on them would end the run first ("DataLoader worker is
killed by signal"), losing what was trained since the last step checkpoint.  So a worker ignores SIGINT,
and obeys SIGTERM only from its parent: that is how the DataLoader's shutdown and multiprocessing's exit handler
end it, and a worker that ignored those held the exiting process forever.

Telling the sender needs `sigwaitinfo` (Linux), SIGTERM blocked in every thread of the worker, and the worker's
parent the process that ends it.  `started` starts forked and spawned workers with the stop signals blocked
(a thread inherits the mask, and so does a program exec'd by spawn), so all three hold for them; where
`sigwaitinfo` exists workers are forked (Linux's default before Python 3.14) unless spawn was chosen.
Elsewhere (macOS, a forkserver's workers) a worker cannot tell its parent's SIGTERM from the group's: once
started it leaves the process group instead, so a signal to the group (Ctrl-C, `kill -TERM -PGID`) no longer
reaches it, and SIGTERM keeps torch's action; a SIGTERM during its start-up, or one sent to every process of a
cgroup (systemd's default, Slurm), still ends it there.  Windows has no process-group signals.  What a worker
starts inherits its ignored SIGINT and blocked SIGTERM (vitkit's readers start no process; a transform of
yours may).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import multiprocessing
import os
import signal
import threading
from collections.abc import Iterator
from multiprocessing import resource_tracker
from typing import Any

import torch
from torch.utils.data import DataLoader, get_worker_info

from vitkit.host import processes_here

log = logging.getLogger(__name__)
TELLS_SENDER = hasattr(signal, "sigwaitinfo") and "fork" in multiprocessing.get_all_start_methods()


def worker_options(workers: int, *, each: int = 0, prefetch: int = 2, lanes: bool = False) -> dict[str, Any]:
    """The DataLoader arguments of `workers` worker processes (0: none, the data read in the main process), each
    with `prefetch` batches of `each` bytes in flight, as many as fit in shared memory (`fitted`)."""
    workers, prefetch = fitted(workers, prefetch, each, lanes=lanes)
    options: dict[str, Any] = {
        "num_workers": workers,
        "prefetch_factor": prefetch if workers else None,
        "generator": own_generator(),
        "worker_init_fn": outlive_stop_signals,
    }
    if workers > 0 and TELLS_SENDER and multiprocessing.get_start_method(allow_none=True) != "spawn":
        options["multiprocessing_context"] = "fork"  # not where spawn was chosen (CUDA in a worker needs it)
    return options


SHARED_MEMORY = "/dev/shm"  # where Linux's DataLoader workers put the batches they pass (Docker's default: 64 MB)
_said: set[tuple[int, ...]] = set()  # each adjustment is said once a process, not at every evaluation


def fitted(workers: int, prefetch: int, each: int, *, lanes: bool = False) -> tuple[int, int]:
    """(workers, prefetch) whose batches in flight, workers x prefetch and the one the main process holds, fit in
    90% of this process's share of the shared memory free now (torchrun's processes on this machine share it):
    fewer prefetched batches first, then fewer workers, then none (decoded
    in the main process), said once.  `lanes`: the workers are the data's order (a streamed split's lanes),
    so only the prefetch may shrink, and what still does not fit is refused before the first batch.
    Unchanged where the free space cannot be read (macOS keeps shared memory elsewhere) or is ample."""
    free = _free_bytes(SHARED_MEMORY) if workers and each else None
    if free is None:
        return workers, prefetch
    free //= processes_here()  # torchrun's processes on this machine start their workers at once
    room = int(free * 0.9) // each - 1
    if workers * prefetch <= room:
        return workers, prefetch
    fit = (workers, max(1, room // workers)) if room >= workers or lanes else (max(room, 0), 1)
    need = (workers * prefetch + 1) * each
    said = (
        f"shared memory ({SHARED_MEMORY}) has {free / 2**20:.0f} MB free, and {workers} DataLoader worker(s) with "
        f"{prefetch} batches of {each / 2**20:.1f} MB each in flight need {need / 2**20:.0f} MB"
    )
    if fit[0] and fit[0] * fit[1] > room:
        raise ValueError(
            f"{said}: give the container more (docker run --shm-size), or start over with --set data.workers=0 (a "
            "stream's workers are its order: a run resumes with the workers it started with)"
        )
    using = f"{fit[0]} worker(s), {fit[1]} batch(es) each in flight" if fit[0] else "none (decoded in the main process)"
    if (workers, prefetch, each, *fit) not in _said:
        _said.add((workers, prefetch, each, *fit))
        log.warning("%s: using %s; docker run --shm-size gives them room", said, using)
    return fit


def batch_bytes(data: Any, batch: int) -> int:
    """The bytes of a batch of `data` (an ImageSet or ShardSet) as its files decode: uint8 at the load size."""
    return batch * data.channels * (data.load_size or 0) ** 2


def _free_bytes(path: str) -> int | None:
    try:
        stats = os.statvfs(path)
    except (OSError, AttributeError):  # no such folder; Windows has no statvfs
        return None
    return stats.f_bavail * stats.f_frsize


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def started(loader: DataLoader) -> Iterator[Any]:
    """`iter(loader)`, its workers started with the stop signals blocked (`stop_signals_blocked`), so a stop
    signal to the process group during a worker's start-up waits for `outlive_stop_signals` instead of ending
    it."""
    if loader.num_workers == 0:
        return iter(loader)
    context = loader.multiprocessing_context or multiprocessing.get_context()
    try:  # the workers' queues need POSIX semaphores, in /dev/shm: a missing or read-only one fails here, unnamed
        context.Lock()
    except OSError as err:
        raise ValueError(
            f"DataLoader workers cannot start: no usable shared memory ({err.strerror}{_shm_cause(err.errno)}): "
            "use --set data.workers=0, or give the container a writable /dev/shm (docker run --shm-size)"
        ) from err
    with stop_signals_blocked(context.get_start_method()):
        return iter(loader)


@contextlib.contextmanager
def stop_signals_blocked(start_method: str) -> Iterator[None]:
    """SIGINT and SIGTERM blocked in this thread while it starts processes by fork or spawn: a child inherits the
    mask (across spawn's exec too), and unblocks them once it has set how it takes them.  This process still
    gets such a signal: at once through another of its threads, or when the mask is restored.  (A forkserver
    starts its children from its own process: nothing to block here.)"""
    if start_method not in ("fork", "spawn") or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    if start_method == "spawn":  # started later, the tracker would unblock both in this thread
        resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def outlive_stop_signals(_worker_id: int) -> None:
    """A DataLoader worker's `worker_init_fn`: SIGINT is ignored, and SIGTERM ends the worker only when its
    parent (the process that made the DataLoader) sent it; where that cannot be told, the worker leaves the
    process group."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no process-group signals to outlive
        return
    blocked = signal.SIGTERM in signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # since `started`
    maker = multiprocessing.parent_process()
    if TELLS_SENDER and blocked and maker is not None and maker.pid == os.getppid():
        # Blocked in every thread since the worker started, SIGTERM stays pending for the thread below (threads
        # made later inherit the mask).
        threading.Thread(target=_obey_sigterm_from, args=(maker.pid,), name="sigterm", daemon=True).start()
        return
    try:
        os.setpgid(0, 0)  # a group of its own: the group's signals no longer reach it, its parent's SIGTERM does
    except OSError:  # a session leader (not a DataLoader worker)
        pass
    # A SIGTERM that came during start-up (its sender unknown: it may be the parent's) is taken now, as torch takes
    # it: a worker that dropped its parent's would hold the exiting parent.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _obey_sigterm_from(parent: int) -> None:
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
            os._exit(0)  # as torch's own worker handler does for its parent's SIGTERM


def own_generator() -> torch.Generator:
    """For a DataLoader, which otherwise draws its workers' base seed from the global RNG when it starts
    iterating: that draw would move the dropout/augmentation stream differently in a resumed run."""
    return torch.Generator().manual_seed(0)


def _shm_cause(number: int | None) -> str:
    """What a semaphore's errno says of /dev/shm, for the message ("" where it says nothing certain)."""
    if number in (errno.ENOENT, errno.ENOSYS):
        return "; /dev/shm is missing?"
    if number in (errno.EROFS, errno.EACCES, errno.EPERM):
        return "; /dev/shm is not writable?"
    return "; /dev/shm is full?" if number == errno.ENOSPC else ""


def shared_in_worker(batch: Any) -> Any:
    """A batch's tensors (in tuples and lists, at any depth) moved into shared memory (/dev/shm) in the DataLoader
    worker itself: one copy, which the worker's queue would otherwise make in its feeder thread, where a full
    /dev/shm ("unable to allocate shared memory") only prints an error and drops the batch, and the main process
    waits for it forever.  Raised here, the error reaches the main process as the worker's."""
    if get_worker_info() is not None:
        _share(batch)
    return batch


def _share(item: Any) -> None:
    if isinstance(item, torch.Tensor):
        item.share_memory_()
    elif isinstance(item, tuple | list):
        for part in item:
            _share(part)
