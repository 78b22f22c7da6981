"""What runs one batch for the batcher: decode the uploads, one forward, shape each image's answer.

`LocalEngine` does it in the calling thread: the batcher's model thread in the server process, or
the main thread of the model process of worker.py.  Every slot of a batch gets an `Answer` or the `HTTPError` of its own
image (undecodable 400, decompression bomb 413), so one bad image fails its request alone (in a form, its
entry alone: service.py).  Small
uploads are decoded inline with their batch (a hand-off costs more than decoding them); large ones
in a thread pool, in parallel (Pillow releases the GIL while decoding).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vitkit import host as hosts
from vitkit.data.images import BadImageError, DecompressionBombError
from vitkit.inspect.plots import relevance_maps
from vitkit.serve.body import HTTPError, Upload
from vitkit.serve.config import ServeConfig
from vitkit.serve.model import Job, ServedModel

INLINE_DECODE_BYTES = 64 * 1024  # smaller uploads are decoded inline, larger ones in the pool


@dataclass(frozen=True)
class Encoded:
    """One image waiting in the batcher, still encoded, and whether its attention map is wanted."""

    upload: Upload
    explain: bool = False


@dataclass(frozen=True)
class Answer:
    """One image's result: class probabilities (K,) and, when explained, the rollout map and PNG overlay."""

    probabilities: np.ndarray
    attention: dict[str, Any] | None = None
    overlay_png: bytes | None = None


@dataclass(frozen=True)
class Description:
    """What the HTTP side knows of the model: /health's fields, class names, whether it can explain."""

    info: dict[str, Any]
    class_names: list[str]
    explainable: bool


class LocalEngine:
    """Runs batches of `Encoded` images through one `ServedModel` in the calling thread."""

    def __init__(self, model: ServedModel, config: ServeConfig) -> None:
        self.model, self.max_pixels = model, config.max_pixels
        self._pool = ThreadPoolExecutor(config.decode_workers, thread_name_prefix="vitkit-decode")
        self.description = Description(model.info(), model.class_names, model.explainable)

    @classmethod
    def start(
        cls, path: str | os.PathLike, config: ServeConfig, load: Callable[[str | os.PathLike, str], ServedModel]
    ) -> LocalEngine:
        """Set the torch threads, load `path`, warm up: in the server process or in the model process alike."""
        if config.threads is not None:
            hosts.set_threads(config.threads)
        engine = cls(load(path, config.device), config)
        engine.model.warm_up(config.max_batch)
        return engine

    def run(self, payloads: Sequence[Encoded]) -> list[Answer | HTTPError]:
        inputs = self._decode_all(payloads)
        ready = [i for i, item in enumerate(inputs) if not isinstance(item, HTTPError)]
        results: list[Answer | HTTPError] = list(inputs)  # the errors stay in their slots
        if not ready:
            return results
        outputs = self.model.run([Job(inputs[i], payloads[i].explain) for i in ready])
        explained = [(i, output) for i, output in zip(ready, outputs) if output.relevance is not None]
        overlays = self._pool.map(
            lambda pair: self.model.overlay_png(payloads[pair[0]].upload.data, pair[1].relevance, self.max_pixels),
            explained,
        )
        drawn = {i: (self._attention(output.relevance), png) for (i, output), png in zip(explained, overlays)}
        probabilities = torch.stack([output.probabilities for output in outputs]).float().cpu().numpy()
        for row, (i, _output) in enumerate(zip(ready, outputs)):
            attention, png = drawn.get(i, (None, None))
            results[i] = Answer(probabilities[row], attention, png)
        return results

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _decode_all(self, payloads: Sequence[Encoded]) -> list[Tensor | HTTPError]:
        large = {
            i: self._pool.submit(self._decode, payload.upload)
            for i, payload in enumerate(payloads)
            if len(payload.upload.data) > INLINE_DECODE_BYTES
        }
        return [large[i].result() if i in large else self._decode(payload.upload) for i, payload in enumerate(payloads)]

    def _decode(self, upload: Upload) -> Tensor | HTTPError:
        """The decoded pixels of one upload, or its error naming the upload."""
        try:
            return self.model.decode(upload.data, self.max_pixels)
        except BadImageError as error:
            # Pillow refuses images over twice its own pixel limit at open time, before vitkit's check sees the size
            bomb = isinstance(error, DecompressionBombError) or isinstance(
                error.__cause__, Image.DecompressionBombError
            )
            message = re.sub(r" <_io\.BytesIO object at 0x[0-9a-f]+>", "", str(error)).replace("<bytes>", upload.name)
            return HTTPError(413 if bomb else 400, message)

    def _attention(self, relevance: Tensor) -> dict[str, Any]:
        prefix = self.model.model.num_prefix_tokens
        return {
            "method": "attention rollout (Abnar & Zuidema 2020), as in Figure 6",
            "row": "[class] token" if prefix else "mean of the patch tokens (GAP)",
            "grid": list(relevance.shape),
            "relevance": relevance_maps(relevance[None])[0],
        }
