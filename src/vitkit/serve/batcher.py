"""Dynamic batching: requests that arrive close together share one model forward.

Each image waits in one queue.  A dedicated model thread takes the first waiting image, gathers more
until the batch holds `max_batch` images or the first one has waited `max_wait_s`, runs the batch and
hands each caller its own row of the output back on the event loop; an output that is an exception
fails that caller alone.  The event loop only queues images and wakes the thread, so it keeps
accepting requests while the model runs, and the thread takes the next batch the moment a forward
ends, without waiting for the loop (which may be busy answering the previous batch).  The thread is
woken by the first image and then only by a full batch, not by every arrival, or when no other
request is on its way (`others`: requests admitted but not yet here, e.g. still being read): then
there is no company to wait for, and the batch runs at once.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class _Job:
    payload: Any
    future: asyncio.Future


class BatcherClosed(RuntimeError):
    """The batcher is shutting down and takes no new work."""


class Batcher:
    """Gathers `submit`ted payloads into batches for `run(payloads) -> outputs` (one output per payload,
    same order), called in one dedicated thread.

    Args:
        on_depth: called with the number of waiting payloads whenever it changes (metrics).
        others: given the callers inside, how many requests are still on their way to `submit` (0: nobody
            to wait for); by default always some, so a batch waits `max_wait_s` to fill up.
        foreseen: exceptions of `run` that say all there is (a model process that died, and was restarted):
            logged in one line, where any other is logged with its traceback.
    """

    def __init__(
        self,
        run: Callable[[Sequence[Any]], Sequence[Any]],
        *,
        max_batch: int,
        max_wait_s: float,
        on_depth: Callable[[int], None] = lambda depth: None,
        others: Callable[[int], int] = lambda inside: 1,
        foreseen: tuple[type[Exception], ...] = (),
    ) -> None:
        self._run, self._max_batch, self._max_wait, self._foreseen = run, max_batch, max_wait_s, foreseen
        self._on_depth, self._others = on_depth, others
        self._inside = 0  # callers between submit and their answer (changed on the event loop only)
        self._waiting: collections.deque[_Job] = collections.deque()
        self._changed = threading.Condition()  # guards _waiting; the model thread waits on it
        self._want_first = True  # the thread waits for a first image (any arrival wakes it), else for a full batch
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._serve, name="vitkit-model", daemon=True)
        self._thread.start()

    async def submit(self, payloads: Sequence[Any], *, each: bool = False) -> list[Any]:
        """Queue payloads (one image each) and wait for their outputs, in order; an exception of a batch
        that held one of them is raised here, or with `each` returned in its place."""
        if self._closed:
            raise BatcherClosed("the server is shutting down")
        loop = asyncio.get_running_loop()
        jobs = [_Job(payload, loop.create_future()) for payload in payloads]
        self._inside += 1
        with self._changed:
            self._waiting.extend(jobs)
            depth = len(self._waiting)
            if self._want_first or depth >= self._max_batch or self._others(self._inside) <= 0:
                self._changed.notify()
        self._on_depth(depth)
        try:
            return list(await asyncio.gather(*(job.future for job in jobs), return_exceptions=each))
        finally:
            self._inside -= 1
            for job in jobs:  # a caller that gives up (error elsewhere, disconnect) frees its places
                if not job.future.cancel() and not job.future.cancelled():
                    job.future.exception()  # seen: a second failed image of one request is not logged as unretrieved

    async def close(self, timeout_s: float | None = None) -> None:
        """Refuse new work, finish what is queued, stop the model thread; after `timeout_s` a batch still
        running is not waited for (the thread is a daemon) and what waits gets BatcherClosed."""
        self._closed = True
        with self._changed:
            self._changed.notify()
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._thread is not None and self._thread.is_alive():  # the thread finishes the queue, then ends
            await asyncio.sleep(0.005)
            if deadline is not None and time.monotonic() >= deadline and self._thread.is_alive():
                log.warning("a model batch was still running %g s after the drain: not waited for", timeout_s)
                break
        await asyncio.sleep(0)  # the last deliveries, scheduled by the thread, run before we return
        with self._changed:
            left, self._waiting = list(self._waiting), collections.deque()
        for job in left:  # only left when the thread never started or was not waited for
            if not job.future.done():
                job.future.set_exception(BatcherClosed("the server is shutting down"))

    def _serve(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            if not batch:
                continue
            try:
                outputs = self._run([job.payload for job in batch])
                if len(outputs) != len(batch):
                    raise RuntimeError(f"the model returned {len(outputs)} outputs for {len(batch)} inputs")
            except Exception as error:  # noqa: BLE001 - one bad batch fails its callers, not the server
                if isinstance(error, self._foreseen):
                    log.error("a batch of %d failed: %s", len(batch), error)
                else:
                    log.exception("model forward failed for a batch of %d", len(batch))
                outputs = [error] * len(batch)
            try:
                self._loop.call_soon_threadsafe(self._deliver, batch, outputs)
            except RuntimeError:  # the loop closed while a batch close() stopped waiting for ran: nobody to answer
                return

    @staticmethod
    def _deliver(batch: list[_Job], outputs: Sequence[Any]) -> None:
        for job, output in zip(batch, outputs):
            if job.future.done():  # a caller that went away has a cancelled future
                continue
            if isinstance(output, BaseException):
                job.future.set_exception(output)
            else:
                job.future.set_result(output)

    def _next_batch(self) -> list[_Job] | None:
        """Wait for one job, then for company until the batch is full or the first job's wait is over
        (None: closed and nothing left)."""
        with self._changed:
            self._want_first = True
            while not self._waiting:
                if self._closed:
                    return None
                self._changed.wait()
            self._want_first = False
            deadline = time.monotonic() + self._max_wait
            while (
                len(self._waiting) < self._max_batch
                and self._max_wait > 0
                and not self._closed
                and self._others(self._inside) > 0
            ):
                left = deadline - time.monotonic()
                if left <= 0 or not self._changed.wait(left):
                    break
            count = min(self._max_batch, len(self._waiting))
            batch = [self._waiting.popleft() for _ in range(count)]
            depth = len(self._waiting)
        self._on_depth(depth)
        return [job for job in batch if not job.future.done()]
