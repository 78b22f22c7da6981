"""The model in its own process: `vitkit serve`'s default engine.

The HTTP process parses requests, keeps the queue and formats answers; a child process (started with
"spawn") loads the checkpoint and runs a `LocalEngine`: decoding, the forward, rollouts and overlays.
The two share no interpreter lock, so the event loop keeps answering while a batch decodes and runs;
with small models one shared lock, not the forward, would be the limit (one image per request on the
Fashion-MNIST model: benchmarks/serve_load.py, docs/serving.md).

The pipe carries whole batches both ways: the encoded uploads in, one `Answer` or `HTTPError` per
image out (numpy arrays, not tensors: no shared-memory hand-off per tensor).  The child ignores
SIGINT/SIGTERM (the server drains, then closes the pipe) and exits when the pipe closes, also when
the server is killed.  A child that dies in a batch (a crashing decoder, out of memory) fails that
batch and is started again for the next one.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from vitkit.data.workers import STOP_SIGNALS, stop_signals_blocked
from vitkit.serve.body import HTTPError
from vitkit.serve.config import ServeConfig
from vitkit.serve.engine import Answer, Description, Encoded

log = logging.getLogger(__name__)

STOP = None  # what the server sends to end the child


class ModelProcessError(RuntimeError):
    """The model process could not load the checkpoint, failed a batch, or died."""


class ProcessEngine:
    """Runs batches in a child process; `run` blocks the calling thread (the batcher's model thread) while
    the child works, without holding the GIL."""

    def __init__(self, path: str | os.PathLike, config: ServeConfig, *, start: bool = True) -> None:
        self.path, self.config = str(path), config
        self._process: Any = None
        self._conn: Connection | None = None
        self._cancelled = False
        self.description: Description | None = None  # what the HTTP side reads; a restart serves the same checkpoint
        if start:
            self.start()

    def start(self) -> Description:
        """Start the model process and wait until it has loaded and warmed up (blocks: call it off the event loop;
        `cancel` from another thread ends the wait)."""
        self.description = self._start()
        return self.description

    def cancel(self) -> None:
        """The server stops before the model is ready: end the process still loading or warming up (it ignores
        SIGTERM), so `start` raises ModelProcessError at once instead of the exit waiting for the load."""
        self._cancelled = True
        process = self._process
        if process is not None and process.is_alive():
            process.kill()

    def run(self, payloads: Sequence[Encoded]) -> list[Answer | HTTPError]:
        """One `Answer` or `HTTPError` per image; a child that dies in the batch fails it and is restarted."""
        if self._process is None or not self._process.is_alive():  # died between batches, or a restart failed
            log.error("the model process is gone (exit code %s); starting a new one", self._reap())
            self._start()
        try:
            self._conn.send(list(payloads))
            kind, value = self._conn.recv()
        except (EOFError, OSError) as error:
            code = self._reap()
            log.error("the model process died in a batch of %d (exit code %s); starting a new one", len(payloads), code)
            self._start()
            raise ModelProcessError(
                f"the model process died in this batch (exit code {code}) and was restarted"
            ) from error
        if kind != "answers":
            raise ModelProcessError(value)
        return value

    @property
    def pid(self) -> int:
        return self._process.pid

    def close(self) -> None:
        """Stop the child (the batcher has drained: nothing is in it) and wait for it."""
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.send(STOP)
            self._conn.close()
        self._reap()

    def _start(self) -> Description:
        if self._conn is not None:  # the pipe of a process that died
            with contextlib.suppress(OSError):
                self._conn.close()
        context = multiprocessing.get_context("spawn")  # no fork of a process with threads and torch state
        ours, theirs = context.Pipe()
        self._process = context.Process(
            target=serve_batches, args=(theirs, self.path, self.config), name="vitkit-model", daemon=True
        )
        with stop_signals_blocked("spawn"):  # until the child ignores them: a group's Ctrl-C ended it while loading
            self._process.start()
        theirs.close()
        self._conn = ours
        if self._cancelled:  # `cancel` came while the process started
            self._process.kill()
        try:
            kind, value = ours.recv()
        except EOFError as error:
            code = self._reap()
            ended = "was stopped" if self._cancelled else f"exited with {code}"
            raise ModelProcessError(f"the model process {ended} while loading {self.path}") from error
        if kind != "ready":
            self._reap()
            raise ModelProcessError(value)
        log.info("model process %d ready", self._process.pid)
        return value

    def _reap(self) -> int | None:
        process, self._process = self._process, None
        if process is None:
            return None
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join()
        return process.exitcode


def serve_batches(conn: Connection, path: str, config: ServeConfig) -> None:
    """The child's whole life: load and warm up, say so, then answer batches until STOP or the pipe closes."""
    from vitkit.serve.engine import LocalEngine
    from vitkit.serve.model import load_model

    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)  # the server decides when this process ends
    if hasattr(signal, "pthread_sigmask"):  # POSIX
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # blocked since it started: now ignored
    try:
        engine = LocalEngine.start(path, config, load_model)
    except Exception as error:  # noqa: BLE001 - reported to the server, which exits with the message
        conn.send(("failed", f"{type(error).__name__}: {error}"))
        return
    conn.send(("ready", engine.description))
    while True:
        try:
            payloads = conn.recv()
        except (EOFError, OSError):
            break
        if payloads is STOP:
            break
        try:
            reply = ("answers", engine.run(payloads))
        except Exception as error:  # noqa: BLE001 - the batch fails, the process goes on
            reply = ("failed", f"the model failed this batch: {type(error).__name__}: {error}")
        conn.send(reply)
    engine.close()
