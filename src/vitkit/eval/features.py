"""Running a checkpoint over a data set: finding the checkpoint in a run directory, batching uint8
images through the eval transform, and reading logits or a named representation.

Every image is transformed on its own (resize + centre crop + normalisation; no batch statistics)
and the model runs in eval mode, so an image's output does not depend on the rest of its batch.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Iterator

import torch
from torch import Tensor, nn

from vitkit.checkpoints import Checkpoint, read
from vitkit.checkpoints.native import is_native
from vitkit.models.configs import image_size, in_channels

log = logging.getLogger(__name__)

FINAL_NAMES = ("final", "last", "latest")  # preferred checkpoint names inside a run's checkpoints/


def find_checkpoint(path: str | os.PathLike) -> Path:
    """The checkpoint a path names: itself, or the one a run directory's `checkpoints/` points at.

    In a run directory from `vitkit train` (checkpoints/step_NNNNNNN/, a LATEST file naming the
    newest, and checkpoints/ema/ with the Polyak-averaged weights at the end of a run that uses
    them): the `ema` export when it is at least as new as LATEST's target (the run's own evaluations
    use those weights), else LATEST's target.  Without LATEST: a checkpoint named final/last/latest,
    else the newest by modification time (then by the step number in its name).  Any other path is
    returned unchanged for `vitkit.checkpoints.read` to detect its format.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (expected a checkpoint or a run directory)")
    if not path.is_dir() or is_native(path):
        return path
    folder = path / "checkpoints" if (path / "checkpoints").is_dir() else path
    candidates = [p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".") and is_native(p)]
    if not candidates:
        if folder is path:
            return path  # maybe a foreign-format directory (e.g. a Hugging Face folder)
        raise FileNotFoundError(f"{folder} holds no complete vitkit checkpoint (a folder with config.json + model.safetensors)")

    def mtime(p: Path) -> float:
        return (p / "config.json").stat().st_mtime

    pointer = folder / "LATEST"
    if pointer.is_file():
        latest = folder / pointer.read_text().strip()
        if not is_native(latest):
            raise ValueError(f"{pointer} names {latest.name}, which is missing or incomplete")
        ema = folder / "ema"
        return ema if is_native(ema) and mtime(ema) >= mtime(latest) else latest
    for name in FINAL_NAMES:
        for candidate in candidates:
            if candidate.name == name:
                return candidate

    def order(p: Path) -> tuple[float, int]:
        digits = re.findall(r"\d+", p.name)
        return (mtime(p), int(digits[-1]) if digits else -1)

    return max(candidates, key=order)


def open_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read the checkpoint `path` names (see `find_checkpoint`), model in eval mode."""
    found = find_checkpoint(path)
    if found != Path(path):
        log.info("using checkpoint %s", found)
    checkpoint = read(found)
    checkpoint.model.eval()
    return checkpoint


def pick_device(device: str = "auto") -> torch.device:
    """"auto" = CUDA when available, else CPU; any torch device string otherwise."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolution(checkpoint: Checkpoint, img_size: int | None = None) -> int:
    """Input side length: `img_size` if given (position embeddings are resampled on the fly), else the model's."""
    return img_size or image_size(checkpoint.model.config)


def channels(checkpoint: Checkpoint) -> int:
    return in_channels(checkpoint.model.config)


def prepare(images: Tensor, checkpoint: Checkpoint, size: int) -> Tensor:
    """uint8 (B, C, H, W) -> the model's normalised float input at `size` x `size`."""
    from vitkit.data.transforms import eval_transform

    return eval_transform(images, size, checkpoint.mean, checkpoint.std, channels(checkpoint))


def batches(checkpoint: Checkpoint, images, batch_size: int, size: int, device: torch.device) -> Iterator[tuple[Tensor, Tensor]]:
    """(model inputs (B, C, size, size) on `device`, labels (B,)) of an `ImageSet`, in order.

    In-memory sets are sliced; file-based sets are decoded file by file, each image transformed on
    its own, so a batch can mix source sizes.
    """
    if getattr(images, "access", "") == "stream":  # tar shards / Parquet: read front to back, decoded at load_size
        from vitkit.data.stream import eval_batches

        for pixels, labels in eval_batches(images, batch_size, device):
            yield prepare(pixels, checkpoint, size), labels.cpu()
        return
    total = len(images)
    for start in range(0, total, batch_size):
        stop = min(start + batch_size, total)
        labels = images.labels[start:stop]
        if images.images is not None:
            yield prepare(images.images[start:stop].to(device), checkpoint, size), labels
            continue
        decoded = [images.read(i)[None].to(device) for i in range(start, stop)]  # (1, C, H, W) each
        yield torch.cat([prepare(image, checkpoint, size) for image in decoded]), labels


@torch.no_grad()
def run_model(model: nn.Module, inputs: Tensor, layer: str) -> Tensor:
    """The output named `layer` for a float batch: "logits", "features" (what the head reads, i.e.
    `forward_features`), or any name of `forward_intermediates` ("y", "pre_logits", "blockNN", ...)."""
    if layer == "logits":
        return model(inputs)
    if layer == "features":
        return model.forward_features(inputs)
    if not hasattr(model, "forward_intermediates") or not hasattr(model, "blocks"):
        if layer in ("y", "pre_logits"):  # a ResNet's representation is its pooled features
            return model.forward_features(inputs)
        raise ValueError(f"layer {layer!r} needs a ViT; this model offers 'features', 'pre_logits' and 'logits'")
    named = model.forward_intermediates(inputs, attention_layers=())
    if layer not in named:
        raise ValueError(f"unknown layer {layer!r}; choose from {sorted(k for k in named if not k.startswith('attn'))}")
    return named[layer]


@torch.no_grad()
def compute(
    checkpoint: Checkpoint,
    images,
    layer: str = "logits",
    *,
    img_size: int | None = None,
    batch_size: int = 64,
    device: str = "auto",
) -> tuple[Tensor, Tensor]:
    """(outputs on the CPU in float32, labels) of `layer` for every image of an `ImageSet`."""
    model = checkpoint.model.eval()
    target = pick_device(device)
    model.to(target)
    size = resolution(checkpoint, img_size)
    outputs, labels = [], []
    for inputs, batch_labels in batches(checkpoint, images, batch_size, size, target):
        outputs.append(run_model(model, inputs, layer).float().cpu())
        labels.append(batch_labels)
    if not outputs:
        raise ValueError("the data set is empty")
    return torch.cat(outputs), torch.cat(labels)
