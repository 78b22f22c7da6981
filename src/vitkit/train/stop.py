"""The stop policy: when a run stops early, and that every process stops at the same step.

Three reasons, checked at step boundaries: a signal (SIGTERM/SIGINT: save and exit, re-running resumes),
the time budget (`run.max_minutes` with `budget_schedule="cut"`: stop cleanly, evaluate and save), and,
for a budget-fitted schedule, nothing: the budget clock ends the schedule itself, annealed.  With
several processes the decision is taken jointly (any process's reason stops all) at agreement steps
only (log and checkpoint steps), so no collective runs on every step.  Clock and signals can be
replaced in tests.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from vitkit.train import distributed

CPU = torch.device("cpu")  # default device of the flag tensor the processes agree over


class SignalFlag:
    """Set by SIGTERM/SIGINT while installed (handlers only in the main thread); `signum` is the last one."""

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SignalFlag:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()


class StopPolicy:
    """`check(step, agree)` -> None, "interrupted" or "time_budget".

    `deadline_s` is the invocation's time budget in seconds from `started` (None = none, or a fitted
    schedule, which the budget clock ends instead).  `agree` marks the steps where processes agree.
    """

    def __init__(
        self,
        *,
        started: float,
        deadline_s: float | None,
        world: int = 1,
        device: torch.device = CPU,
        signals: SignalFlag | None = None,
        now: Callable[[], float] = time.monotonic,
    ):
        self.started, self.deadline_s, self.world, self.device = started, deadline_s, world, device
        self.signals = signals if signals is not None else SignalFlag()
        self.now = now

    def __enter__(self) -> StopPolicy:
        self.signals.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.signals.__exit__(*exc)

    @property
    def signum(self) -> int:
        return self.signals.signum

    def check(self, agree: bool = True) -> str | None:
        """The reason to stop after the step just taken, the same on every process."""
        signalled = self.signals.signum != 0
        out_of_time = self.deadline_s is not None and self.now() - self.started >= self.deadline_s
        if self.world > 1:  # all processes must stop at the same step: agree at agreement steps only
            signalled = agree and distributed.any_true(signalled, self.device)
            out_of_time = agree and distributed.any_true(out_of_time, self.device)
        if signalled:
            return "interrupted"
        return "time_budget" if out_of_time else None
