"""The model behind `vitkit serve`: loading, the per-image input path shared with `vitkit predict`, the
batched forward, and the attention-rollout explanation (Figure 6, App. D.7) with its PNG overlay."""

from __future__ import annotations

import io
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vitkit.eval.features import prepare, require_classifier
from vitkit.eval.predict import class_label, class_probabilities, decode_input
from vitkit.inspect.attention import attention_rollout, rollout_map
from vitkit.models.configs import config_to_dict, num_classes

log = logging.getLogger(__name__)

OVERLAY_SIDE = 224  # the overlay PNG is drawn at least this large (small models' inputs are tiny)


@dataclass(frozen=True)
class Job:
    """One image for the model: its decoded pixels, uint8 (C, S, S), and whether its rollout is wanted."""

    pixels: Tensor
    explain: bool = False


@dataclass(frozen=True)
class Output:
    """One image's answer: class probabilities (K,) and, for explained images, the rollout map (gh, gw)."""

    probabilities: Tensor
    relevance: Tensor | None = None


class ServedModel:
    """A checkpoint ready to serve on one device (model in eval mode)."""

    def __init__(self, checkpoint, source: str, device: str = "auto") -> None:
        from vitkit.device import pick_device
        from vitkit.eval.features import channels, resolution

        self.checkpoint, self.source = checkpoint, source
        self.device = pick_device(device)
        self.model = checkpoint.model.eval().to(self.device)
        self.size, self.channels = resolution(checkpoint), channels(checkpoint)
        self.class_names = list(checkpoint.class_names or [])
        self.explainable = hasattr(self.model, "blocks") and hasattr(self.model, "forward_intermediates")

    def info(self) -> dict[str, Any]:
        """What /health reports."""
        config = config_to_dict(self.model.config)
        fields = ", ".join(
            f"{key}={config[key]}" for key in ("hidden_size", "depth", "num_heads", "patch_size") if key in config
        )
        classes = num_classes(self.model.config)
        return {
            "model": f"{type(self.model).__name__} ({fields})" if fields else type(self.model).__name__,
            "checkpoint": self.source,
            "classes": [class_label(self.class_names, c) for c in range(classes)],
            "num_classes": classes,
            "resolution": self.size,
            "channels": self.channels,
            "device": str(self.device),
            "explain": self.explainable,
        }

    def decode(self, data: bytes, max_pixels: int) -> Tensor:
        """Encoded image bytes -> uint8 (C, S, S), as `vitkit predict` decodes a file."""
        return decode_input(data, self.checkpoint, self.size, max_pixels=max_pixels)

    @torch.inference_mode()
    def run(self, jobs: Sequence[Job]) -> list[Output]:
        """One forward for the whole batch; the rollout only for the images that asked for it.  The pixels
        are normalised together: the same elementwise arithmetic as `vitkit predict`'s per-image path."""
        inputs = prepare(torch.stack([job.pixels for job in jobs]).to(self.device), self.checkpoint, self.size)
        probabilities = class_probabilities(self.model, inputs)
        wanted = [i for i, job in enumerate(jobs) if job.explain]
        maps: dict[int, Tensor] = {}
        if wanted:
            maps = dict(zip(wanted, self.relevance(inputs[wanted])))
        return [Output(probabilities[i], maps.get(i)) for i in range(len(jobs))]

    def relevance(self, inputs: Tensor) -> Tensor:
        """Attention-rollout relevance of every input patch for the representation, (B, gh, gw) float32.

        The weights A of every layer come from `forward_intermediates` (as `vitkit inspect` reads
        them); the [class] row of the rollout is used, or the mean of the patch rows for GAP models.
        """
        layers = range(len(self.model.blocks))
        named = self.model.forward_intermediates(inputs, attention_layers=layers)
        attns = [named[f"attn{i:02d}"] for i in layers]  # L x (B, k, T, T)
        prefix = self.model.num_prefix_tokens
        side = math.isqrt(attns[0].shape[-1] - prefix)  # square inputs: a side x side patch grid
        return rollout_map(attention_rollout(attns), (side, side), prefix).float().cpu()

    def overlay_png(self, data: bytes, relevance: Tensor, max_pixels: int) -> bytes:
        """PNG of the input as the model saw it (same crop), multiplied by the upsampled rollout map (Figure 6)."""
        from vitkit.inspect.plots import overlay

        side = max(self.size, OVERLAY_SIDE)
        image = decode_input(data, self.checkpoint, side, max_pixels=max_pixels)
        picture = overlay(image, relevance)  # (H, W, 3) in [0, 1]
        buffer = io.BytesIO()
        Image.fromarray(np.clip(np.rint(picture * 255), 0, 255).astype(np.uint8), "RGB").save(buffer, format="PNG")
        return buffer.getvalue()

    def warm_up(self, max_batch: int) -> None:
        """Run the shapes the server will run (one image, a full batch, one explanation) before /health says ready."""
        blank = torch.zeros(self.channels, self.size, self.size, dtype=torch.uint8)
        for count in sorted({1, max_batch}):
            self.run([Job(blank)] * count)
        if self.explainable:
            self.run([Job(blank, explain=True)])


def load_model(path: str | os.PathLike, device: str = "auto") -> ServedModel:
    """Open any checkpoint vitkit reads, or a run directory's checkpoint; the one place `serve` loads from."""
    from vitkit.runs import find_checkpoint, open_checkpoint

    checkpoint = open_checkpoint(path)
    require_classifier(checkpoint, path)
    source = str(find_checkpoint(path))
    log.info("serving %s", source)
    return ServedModel(checkpoint, source, device)
