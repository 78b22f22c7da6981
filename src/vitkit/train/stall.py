"""A warning where a process of a multi-process run has waited far longer than its steps take.

Every process of a torchrun job waits inside its collectives for all the others.  One that stops (SIGSTOP, a
hung device, a file system that no longer answers) holds the rest silently until the process group's timeout
(`distributed.GROUP_TIMEOUT`) ends them all.  The watch is told of each step and each evaluation batch
(`beat`); a thread of its own says once, on every process still waiting (the stopped one may be process 0),
when none has come for `FACTOR` times the longest gap seen so far and at least `MIN_WAIT_S`; and it says when
they go on.  It only speaks: nothing is stopped or changed, so a long legitimate wait (a large checkpoint
written by process 0, a recompilation) costs one line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

MIN_WAIT_S = 300.0  # never sooner: a checkpoint write or a recompilation can take minutes on a CPU
FACTOR = 20.0  # ... and never before this many of the longest gap between two beats seen so far
POLL_S = 5.0  # how often the thread looks


class StallWatch:
    """`beat()` after each unit of progress; `overdue()` is the warning due now, if any (the thread's test)."""

    def __init__(
        self,
        rank: int,
        world: int,
        timeout_minutes: float,
        *,
        min_wait_s: float = MIN_WAIT_S,
        poll_s: float = POLL_S,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rank, self.world, self.timeout_minutes = rank, world, timeout_minutes
        self.min_wait_s, self.poll_s, self.now = min_wait_s, poll_s, now
        self.longest = 0.0  # the longest gap between two beats, stalls excepted
        self.last: float | None = None  # the last beat (None: none yet, so no step time to judge by)
        self.warned_at: float | None = None  # set while a warning stands
        self._lock, self._done, self._thread = threading.Lock(), threading.Event(), None

    def beat(self) -> None:
        with self._lock:
            now = self.now()
            if self.warned_at is not None:
                log.warning("process %d: its steps go on, after %s without one", self.rank, _duration(now - self.last))
                self.warned_at = None
            elif self.last is not None:  # a stall's gap would make the next one wait longer to be seen
                self.longest = max(self.longest, now - self.last)
            self.last = now

    def overdue(self) -> str | None:
        """The warning, once a stall has lasted long enough; None before, and while one stands."""
        with self._lock:
            if self.last is None or self.warned_at is not None:
                return None
            now = self.now()
            waited = now - self.last
            if waited < max(self.min_wait_s, FACTOR * self.longest):
                return None
            self.warned_at = now
        slowest = f" (the slowest so far took {_duration(self.longest)})" if self.longest else ""
        return (
            f"process {self.rank} of {self.world}: no step for {_duration(waited)}{slowest}: a process of this job "
            "may have stopped or hung, and every process waits for the slowest, until the process group's "
            f"{self.timeout_minutes:g}-minute timeout ends the run; a re-run of the same command resumes from its "
            "last checkpoint"
        )

    def _watch(self) -> None:
        while not self._done.wait(self.poll_s):
            message = self.overdue()
            if message:
                log.warning(message)

    def __enter__(self) -> StallWatch:
        if self.world > 1:  # a single process waits for no one
            self._thread = threading.Thread(target=self._watch, name="vitkit-stall-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
