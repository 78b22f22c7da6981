"""Top-k predictions for image files: any Pillow mode (RGBA, L, P, CMYK, 16-bit) and any size (each
image's shorter side is resized to the model's resolution, then centre-cropped).  A file that cannot
be decoded yields an error entry for that file; the others are still predicted.

The per-image path (`decode_input` -> `model_input` -> `class_probabilities` -> `top_classes`) is the
one `vitkit serve` runs too, so the server answers what `vitkit predict` prints."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vitkit.data.images import MAX_PIXELS, decode_image
from vitkit.device import pick_device
from vitkit.eval.evaluator import ranked
from vitkit.eval.features import channels, prepare, resolution

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm")


@dataclass(frozen=True, kw_only=True)
class PredictConfig:
    """How `predict_files` runs."""

    top_k: int = 5  # classes reported per image (capped at the number of classes)
    img_size: int | None = None  # input resolution; None = the checkpoint's
    batch_size: int = 32  # images per forward pass (outputs do not depend on it)
    device: str = "auto"  # "auto" = CUDA when available
    max_pixels: int = MAX_PIXELS  # larger images are refused from their header (decompression bombs)

    def __post_init__(self) -> None:
        sizes = (("top_k", self.top_k), ("batch_size", self.batch_size), ("img_size", self.img_size))
        for field, value in (*sizes, ("max_pixels", self.max_pixels)):
            if value is not None and value < 1:  # the command's flags refuse these first
                raise ValueError(f"PredictConfig.{field} must be positive, got {value}")


def expand_inputs(paths: Sequence[str | os.PathLike], *, refuse_empty: bool = False) -> list[Path]:
    """Files as given, folders replaced by the image files below them (sorted, recursive; hidden files and
    folders aside, as a training folder's; a link to a missing file kept, to be reported).  Folders without
    any are said; `refuse_empty`: where that leaves nothing, a ValueError naming them instead (the command's
    one error line)."""
    files: list[Path] = []
    empty: list[str] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(
                p
                for p in path.rglob("*")
                if (p.is_file() or _dangling(p))
                and p.suffix.lower() in IMAGE_SUFFIXES
                and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
            if not found:
                empty.append(str(path))
            files.extend(found)
        else:
            files.append(path)  # a missing file is reported by predict_files, not here
    kinds = ", ".join(IMAGE_SUFFIXES)
    if refuse_empty and empty and not files:
        raise ValueError(f"no image files ({kinds}) in {', '.join(empty)}")
    for folder in empty:
        log.warning("%s holds no image files (%s)", folder, kinds)
    return files


def decode_input(
    source: str | os.PathLike | bytes, checkpoint, size: int, *, max_pixels: int = MAX_PIXELS
) -> torch.Tensor:
    """One image file (or its encoded bytes) -> uint8 (C, size, size) in the checkpoint's channels:
    any Pillow mode converted, shorter side resized to `size`, centre-cropped.

    Raises:
        BadImageError: not a decodable image; DecompressionBombError (a BadImageError): more than `max_pixels`.
    """
    return decode_image(source, channels=1 if channels(checkpoint) == 1 else 3, size=size, max_pixels=max_pixels)


def model_input(image: torch.Tensor, checkpoint, size: int, device: torch.device) -> torch.Tensor:
    """uint8 (C, H, W) -> the model's normalised float input (1, C, size, size) on `device`; each image
    is transformed alone, so a batch is the concatenation of these."""
    return prepare(image[None].to(device), checkpoint, size)


def class_probabilities(model: torch.nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    """Softmax over the classes of a batch of model inputs, (B, K) float32 on the CPU."""
    return model(inputs).float().softmax(dim=-1).cpu()


def top_classes(probabilities: torch.Tensor, class_names: Sequence[str] | None, top_k: int) -> list[dict[str, Any]]:
    """The `top_k` most probable classes of one image's (K,) probabilities, most probable first:
    [{"class", "index", "probability"}] (the class is the index as a string without class names)."""
    indices = ranked(probabilities, top_k).tolist()
    return [{"class": class_label(class_names, c), "index": c, "probability": float(probabilities[c])} for c in indices]


def class_label(class_names: Sequence[str] | None, index: int) -> str:
    """Class `index`'s name, or the index as a string where the model has no name for it."""
    names = class_names or []
    return names[index] if index < len(names) else str(index)


def _dangling(path: Path) -> bool:
    """A symbolic link whose target does not exist."""
    return path.is_symlink() and not path.exists()


def _decode(path: Path, checkpoint, size: int, max_pixels: int = MAX_PIXELS) -> torch.Tensor | str:
    """uint8 (C, size, size), or the error message for this file."""
    if _dangling(path):
        return f"{path}: a symbolic link to {os.readlink(path)}, which does not exist"
    if not path.exists():
        return f"{path}: no such file"
    if not path.is_file():
        return f"{path}: not a regular file (a folder, device or FIFO is not an image)"
    try:
        return decode_input(path, checkpoint, size, max_pixels=max_pixels)
    except (ValueError, OSError) as err:  # BadImageError / DecompressionBombError are ValueErrors
        message = str(err)
        return message if str(path) in message else f"{path}: {message}"


@torch.no_grad()
def predict_files(checkpoint, paths: Sequence[str | os.PathLike], config: PredictConfig) -> list[dict[str, Any]]:
    """One entry per input file, in order: {"file", "predictions": [{"class", "index", "probability"}]}
    or {"file", "error"}.  Files are decoded a batch at a time, so a folder of any size fits in memory."""
    model = checkpoint.model.eval()
    device = pick_device(config.device)
    model.to(device)
    size = resolution(checkpoint, config.img_size)
    files = expand_inputs(paths)
    results: list[dict[str, Any]] = []
    for start in range(0, len(files), config.batch_size):
        results += _predict_batch(model, checkpoint, files[start : start + config.batch_size], size, device, config)
    return results


def _predict_batch(model, checkpoint, files: list[Path], size: int, device, config: PredictConfig) -> list[dict]:
    """`predict_files` of one batch of files: those that decode pass forward together."""
    decoded = [_decode(path, checkpoint, size, config.max_pixels) for path in files]
    results: list[dict[str, Any]] = [
        {"file": str(path), "error": image} if isinstance(image, str) else {"file": str(path)}
        for path, image in zip(files, decoded, strict=True)
    ]
    good = [(i, image) for i, image in enumerate(decoded) if not isinstance(image, str)]
    if good:
        inputs = torch.cat([model_input(image, checkpoint, size, device) for _, image in good])
        probabilities = class_probabilities(model, inputs)
        for row, (index, _) in enumerate(good):
            results[index]["predictions"] = top_classes(probabilities[row], checkpoint.class_names, config.top_k)
    return results
