"""Dynamic batching: requests that arrive close together share one model forward.

Each image waits in one queue.  The collector takes the first waiting image, then gathers more until
the batch holds `max_batch` images or the first one has waited `max_wait_s`, and hands the batch to a
single model thread (so the event loop keeps accepting requests while the model runs, and images that
arrive during a forward form the next batch).  Each caller gets its own row of the batch's output back;
an output that is an exception fails that caller alone.  The collector is woken by the first image and
then only by a full batch, not by every arrival (with small models a wake-up costs as much as an image),
or when no other request is on its way (`others`: requests admitted but not yet here, e.g. still being
read): then there is no company to wait for, and the batch runs at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

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
    """

    def __init__(self, run: Callable[[Sequence[Any]], Sequence[Any]], *, max_batch: int, max_wait_s: float,
                 on_depth: Callable[[int], None] = lambda depth: None, others: Callable[[int], int] = lambda inside: 1) -> None:
        self._run, self._max_batch, self._max_wait = run, max_batch, max_wait_s
        self._on_depth, self._others = on_depth, others
        self._inside = 0  # callers between submit and their answer
        self._waiting: collections.deque[_Job] = collections.deque()
        self._arrived = asyncio.Event()
        self._want_first = True  # the collector waits for a first image (any arrival wakes it), else for a full batch
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="vitkit-model")
        self._task: asyncio.Task | None = None
        self._closed = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._serve(), name="vitkit-batcher")

    async def submit(self, payloads: Sequence[Any]) -> list[Any]:
        """Queue payloads (one image each) and wait for their outputs, in order; an exception of a batch
        that held one of them is raised here."""
        if self._closed:
            raise BatcherClosed("the server is shutting down")
        loop = asyncio.get_running_loop()
        jobs = [_Job(payload, loop.create_future()) for payload in payloads]
        self._waiting.extend(jobs)
        self._on_depth(len(self._waiting))
        self._inside += 1
        if self._want_first or len(self._waiting) >= self._max_batch or self._others(self._inside) <= 0:
            self._arrived.set()
        try:
            return list(await asyncio.gather(*(job.future for job in jobs)))
        finally:
            self._inside -= 1
            for job in jobs:  # a caller that gives up (error elsewhere, disconnect) frees its places
                if not job.future.cancel() and not job.future.cancelled():
                    job.future.exception()  # seen: a second failed image of one request is not logged as unretrieved

    async def close(self) -> None:
        """Refuse new work, finish what is queued, stop the model thread."""
        self._closed = True
        while self._waiting and self._task is not None and not self._task.done():
            await asyncio.sleep(0.005)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for job in self._waiting:  # only left when the collector died or never started
            if not job.future.done():
                job.future.set_exception(BatcherClosed("the server is shutting down"))
        self._thread.shutdown(wait=True)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._next_batch()
            if not batch:
                continue
            try:
                outputs = await loop.run_in_executor(self._thread, self._run, [job.payload for job in batch])
                if len(outputs) != len(batch):
                    raise RuntimeError(f"the model returned {len(outputs)} outputs for {len(batch)} inputs")
            except Exception as error:  # noqa: BLE001 - one bad batch fails its callers, not the server
                log.exception("model forward failed for a batch of %d", len(batch))
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(error)
                continue
            for job, output in zip(batch, outputs):
                if job.future.done():  # a caller that went away has a cancelled future
                    continue
                if isinstance(output, BaseException):
                    job.future.set_exception(output)
                else:
                    job.future.set_result(output)

    async def _next_batch(self) -> list[_Job]:
        """Wait for one job, then for company until the batch is full or the first job's wait is over."""
        self._want_first = True
        while not self._waiting:
            self._arrived.clear()
            await self._arrived.wait()
        self._want_first = False
        if len(self._waiting) < self._max_batch and self._max_wait > 0 and self._others(self._inside) > 0:
            self._arrived.clear()  # set again only by a full batch or the last request on its way arriving
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), self._max_wait)
        count = min(self._max_batch, len(self._waiting))
        batch = [self._waiting.popleft() for _ in range(count)]
        self._on_depth(len(self._waiting))
        return [job for job in batch if not job.future.done()]
