"""What every DataLoader of vitkit's gives its worker processes: their signals and their seed source.

A stop signal often reaches a whole process group: Ctrl-C in a terminal sends SIGINT to the foreground group,
and torchrun, systemd or `kill -TERM -PGID` send SIGTERM to every process.  The main process handles both (it
saves at the step, then stops); a worker that ended on them had ended the run first ("DataLoader worker is
killed by signal"), and what was trained since the last step checkpoint was lost.  So a worker ignores SIGINT,
and obeys SIGTERM only from its parent: that is how the DataLoader's shutdown and multiprocessing's exit handler
end it, and a worker that ignored those held the exiting process forever.  Where the platform cannot tell who
sent a signal (no `sigwaitinfo`: macOS, Windows), SIGTERM keeps torch's default.
"""

from __future__ import annotations

import os
import signal
import threading

import torch


def outlive_stop_signals(_worker_id: int) -> None:
    """A DataLoader worker's `worker_init_fn`: SIGINT is ignored, and SIGTERM ends the worker only when its
    parent (the main process) sent it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not hasattr(signal, "sigwaitinfo"):
        return
    # Blocked here, SIGTERM stays pending for the thread below (threads made later inherit the mask).
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
