"""What the server does between the HTTP layer and the model: load and warm up in the background,
admit a bounded number of requests, decode images in a thread pool, batch them, and shape answers."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from PIL import Image
from torch import Tensor

from vitkit.data.images import BadImageError, DecompressionBombError
from vitkit.eval.predict import top_classes
from vitkit.inspect.plots import relevance_maps
from vitkit.serve.batcher import Batcher, BatcherClosed
from vitkit.serve.body import HTTPError, Upload
from vitkit.serve.config import ServeConfig
from vitkit.serve.metrics import Metrics
from vitkit.serve.model import Job, Output, ServedModel, load_model

log = logging.getLogger(__name__)

RETRY_AFTER = {"Retry-After": "1"}
INLINE_DECODE_BYTES = 64 * 1024  # smaller uploads are decoded in the model thread with their batch: for them a
# hand-off to a decoder thread costs more than the decoding (larger ones decode in the pool, in parallel)


@dataclass(frozen=True)
class Encoded:
    """An upload still to decode, waiting in the batcher: the model thread decodes it with its batch."""

    upload: Upload
    explain: bool


class Service:
    """One served checkpoint: its model (None until loaded and warmed up), batcher, decoder pool and metrics.

    Args:
        load: `load_model(path, device)` or a replacement with its signature.
        on_load_failure: called with the message when the checkpoint cannot be loaded (the server exits).
    """

    def __init__(self, path: str | os.PathLike, config: ServeConfig, *,
                 load: Callable[[str | os.PathLike, str], ServedModel] = load_model,
                 on_load_failure: Callable[[str], None] | None = None) -> None:
        self.path, self.config, self._load, self.on_load_failure = path, config, load, on_load_failure
        self.metrics = Metrics(config.max_batch)
        self.model: ServedModel | None = None
        self.load_error: str | None = None
        self.batcher: Batcher | None = None
        self._decoders = ThreadPoolExecutor(config.decode_workers, thread_name_prefix="vitkit-decode")
        self._admitted = 0

    # ---------------------------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        """Load and warm up off the event loop (/health answers 503 meanwhile), then start batching."""
        try:
            model = await asyncio.get_running_loop().run_in_executor(None, self._load_and_warm_up)
        except Exception as error:  # noqa: BLE001 - any failure to load is reported, then the server stops
            self.load_error = f"cannot serve {self.path}: {type(error).__name__}: {error}"
            log.error("%s", self.load_error)
            if self.on_load_failure is not None:
                self.on_load_failure(self.load_error)
            return
        self.batcher = Batcher(functools.partial(self._run_batch, model), max_batch=self.config.max_batch, max_wait_s=self.config.max_wait_ms / 1000,
                               others=lambda inside: self._admitted - inside, on_depth=self.metrics.queue_depth.set)
        self.batcher.start()
        self.model = model
        log.info("ready: %s at %d px on %s", model.info()["model"], model.size, model.device)

    def _load_and_warm_up(self) -> ServedModel:
        if self.config.threads is not None:
            torch.set_num_threads(self.config.threads)
        model = self._load(self.path, self.config.device)
        model.warm_up(self.config.max_batch)
        return model

    async def stop(self) -> None:
        """After the HTTP server has drained: finish queued batches, stop the threads."""
        if self.batcher is not None:
            await self.batcher.close()
        self._decoders.shutdown(wait=False, cancel_futures=True)

    def ready(self) -> ServedModel:
        """The model, or 503 with Retry-After while it loads."""
        if self.model is None:
            message = self.load_error or f"loading {self.path}; retry shortly"
            raise HTTPError(503, message, RETRY_AFTER)
        return self.model

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Hold one of `max_queue` places for a request, or answer 503 + Retry-After when all are taken."""
        if self._admitted >= self.config.max_queue:
            raise HTTPError(503, f"server busy: {self._admitted} requests in flight (--max-queue); retry shortly", RETRY_AFTER)
        self._admitted += 1
        self.metrics.in_flight.set(self._admitted)
        try:
            yield
        finally:
            self._admitted -= 1
            self.metrics.in_flight.set(self._admitted)

    # ---------------------------------------------------------------------------------- answers
    async def answer(self, uploads: Sequence[Upload], top_k: int, explain: bool) -> list[dict[str, Any]]:
        """One answer per image: {"predictions"} (+ {"attention", "overlay_png"} when explaining)."""
        model = self.ready()
        try:
            outputs: list[Output] = await self.batcher.submit(await self._jobs(model, uploads, explain))
        except BatcherClosed as error:
            raise HTTPError(503, str(error), RETRY_AFTER) from error
        answers = []
        for upload, output in zip(uploads, outputs):
            entry: dict[str, Any] = {"predictions": top_classes(output.probabilities, model.class_names, top_k)}
            if explain:
                png = await self.overlay(model, upload, output.relevance)
                entry.update(attention=self._attention(model, output.relevance), overlay_png=base64.b64encode(png).decode("ascii"))
            answers.append(entry)
        return answers

    async def overlay(self, model: ServedModel, upload: Upload, relevance: Tensor) -> bytes:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._decoders, model.overlay_png, upload.data, relevance, self.config.max_pixels)

    async def _jobs(self, model: ServedModel, uploads: Sequence[Upload], explain: bool) -> list[Job | Encoded]:
        """The batcher's payloads: large uploads decoded now in the pool, small ones left for the model thread."""
        large = [i for i, upload in enumerate(uploads) if len(upload.data) > INLINE_DECODE_BYTES]
        jobs: list[Job | Encoded] = [Encoded(upload, explain) for upload in uploads]
        if large:
            for i, inputs in zip(large, await self._prepare(model, [uploads[i] for i in large])):
                jobs[i] = Job(inputs, explain)
        return jobs

    def _run_batch(self, model: ServedModel, payloads: Sequence[Job | Encoded]) -> list[Output | HTTPError]:
        """In the model thread: decode what is still encoded, then one forward; an undecodable image's slot
        holds its HTTPError, which fails its request alone."""
        outputs: list[Output | HTTPError | None] = [None] * len(payloads)
        ready: list[tuple[int, Job]] = []
        for i, payload in enumerate(payloads):
            if isinstance(payload, Encoded):
                try:
                    payload = Job(self._decode(model, [payload.upload])[0], payload.explain)
                except HTTPError as error:
                    outputs[i] = error
                    continue
            ready.append((i, payload))
        if ready:
            self.metrics.observe_batch(len(ready))  # images per forward (undecodable ones never reach it)
            for (i, _), output in zip(ready, model.run([job for _, job in ready])):
                outputs[i] = output
        return outputs  # type: ignore[return-value]

    async def _prepare(self, model: ServedModel, uploads: Sequence[Upload]) -> list[Tensor]:
        """Model inputs of every upload, decoded in the decoder pool (one hand-off per worker, not per image)."""
        loop = asyncio.get_running_loop()
        workers = min(len(uploads), self.config.decode_workers)
        groups = [uploads[i::workers] for i in range(workers)]  # round-robin split, re-interleaved below
        decoded = await asyncio.gather(*(loop.run_in_executor(self._decoders, self._decode, model, group) for group in groups))
        inputs: list[Tensor] = [None] * len(uploads)  # type: ignore[list-item]
        for i, group in enumerate(decoded):
            inputs[i::workers] = group
        return inputs

    def _decode(self, model: ServedModel, uploads: Sequence[Upload]) -> list[Tensor]:
        """In a decoder thread: undecodable -> 400, decompression bomb -> 413, naming the upload."""
        inputs = []
        for upload in uploads:
            try:
                inputs.append(model.prepare(upload.data, self.config.max_pixels))
            except BadImageError as error:
                # Pillow refuses images over twice its own pixel limit at open time, before vitkit's check sees the size
                bomb = isinstance(error, DecompressionBombError) or isinstance(error.__cause__, Image.DecompressionBombError)
                message = re.sub(r" <_io\.BytesIO object at 0x[0-9a-f]+>", "", str(error)).replace("<bytes>", upload.name)
                raise HTTPError(413 if bomb else 400, message) from error
        return inputs

    @staticmethod
    def _attention(model: ServedModel, relevance: Tensor) -> dict[str, Any]:
        prefix = model.model.num_prefix_tokens
        return {"method": "attention rollout (Abnar & Zuidema 2020), as in Figure 6",
                "row": "[class] token" if prefix else "mean of the patch tokens (GAP)",
                "grid": list(relevance.shape), "relevance": relevance_maps(relevance[None])[0]}
