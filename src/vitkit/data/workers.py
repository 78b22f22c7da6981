"""How every DataLoader of vitkit's starts its worker processes: their signals, start method and seed source.

A stop signal often reaches a whole process group: Ctrl-C in a terminal sends SIGINT to the foreground group,
and torchrun, systemd or `kill -TERM -PGID` send SIGTERM to every process.  The main process handles both (it
saves at the step, then stops); a worker that ended on them would end the run first ("DataLoader worker is
killed by signal"), losing what was trained since the last step checkpoint.  So a worker ignores SIGINT,
and obeys SIGTERM only from its parent: that is how the DataLoader's shutdown and multiprocessing's exit handler
end it, and a worker that ignored those held the exiting process forever.

Telling the sender needs `sigwaitinfo` (Linux) and a worker forked from the main process: under spawn or
forkserver a worker has other threads before its init runs, which the block below does not reach, and a
forkserver worker's parent is not the main process.  Where both hold, the workers are forked (Linux's default
before Python 3.14) unless spawn was chosen; elsewhere (macOS, Windows, spawn) SIGTERM keeps torch's default.
What a worker starts inherits its ignored SIGINT and blocked SIGTERM (vitkit's readers start no process; a
transform of yours may).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

TELLS_SENDER = hasattr(signal, "sigwaitinfo") and "fork" in multiprocessing.get_all_start_methods()
_forked_from: int | None = None  # in a forked process, its parent (spawn and forkserver import the module anew)


def _before_fork() -> None:
    global _forked_from
    _forked_from = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork)


def worker_options(workers: int) -> dict[str, Any]:
    """The DataLoader arguments of `workers` worker processes (0: none, the data read in the main process)."""
    options: dict[str, Any] = {
        "num_workers": workers,
        "generator": own_generator(),
        "worker_init_fn": outlive_stop_signals,
    }
    if workers > 0 and TELLS_SENDER and multiprocessing.get_start_method(allow_none=True) != "spawn":
        options["multiprocessing_context"] = "fork"  # not where spawn was chosen (CUDA in a worker needs it)
    return options


STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def started(loader: DataLoader) -> Iterator[Any]:
    """`iter(loader)`, its workers forked with SIGINT and SIGTERM blocked in the forking thread: a worker inherits
    the mask, so a stop signal to the process group during its start-up waits for `outlive_stop_signals` instead
    of ending it.  The main process still gets such a signal: at once through another of its threads, or when
    the mask is restored."""
    context = loader.multiprocessing_context  # `worker_options` sets fork where it can tell a worker's sender
    forks = loader.num_workers > 0 and context is not None and context.get_start_method() == "fork"
    if not forks:
        return iter(loader)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        return iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def outlive_stop_signals(_worker_id: int) -> None:
    """A DataLoader worker's `worker_init_fn`: SIGINT is ignored, and SIGTERM ends the worker only when its
    parent (the main process) sent it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # blocked since the fork (`started`): now ignored
    if not TELLS_SENDER or _forked_from != os.getppid():  # not forked from the main process: torch's default
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        return
    # Blocked (since the fork, where `started` forked it), SIGTERM stays pending for the thread below (threads made
    # later inherit the mask).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    threading.Thread(target=_obey_sigterm_from, args=(os.getppid(),), name="sigterm", daemon=True).start()


def _obey_sigterm_from(parent: int) -> None:
    while True:
        if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
            os._exit(0)  # as torch's own worker handler does for its parent's SIGTERM


def own_generator() -> torch.Generator:
    """For a DataLoader, which otherwise draws its workers' base seed from the global RNG when it starts
    iterating: that draw would move the dropout/augmentation stream differently in a resumed run."""
    return torch.Generator().manual_seed(0)
