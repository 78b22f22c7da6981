"""Top-k predictions for image files: any Pillow mode (RGBA, L, P, CMYK, 16-bit) and any size (each
image's shorter side is resized to the model's resolution, then centre-cropped).  A file that cannot
be decoded yields an error entry for that file; the others are still predicted."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


@dataclass(frozen=True, kw_only=True)
class PredictConfig:
    """How `predict_files` runs."""

    top_k: int = 5  # classes reported per image (capped at the number of classes)
    img_size: int | None = None  # input resolution; None = the checkpoint's
    batch_size: int = 32  # images per forward pass (outputs do not depend on it)
    device: str = "auto"  # "auto" = CUDA when available

    def __post_init__(self) -> None:
        if self.top_k < 1 or self.batch_size < 1 or (self.img_size is not None and self.img_size < 1):
            raise ValueError("--top-k, --batch-size and --img-size must be positive")


def expand_inputs(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Files as given, folders replaced by the image files below them (sorted, recursive)."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                log.warning("%s holds no image files (%s)", path, ", ".join(IMAGE_SUFFIXES))
            files.extend(found)
        else:
            files.append(path)  # a missing file is reported by predict_files, not here
    return files


def _decode(path: Path, channels: int, size: int) -> torch.Tensor | str:
    """uint8 (C, size, size), or the error message for this file."""
    from vitkit.data.sources import decode_image

    if not path.is_file():
        return f"{path}: no such file"
    try:
        return decode_image(path, channels=1 if channels == 1 else 3, size=size)
    except (ValueError, OSError) as err:  # BadImageError / DecompressionBombError are ValueErrors
        message = str(err)
        return message if str(path) in message else f"{path}: {message}"


@torch.no_grad()
def predict_files(checkpoint, paths: Sequence[str | os.PathLike], config: PredictConfig) -> list[dict[str, Any]]:
    """One entry per input file, in order: {"file", "predictions": [{"class", "index", "probability"}]}
    or {"file", "error"}."""
    from vitkit.device import pick_device
    from vitkit.eval.features import channels, prepare, resolution

    model = checkpoint.model.eval()
    device = pick_device(config.device)
    model.to(device)
    size = resolution(checkpoint, config.img_size)
    files = expand_inputs(paths)
    decoded = [(path, _decode(path, channels(checkpoint), size)) for path in files]
    good = [(i, image) for i, (_, image) in enumerate(decoded) if not isinstance(image, str)]
    results: list[dict[str, Any]] = [
        {"file": str(path), "error": image} if isinstance(image, str) else {"file": str(path)} for path, image in decoded
    ]
    names = checkpoint.class_names
    for start in range(0, len(good), config.batch_size):
        chunk = good[start : start + config.batch_size]
        inputs = torch.cat([prepare(image[None].to(device), checkpoint, size) for _, image in chunk])
        probabilities = model(inputs).float().softmax(dim=-1).cpu()  # (B, K)
        top = probabilities.topk(min(config.top_k, probabilities.shape[1]), dim=-1)
        for row, (index, _) in enumerate(chunk):
            results[index]["predictions"] = [
                {"class": names[c] if names and c < len(names) else str(c), "index": c, "probability": float(p)}
                for p, c in zip(top.values[row].tolist(), top.indices[row].tolist())
            ]
    return results
