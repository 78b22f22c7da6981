"""What the server does between the HTTP layer and the model: start the engine in the background,
admit a bounded number of requests, batch their images, and shape the answers."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from vitkit.eval.predict import top_classes
from vitkit.serve.batcher import Batcher, BatcherClosed
from vitkit.serve.body import BodyBudget, HTTPError, Upload
from vitkit.serve.config import ServeConfig
from vitkit.serve.engine import Answer, Description, Encoded, LocalEngine
from vitkit.serve.metrics import Metrics
from vitkit.serve.model import ServedModel, load_model
from vitkit.serve.worker import ModelProcessError, ProcessEngine

_GONE = (BatcherClosed, ModelProcessError)  # no answer for now: 503 with Retry-After

log = logging.getLogger(__name__)

RETRY_AFTER = {"Retry-After": "1"}


class Service:
    """One served checkpoint: its engine (None until loaded and warmed up), batcher and metrics.

    The engine runs the model in a child process (`config.model_process`, worker.py) or in a thread
    of this one (`LocalEngine`).

    Args:
        load: `load_model(path, device)` or a replacement with its signature (in-process engine only).
        on_load_failure: called with the message when the checkpoint cannot be loaded (the server exits).
    """

    def __init__(
        self,
        path: str | os.PathLike,
        config: ServeConfig,
        *,
        load: Callable[[str | os.PathLike, str], ServedModel] = load_model,
        on_load_failure: Callable[[str], None] | None = None,
    ) -> None:
        if config.model_process and load is not load_model:
            raise ValueError("a custom load function runs in this process: use ServeConfig(model_process=False)")
        self.path, self.config, self._load, self.on_load_failure = path, config, load, on_load_failure
        self.metrics = Metrics(config.max_batch)
        self.engine: LocalEngine | ProcessEngine | None = None
        self.model: Description | None = None
        self.load_error: str | None = None
        self.batcher: Batcher | None = None
        self.bodies = BodyBudget(config.max_bodies_bytes)  # request bodies in memory, over all requests
        self._admitted = 0
        self.cut = 0  # requests the drain timeout cut short (answered 503)
        self._starting: ProcessEngine | None = None  # a model process still loading, which `stop` ends
        self._stopping = False

    # ---------------------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Start the engine off the event loop (/health answers 503 meanwhile), then start batching."""
        try:
            self.engine = await asyncio.get_running_loop().run_in_executor(None, self._start_engine)
        except Exception as error:  # noqa: BLE001 - any failure to load is reported, then the server stops
            if self._stopping:  # `stop` ended the load: no failure
                return
            reason = (
                str(error) if isinstance(error, ModelProcessError) else f"{type(error).__name__}: {error}"
            )  # the child names its own
            self.load_error = f"cannot serve {self.path}: {reason}"
            log.error("%s", self.load_error)
            if self.on_load_failure is not None:
                self.on_load_failure(self.load_error)
            return
        self.batcher = Batcher(
            self._run_batch,
            max_batch=self.config.max_batch,
            max_wait_s=self.config.max_wait_ms / 1000,
            others=lambda inside: self._admitted - inside,
            on_depth=self.metrics.queue_depth.set,
            foreseen=(ModelProcessError,),
        )
        self.batcher.start()
        self.model = self.engine.description
        info = self.model.info
        where = "a model process" if self.config.model_process else "this process"
        log.info("ready: %s at %d px on %s, in %s", info["model"], info["resolution"], info["device"], where)

    def _start_engine(self) -> LocalEngine | ProcessEngine:
        if self.config.model_process:
            self._starting = ProcessEngine(self.path, self.config, start=False)
            if self._stopping:  # `stop` came before this thread began
                self._starting.cancel()
            self._starting.start()
            return self._starting
        return LocalEngine.start(self.path, self.config, self._load)

    async def stop(self) -> None:
        """After the HTTP server has drained: finish queued batches, stop the engine.  A model process still
        loading is ended (an in-process load cannot be: the exit waits for it)."""
        self._stopping = True
        if self.engine is None and self._starting is not None:
            log.info("stopping before the model was ready")
            self._starting.cancel()
        if self.batcher is not None:
            await self.batcher.close(self.config.drain_timeout_s)
        if self.engine is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.engine.close)

    def ready(self) -> Description:
        """The model's description, or 503 with Retry-After while it loads."""
        if self.model is None:
            message = self.load_error or f"loading {self.path}; retry shortly"
            raise HTTPError(503, message, RETRY_AFTER)
        return self.model

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Hold one of `max_queue` places for a request, or answer 503 + Retry-After when all are taken."""
        if self._admitted >= self.config.max_queue:
            raise HTTPError(
                503, f"server busy: {self._admitted} requests in flight (--max-queue); retry shortly", RETRY_AFTER
            )
        self._admitted += 1
        self.metrics.in_flight.set(self._admitted)
        try:
            yield
        finally:
            self._admitted -= 1
            self.metrics.in_flight.set(self._admitted)

    # ---------------------------------------------------------------------------------- answers
    async def answer(
        self, uploads: Sequence[Upload], top_k: int, explain: bool, *, each: bool = False
    ) -> list[dict[str, Any]]:
        """One answer per image: {"predictions"} (+ {"attention", "overlay_png"} when explaining).  With `each`
        (a form of several files) an image that does not decode is answered {"error"} in its place, and the
        request fails only where none decodes."""
        model = self.ready()
        try:
            answers = await self.batcher.submit([Encoded(upload, explain) for upload in uploads], each=each)
        except _GONE as error:  # shutting down, or the model process died (and restarted)
            raise HTTPError(503, str(error), RETRY_AFTER) from error
        failed = [answer for answer in answers if isinstance(answer, BaseException)]
        for error in failed:  # the server's trouble, or every image's: the request's status
            if not (isinstance(error, HTTPError) and error.status < 500) or len(failed) == len(answers):
                raise HTTPError(503, str(error), RETRY_AFTER) if isinstance(error, _GONE) else error
        entries = []
        for answer in answers:
            if isinstance(answer, HTTPError):
                entries.append({"error": answer.message})
                continue
            entry: dict[str, Any] = {
                "predictions": top_classes(torch.from_numpy(answer.probabilities), model.class_names, top_k)
            }
            if explain:
                entry.update(
                    attention=answer.attention, overlay_png=base64.b64encode(answer.overlay_png).decode("ascii")
                )
            entries.append(entry)
        return entries

    def _run_batch(self, payloads: Sequence[Encoded]) -> list[Answer | HTTPError]:
        """In the model thread: the engine's answers; the images that reached the forward are counted."""
        answers = self.engine.run(payloads)
        forwarded = sum(isinstance(answer, Answer) for answer in answers)
        if forwarded:
            self.metrics.observe_batch(forwarded)
        return answers
