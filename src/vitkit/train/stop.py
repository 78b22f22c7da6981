"""The stop policy: when a run stops early or saves between its step checkpoints, the same on every process.

Three reasons to stop, checked at step boundaries: a signal (SIGTERM/SIGINT: save and exit, re-running
resumes), the time budget (`run.max_minutes` with `budget_schedule="cut"`: stop cleanly, evaluate and save),
and, for a budget-fitted schedule, nothing: the budget clock ends the schedule itself, annealed.  One reason
to save and go on: `run.checkpoint_minutes` of the engine's clock since the last checkpoint (or since this
invocation's loop began), so a `kill -9` loses at most that much training whatever `run.checkpoint_every`
is; it is read at agreement steps only, with any number of processes, so a run saves at the same steps on
one process as on N under the same clock.  With several processes every flag is agreed in one collective
(any process's reason holds for all) at agreement steps only (log and checkpoint steps), so no collective
runs on every step and every process enters the collective save at the same step.  A signal is also agreed
between them, about every `SIGNAL_AGREE_S` seconds by the slowest process's pace: torchrun kills its processes
30 s after it passed them its SIGTERM, and log steps can be further apart than that.  Each step and evaluation
batch is also progress for the stall watch (train/stall.py), which says when a process has waited far longer than
its steps take.  Clock and signals can be replaced in tests.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from vitkit.train import distributed
from vitkit.train.stall import StallWatch

CPU = torch.device("cpu")  # default device of the flag tensor the processes agree over
STOPPING = "saving a checkpoint before the next step; another Ctrl-C stops at once, losing the steps since the last one"
ESCALATE_AFTER_S = 1.0  # a Ctrl-C this long after the first stop signal stops at once; sooner: the same stop
SIGNAL_AGREE_S = 5.0  # seconds of training between two agreements on a signal, with several processes


class SignalFlag:
    """Set by SIGTERM/SIGINT while installed (handlers only in the main thread); `signum` is the last one.

    With `escalate` (a training loop's), a Ctrl-C (SIGINT) at least ESCALATE_AFTER_S after the first signal raises
    KeyboardInterrupt there and then: a step that does not end (a hung reader, a long compile) is stopped, losing
    what was trained since the last checkpoint.  One stop delivered twice does not escalate: SIGTERM sent to a
    process and again to its group (torchrun under a cgroup-wide stop), or a Ctrl-C a wrapper forwards as well.
    A step stuck inside one C call (a collective waiting for a dead peer) runs no handler until it returns.
    `said` is written to stderr at the first, at once, since the save waits for the step's end.
    """

    def __init__(self, *, escalate: bool = False, said: str = "", now: Callable[[], float] = time.monotonic) -> None:
        self.signum = 0
        self.escalate, self.said, self.now = escalate, said, now
        self._first = 0.0  # the clock's reading at the first signal
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SignalFlag:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum and self.escalate and signum == signal.SIGINT and self.now() - self._first >= ESCALATE_AFTER_S:
            raise KeyboardInterrupt  # a second Ctrl-C: at once
        first, self.signum = not self.signum, signum
        if first:
            self._first = self.now()
        if first and self.said:  # os.write, not print: the handler may run inside the main thread's write to stderr
            with contextlib.suppress(OSError):  # a closed or broken stderr (`| tee` ended by the same Ctrl-C)
                os.write(2, f"vitkit: {signal.Signals(signum).name}: {self.said}\n".encode())

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


class Verdict(NamedTuple):
    """What every process does after a step: stop (None: go on; "interrupted" or "time_budget") and save."""

    stop: str | None = None
    save: bool = False  # run.checkpoint_minutes have passed since the last checkpoint


class StopPolicy:
    """`check(agree, saved_at)` -> the `Verdict` after the step just taken.

    `deadline_s` is the invocation's time budget in seconds from `started` (None = none, or a fitted
    schedule, which the budget clock ends instead); `checkpoint_s` the seconds between checkpoints by the
    clock (None = none).  `agree` marks the steps where processes agree.
    """

    def __init__(
        self,
        *,
        started: float,
        deadline_s: float | None,
        checkpoint_s: float | None = None,
        world: int = 1,
        rank: int = 0,
        device: torch.device = CPU,
        signals: SignalFlag | None = None,
        now: Callable[[], float] = time.monotonic,
    ):
        self.started, self.deadline_s, self.checkpoint_s = started, deadline_s, checkpoint_s
        self.world, self.device = world, device
        self.signals = signals if signals is not None else SignalFlag(escalate=True, said=STOPPING if rank == 0 else "")
        self.now = now
        self.watch = StallWatch(rank, world, distributed.GROUP_TIMEOUT.total_seconds() / 60)
        self.agreed_signum = 0  # the signal any process got, once they agree to stop for it
        # several processes: steps between agreements on a signal, set from the pace agreed at the last one
        self._signal_every, self._since, self._agreed_at = 1, 0, None

    def __enter__(self) -> StopPolicy:
        self.signals.__enter__()
        self.watch.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.watch.__exit__(*exc)
        self.signals.__exit__(*exc)

    def pending_signal(self) -> int:
        """This process's signal, asked between evaluation batches, each of which counts as progress."""
        self.watch.beat()
        return self.signals.signum

    @property
    def signum(self) -> int:
        """This process's signal, or another's that stopped every process (a peer's SIGTERM), so that every
        process says and exits with the signal that stopped the run."""
        return self.signals.signum or self.agreed_signum

    def check(self, agree: bool = True, *, saved_at: float | None = None) -> Verdict:
        """What to do after the step just taken, the same on every process.  `saved_at`: the clock's reading at
        the last checkpoint, or when this invocation's loop began (None: no checkpoint by the clock)."""
        self.watch.beat()
        signalled = self.signals.signum != 0
        # a checkpoint by the clock at agreement steps alone, so every process may join in: the same steps for 1
        # process or N
        due = agree and self.checkpoint_s is not None and saved_at is not None
        # the clock is read once, where anything is judged by it: the budget and the checkpoint see one instant
        now = self.now() if self.deadline_s is not None or due else 0.0
        out_of_time = self.deadline_s is not None and now - self.started >= self.deadline_s
        save = due and now - saved_at >= self.checkpoint_s
        if self.world > 1:  # all processes must stop (and save) at the same step
            signalled, out_of_time, save = self._agree(agree, out_of_time, save)
        if signalled:
            return Verdict("interrupted")
        return Verdict("time_budget" if out_of_time else None, save)

    def _agree(self, agree: bool, out_of_time: bool, save: bool) -> tuple[bool, bool, bool]:
        """Any process's reasons, for all, in one collective: at agreement steps, and a signal alone at the steps
        of its cadence (every process counts the same steps, and the pace it is set by is agreed)."""
        self._since += 1
        if not agree and self._since < self._signal_every:
            return False, False, False
        now = self.now()
        pace = (now - self._agreed_at) / self._since if self._agreed_at is not None else 0.0  # seconds a step
        mine = [float(self.signals.signum), pace] + ([float(out_of_time), float(save)] if agree else [])
        signum, slowest, *reasons = distributed.max_each(mine, self.device)
        if self._agreed_at is not None:
            # a clock coarser than a step (Windows': 15.6 ms) reads 0 s a step: taken as a millisecond
            self._signal_every = max(1, int(SIGNAL_AGREE_S / max(slowest, 1e-3)))
        self._since, self._agreed_at = 0, now
        self.agreed_signum = int(signum)  # the signal that stops every process, to say it and exit with it
        out_of_time, save = (reasons[0] > 0, reasons[1] > 0) if agree else (False, False)
        return signum > 0, out_of_time, save
