"""Running a checkpoint over a data set: batching uint8 images through the eval transform and reading
logits or a named representation (a run directory is resolved to its checkpoint by `vitkit.runs`).

Every image is transformed on its own (resize + centre crop + normalisation; no batch statistics)
and the model runs in eval mode, so an image's output does not depend on the rest of its batch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from vitkit.checkpoints import Checkpoint, limits
from vitkit.data.loader import eval_batches
from vitkit.data.transforms import eval_transform
from vitkit.device import pick_device
from vitkit.models.configs import ModelConfig, image_size, in_channels, num_classes, with_overrides

log = logging.getLogger(__name__)


def resolution(checkpoint: Checkpoint, img_size: int | None = None) -> int:
    """Input side length: `img_size` if given (position embeddings are resampled on the fly), else the model's.
    A size whose one image would take absurd work (limits.check_work) is refused before any image is read."""
    config = checkpoint.model.config
    if img_size and img_size != image_size(config):
        try:
            resized = with_overrides(config, img_size=img_size)
        except ValueError:  # not a whole number of patches: the model itself names the sizes it takes
            return img_size
        limits.check_work(resized, f"--img-size {img_size}", "choose a smaller --img-size")
    return img_size or image_size(config)


def channels(checkpoint: Checkpoint) -> int:
    return in_channels(checkpoint.model.config)


def require_classifier(checkpoint: Checkpoint | ModelConfig, where: str | os.PathLike) -> None:
    """A ValueError unless the checkpoint (or its model config) has a classification head: an encoder's
    (num_classes 0) output is its representation, which read as class scores would be noise."""
    config = checkpoint.model.config if isinstance(checkpoint, Checkpoint) else checkpoint
    if num_classes(config) == 0:
        raise ValueError(
            f"{where} has no classification head (an encoder, as pretrain-mpp and convert --num-classes 0 write "
            f"it): fine-tune it on labelled images first (vitkit finetune {where} --data URI); vitkit fewshot and "
            "embed read its representation as it is"
        )


def prepare(images: Tensor, checkpoint: Checkpoint, size: int) -> Tensor:
    """uint8 (B, C, H, W) -> the model's normalised float input at `size` x `size`."""
    return eval_transform(images, size, checkpoint.mean, checkpoint.std, channels(checkpoint))


def batches(
    checkpoint: Checkpoint, images, batch_size: int, size: int, device: torch.device
) -> Iterator[tuple[Tensor, Tensor]]:
    """(model inputs (B, C, size, size) on `device`, labels (B,)) of an `ImageSet`, in order (one batcher:
    `vitkit.data.loader.eval_batches`, as every evaluation reads)."""
    for pixels, labels in eval_batches(images, batch_size, device):
        yield prepare(pixels, checkpoint, size), labels.cpu()


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
        choices = ["logits", "features", *sorted(k for k in named if not k.startswith("attn") and k != "logits")]
        raise ValueError(f"unknown layer {layer!r}; choose from {', '.join(choices)}")
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
