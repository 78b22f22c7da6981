"""Classification accuracy of a checkpoint: top-1 / top-5, per-class accuracy and the confusion matrix."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from vitkit.device import pick_device
from vitkit.eval.evaluator import evaluate as run_evaluator
from vitkit.eval.features import channels, resolution

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class AccuracyConfig:
    """How `evaluate` runs a checkpoint over a data split."""

    img_size: int | None = None  # input resolution; None = the checkpoint's (others resample position embeddings)
    batch_size: int = 64  # images per forward pass (results do not depend on it)
    top_k: int = 5  # the second accuracy reported, capped at the number of classes
    device: str = "auto"  # "auto" = CUDA when available
    flip_views: bool = False  # average each image's logits with its mirror image's (evaluator.evaluate)

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
    confusion: list[list[int]] | None  # None above evaluator.CONFUSION_MAX_CLASSES classes
    class_names: list[str]
    num_images: int
    img_size: int | None = None
    top1_one_view: float | None = None  # with flip_views: the unmirrored view's top-1

    def to_dict(self) -> dict[str, Any]:
        return {
            "top1": self.top1,
            **({} if self.top1_one_view is None else {"top1_one_view": self.top1_one_view}),
            f"top{self.k}": self.topk,
            "num_images": self.num_images,
            "img_size": self.img_size,
            "class_names": self.class_names,
            "per_class": dict(zip(self.class_names, self.per_class, strict=False)),
            "confusion": self.confusion,
        }


def evaluate(checkpoint, images, config: AccuracyConfig) -> EvalResult:
    """Top-1 / top-k, per-class accuracy and confusion matrix of a checkpoint on an `ImageSet`, through the
    one evaluator that training uses too (vitkit.eval.evaluator).

    Classes are matched by name where the data set's names are the checkpoint's, in any order, or some of
    them (a folder sorts its class folders; the model keeps its training data's order); otherwise by index,
    which needs as many classes (an error otherwise; differing names are logged as a warning).  Where some of the
    data's names are the model's and others are not, neither way is right, and that is an error.
    """
    names = list(checkpoint.class_names or [])
    label_map = by_name(names, list(images.class_names or []))
    if label_map is None:
        _refuse_some_names(names, list(images.class_names or []))
    if label_map is None and names and images.class_names and len(names) != len(images.class_names):
        raise ValueError(
            f"the checkpoint has {len(names)} classes but the data set has {len(images.class_names)}, and not all "
            "of the data set's class names are the checkpoint's: evaluate on the data set the model was trained "
            "for (or fine-tune a new head)"
        )
    if label_map is None and names and images.class_names and names != list(images.class_names):
        log.warning(
            "class names differ (checkpoint %s... vs data %s...); labels are matched by index",
            names[:3],
            list(images.class_names)[:3],
        )
    device = pick_device(config.device)
    model = checkpoint.model.eval().to(device)
    size = resolution(checkpoint, config.img_size)
    counts = run_evaluator(
        model,
        images,
        size=size,
        mean=checkpoint.mean,
        std=checkpoint.std,
        channels=channels(checkpoint),
        batch_size=config.batch_size,
        device=device,
        top_k=config.top_k,
        flip_views=config.flip_views,
        label_map=label_map,
    )
    totals, hits = counts.by_class.tolist()
    shown = names if label_map is not None else (images.class_names or names)
    class_names = [str(c) for c in (shown or range(len(totals)))]
    return EvalResult(
        top1=counts.top1,
        topk=counts.topk,
        k=counts.k,
        per_class=[hit / total if total else None for hit, total in zip(hits, totals, strict=True)],
        confusion=counts.confusion.tolist() if counts.confusion is not None else None,
        class_names=class_names,
        num_images=counts.count,
        img_size=size,
        top1_one_view=counts.one_view_top1,
    )


def by_name(model_names: list[str], data_names: list[str]) -> torch.Tensor | None:
    """int64 (len(data_names),): the model's index of each of the data's classes, where the data's names are
    distinct and all the model's but not the model's list itself; None where the classes are matched by index."""
    if not model_names or not data_names or data_names == model_names:
        return None
    index = {name: i for i, name in enumerate(model_names)}
    if len(index) != len(model_names) or len(set(data_names)) != len(data_names):  # a name twice: ambiguous
        return None
    if not all(name in index for name in data_names):
        return None
    log.info("classes matched by name: the data set's %d in the checkpoint's order", len(data_names))
    return torch.tensor([index[name] for name in data_names], dtype=torch.int64)


def _refuse_some_names(model_names: list[str], data_names: list[str]) -> None:
    """A ValueError where some of the data's class names are the model's (unique) names and some are not:
    matching by index then scored a class by another's predictions (one renamed folder: 53% read as 19%)."""
    known = set(model_names)
    if len(known) != len(model_names):
        return
    shared = [name for name in data_names if name in known]
    strangers = [name for name in data_names if name not in known]
    if shared and strangers:
        raise ValueError(
            f"{len(shared)} of the data set's {len(data_names)} classes are the checkpoint's, but "
            f"{', '.join(map(repr, strangers[:5]))} {'is' if len(strangers) == 1 else 'are'} not (its classes: "
            f"{', '.join(map(repr, model_names[:10]))}{', ...' if len(model_names) > 10 else ''}): rename those to "
            "the checkpoint's names, or leave them out"
        )
