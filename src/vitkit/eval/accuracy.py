"""Classification accuracy of a checkpoint: top-1 / top-5, per-class accuracy and the confusion matrix."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """How `evaluate` runs a checkpoint over a data split."""

    img_size: int | None = None  # input resolution; None = the checkpoint's (others resample position embeddings)
    batch_size: int = 64  # images per forward pass (results do not depend on it)
    top_k: int = 5  # the second accuracy reported, capped at the number of classes
    device: str = "auto"  # "auto" = CUDA when available

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.top_k < 1 or (self.img_size is not None and self.img_size < 1):
            raise ValueError("batch_size, top_k and img_size must be positive")


@dataclass
class EvalResult:
    """Accuracies and confusion matrix; confusion[i, j] counts images of true class i predicted as j."""

    top1: float
    topk: float
    k: int
    per_class: list[float | None]  # None for a class with no test image
    confusion: list[list[int]]
    class_names: list[str]
    num_images: int
    img_size: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "top1": self.top1,
            f"top{self.k}": self.topk,
            "num_images": self.num_images,
            "img_size": self.img_size,
            "class_names": self.class_names,
            "per_class": dict(zip(self.class_names, self.per_class)),
            "confusion": self.confusion,
        }


def topk_accuracy(logits: Tensor, labels: Tensor, k: int) -> float:
    """Share of images whose label is among the k highest logits (k capped at the number of classes)."""
    k = min(k, logits.shape[1])
    top = logits.topk(k, dim=1).indices  # (N, k)
    return float((top == labels[:, None]).any(dim=1).double().mean())


def confusion_matrix(predictions: Tensor, labels: Tensor, num_classes: int) -> Tensor:
    """(K, K) int64 counts: row = true class, column = predicted class."""
    flat = labels.long() * num_classes + predictions.long()
    return torch.bincount(flat, minlength=num_classes * num_classes).reshape(num_classes, num_classes)


def accuracy_from_logits(logits: Tensor, labels: Tensor, class_names: list[str], k: int = 5) -> EvalResult:
    """All metrics from (N, K) logits and (N,) labels."""
    num_classes = logits.shape[1]
    if len(class_names) != num_classes:
        raise ValueError(f"the model predicts {num_classes} classes but the data has {len(class_names)}")
    if labels.numel() and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels must lie in 0..{num_classes - 1}")
    confusion = confusion_matrix(logits.argmax(dim=1), labels, num_classes)
    totals = confusion.sum(dim=1)
    per_class = [int(confusion[i, i]) / int(totals[i]) if totals[i] else None for i in range(num_classes)]
    return EvalResult(
        top1=topk_accuracy(logits, labels, 1),
        topk=topk_accuracy(logits, labels, k),
        k=min(k, num_classes),
        per_class=per_class,
        confusion=confusion.tolist(),
        class_names=list(class_names),
        num_images=int(labels.numel()),
    )


def evaluate(checkpoint, images, config: EvalConfig) -> EvalResult:
    """Top-1 / top-k, per-class accuracy and confusion matrix of a checkpoint on an `ImageSet`.

    The data set's classes must be the checkpoint's: same number (an error otherwise), matched by
    index (differing names are logged as a warning).
    """
    from vitkit.eval.features import compute, resolution

    names = checkpoint.class_names
    if names and images.class_names and len(names) != len(images.class_names):
        raise ValueError(
            f"the checkpoint has {len(names)} classes but the data set has {len(images.class_names)}: "
            "evaluate on the data set the model was trained for (or fine-tune a new head)"
        )
    if names and images.class_names and list(names) != list(images.class_names):
        log.warning("class names differ (checkpoint %s... vs data %s...); labels are matched by index",
                    list(names)[:3], list(images.class_names)[:3])
    logits, labels = compute(
        checkpoint, images, "logits", img_size=config.img_size, batch_size=config.batch_size, device=config.device
    )
    class_names = [str(c) for c in (images.class_names or names or range(logits.shape[1]))]
    result = accuracy_from_logits(logits, labels, class_names, config.top_k)
    result.img_size = resolution(checkpoint, config.img_size)
    return result
