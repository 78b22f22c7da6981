"""A warning where a process of a multi-process run has waited far longer than its steps take.

Every process of a torchrun job waits inside its collectives for all the others.  One that stops (SIGSTOP, a
hung device, a file system that no longer answers) holds the rest silently until the process group's timeout
(`distributed.GROUP_TIMEOUT`) ends them all.  The training loop tells the watch of each step and each periodic
evaluation batch (`beat`); a thread of its own says once, on every process still waiting (the stopped one may
be process 0), when none has come for `FACTOR` times the longest gap between two beats so far, at least
`MIN_WAIT_S` and at most `MAX_SHARE` of the timeout; and it says when the wait ends.  It only speaks: nothing
is stopped or changed, so a long legitimate wait (a large checkpoint written by process 0, a recompilation)
costs a line or two.  After the loop it goes on watching the final save, export and evaluation, each
evaluation batch a beat (`activity` names what it waits for).  Start-up before the first step is not
watched: there is no step time to judge a wait by.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

MIN_WAIT_S = 300.0  # never sooner: a checkpoint write or a recompilation can take minutes on a CPU
FACTOR = 20.0  # ... nor before this many of the longest gap between two beats so far
MAX_SHARE = 1 / 3  # ... but always within this share of the group's timeout, however long one gap once was
POLL_S = 5.0  # how often the thread looks


class StallWatch:
    """`beat()` after each unit of progress; `overdue()` says the warning due now, if any (the thread's test)."""

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
        self.warned = False  # while a warning stands
        self.activity = "step"  # what a beat is, in the messages: a training step, then a final evaluation batch
        self._lock, self._done, self._thread = threading.Lock(), threading.Event(), None

    @property
    def patience_s(self) -> float:
        """How long a wait goes unsaid."""
        return min(max(self.min_wait_s, FACTOR * self.longest), MAX_SHARE * self.timeout_minutes * 60)

    def beat(self) -> None:
        with self._lock:
            now = self.now()
            if not self.warned and self.last is not None:  # a stall's gap is not learnt as a step's
                self.longest = max(self.longest, now - self.last)
            self._end_wait(now)
            self.last = now

    def overdue(self) -> str | None:
        """The warning, logged, once a wait has lasted `patience_s`; None before, and while one stands."""
        with self._lock:
            if self.last is None or self.warned:
                return None
            now = self.now()
            waited = now - self.last
            if waited < self.patience_s:
                return None
            self.warned = True
            longest = f" (the longest wait between two so far: {_duration(self.longest)})" if self.longest else ""
            message = (
                f"process {self.rank} of {self.world}: no {self.activity} for {_duration(waited)}{longest}: a "
                "process of this job may have stopped or hung, and every process waits for the slowest, until the "
                f"process group's {self.timeout_minutes:g}-minute timeout ends the run; a re-run of the same command "
                "resumes from its last checkpoint"
            )
            log.warning(message)  # under the lock: a beat's "goes on" line cannot come before it
        return message

    def _end_wait(self, now: float) -> None:
        if self.warned:
            log.warning(
                "process %d: goes on after %s without a %s", self.rank, _duration(now - self.last), self.activity
            )
            self.warned = False

    def _watch(self) -> None:
        while not self._done.wait(self.poll_s):
            self.overdue()

    def __enter__(self) -> StallWatch:
        self._done = threading.Event()  # a watch may be entered again: the loop's, then the final evaluation's
        if self.world > 1:  # a single process waits for no one
            self._thread = threading.Thread(target=self._watch, name="vitkit-stall-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: Any) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if kind is None:  # a wait said as the loop ended (its last checkpoint's write) is over; an error says itself
            with self._lock:
                now = self.now()
                self._end_wait(now)
                if self.last is not None:  # a watch entered again judges waits from here, not from the last beat
                    self.last = now


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
