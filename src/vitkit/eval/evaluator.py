"""The one evaluator: a model over a split, in fixed-order batches, summed (and all-reduced) into
loss, top-1, top-k and the confusion matrix.  Training's periodic and final evaluations and `vitkit
eval` both run it, on the one batcher of `vitkit.data.loader.eval_batches`.

Every image is transformed on its own (resize + centre crop + normalisation; no batch statistics) and
the model runs in eval mode, so results do not depend on the batch size.  With several processes each
evaluates a strided share and the sums are all-reduced, so every process gets the whole split's figures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.data import loader as batches
from vitkit.data.sources import ImageSet
from vitkit.data.transforms import eval_transform
from vitkit.device import autocast


@dataclass(frozen=True)
class Counts:
    """Sums over a split: what every accuracy figure is computed from."""

    loss_sum: float
    topk_hits: float  # images whose label is among the k highest logits
    k: int
    confusion: Tensor  # (K, K) int64: row = true class, column = predicted class
    count: int

    @property
    def top1(self) -> float:
        return float(self.confusion.diagonal().sum()) / self.count

    @property
    def loss(self) -> float:
        return self.loss_sum / self.count

    @property
    def topk(self) -> float:
        return self.topk_hits / self.count

    def summary(self) -> dict[str, Any]:
        """loss, top1, top5 (the top-k asked, 5 by default, capped at K) and count: training's record fields."""
        return {"loss": self.loss, "top1": self.top1, "top5": self.topk, "count": self.count}


@torch.no_grad()
def evaluate(model: nn.Module, data: ImageSet, *, size: int, mean: Sequence[float], std: Sequence[float],
             channels: int, batch_size: int = 512, device: torch.device | str = "cpu", loss: str = "softmax",
             autocast_dtype: torch.dtype | None = None, rank: int = 0, world: int = 1, workers: int = 0,
             top_k: int = 5) -> Counts:
    """Loss, top-1, top-k and the confusion matrix of `model` on `data` (uint8 images prepared as in training)."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    num_classes = data.num_classes
    confusion = torch.zeros(num_classes * num_classes, dtype=torch.float64, device=device)
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, top-k hits, count
    k = 1
    for images, labels in batches.eval_batches(data, batch_size, device, rank=rank, world=world, workers=workers):
        with autocast(device, autocast_dtype):
            logits = model(eval_transform(images, size, mean, std, channels))
        logits = logits.float()
        if logits.shape[1] != num_classes:
            raise ValueError(f"the model predicts {logits.shape[1]} classes but the data set has {num_classes}")
        k = min(top_k, logits.shape[1])
        per_image = _losses(logits, labels, loss)
        top = logits.topk(k, dim=1).indices  # (B, k)
        confusion += torch.bincount(labels * num_classes + top[:, 0], minlength=num_classes ** 2).double()
        sums += torch.stack([per_image.sum().double(), (top == labels[:, None]).any(1).sum().double(),
                             torch.tensor(float(len(labels)), dtype=torch.float64, device=device)])
    if torch.distributed.is_available() and torch.distributed.is_initialized():  # every process: the whole split
        torch.distributed.all_reduce(sums)
        torch.distributed.all_reduce(confusion)
    model.train(was_training)
    loss_sum, hits, count = sums.tolist()
    if count == 0:
        raise ValueError("evaluation split is empty")
    return Counts(loss_sum=loss_sum, topk_hits=hits, k=min(top_k, num_classes),
                  confusion=confusion.round().long().reshape(num_classes, num_classes).cpu(), count=int(count))


def _losses(logits: Tensor, labels: Tensor, kind: str) -> Tensor:
    """Per-image loss: softmax cross-entropy, or the sum of the K sigmoid cross-entropies."""
    if kind == "sigmoid":
        targets = F.one_hot(labels, logits.shape[1]).float()
        return F.binary_cross_entropy_with_logits(logits, targets, reduction="none").sum(-1)
    return F.cross_entropy(logits, labels, reduction="none")
