"""The one evaluator: a model over a split, in fixed-order batches, summed (and all-reduced) into
loss, top-1, top-k and the confusion matrix.  Training's periodic and final evaluations and `vitkit
eval` both run it, on the one batcher of `vitkit.data.loader.eval_batches`.

Every image is transformed on its own (resize + centre crop + normalisation; no batch statistics) and
the model runs in eval mode, so results do not depend on the batch size.  With several processes each
evaluates a strided share and the sums are all-reduced, so every process gets the whole split's figures.
With `flip_views` each image is also classified mirrored and the two logit vectors are averaged (test-time
augmentation, for data whose labels survive a mirror); the counts then also carry the one-view top-1, so
both figures are reported (`one_view_note`).  An evaluation given `interrupted` (training's periodic ones)
ends at the next batch after a signal, with `EvaluationInterrupted`, agreed by every process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.data import loader as batches
from vitkit.data.sources import ImageSet
from vitkit.data.transforms import eval_transform
from vitkit.device import autocast
from vitkit.models import configs

CONFUSION_MAX_CLASSES = 4096  # above, no K x K confusion matrix is kept (21,843 classes: 3.8 GB a copy)


class EvaluationInterrupted(Exception):
    """A signal arrived during an evaluation given `interrupted`; `signum` is the one every process agreed."""

    def __init__(self, signum: int):
        super().__init__(f"evaluation interrupted by signal {signum}")
        self.signum = signum


@dataclass(frozen=True)
class Counts:
    """Sums over a split: what every accuracy figure is computed from."""

    loss_sum: float
    topk_hits: float  # images whose label is among the k highest logits
    k: int
    confusion: Tensor | None  # (K, K) int64: row = true class, column = predicted; None above CONFUSION_MAX_CLASSES
    count: int
    by_class: Tensor  # (2, K) int64: images of each true class, and those ranked first correctly
    one_view_hits: float | None = None  # with flip_views: images the unmirrored view alone ranks first correctly

    @property
    def top1(self) -> float:
        return float(self.by_class[1].sum()) / self.count

    @property
    def loss(self) -> float:
        return self.loss_sum / self.count

    @property
    def topk(self) -> float:
        return self.topk_hits / self.count

    @property
    def one_view_top1(self) -> float | None:
        return None if self.one_view_hits is None else self.one_view_hits / self.count

    def summary(self) -> dict[str, Any]:
        """loss, top1, top5 (the top-k asked, 5 by default, capped at K), k and count: training's record fields;
        with flip_views also top1_one_view, the unmirrored view's top-1."""
        out = {"loss": self.loss, "top1": self.top1, "top5": self.topk, "k": self.k, "count": self.count}
        if self.one_view_hits is not None:
            out["top1_one_view"] = self.one_view_top1
        return out


def one_view_note(report: dict[str, Any]) -> str:
    """ " (image + mirror; one view X%)" after a flip-view top-1 (a summary or report with top1_one_view), else ""."""
    one_view = report.get("top1_one_view")
    return "" if one_view is None else f" (image + mirror; one view {100 * one_view:.2f}%)"


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: ImageSet,
    *,
    size: int,
    mean: Sequence[float],
    std: Sequence[float],
    channels: int,
    batch_size: int = 512,
    device: torch.device | str = "cpu",
    loss: str = "softmax",
    autocast_dtype: torch.dtype | None = None,
    rank: int = 0,
    world: int = 1,
    workers: int = 0,
    top_k: int = 5,
    flip_views: bool = False,
    label_map: Tensor | None = None,
    lockstep: bool = False,
    interrupted: Callable[[], int] | None = None,
    progress: Callable[[], None] | None = None,
) -> Counts:
    """Loss, top-1, top-k and the confusion matrix of `model` on `data` (uint8 images prepared as in training);
    with `flip_views`, of the logits averaged over each image and its mirror image.  `label_map` (int64, one
    entry a data class) turns the data's labels into the model's classes, which the confusion matrix counts.
    `lockstep`: the model's forward is a collective (FSDP's all-gathers), so every process runs as many forward
    passes, one out of batches a blank one, where the processes' shares differ in batches.  `interrupted`: this
    process's pending signal (0: none), read before each batch; any process's ends every one's evaluation.
    `progress`: called before each batch (a training run's stall watch)."""
    device = torch.device(device)
    was_training = model.training
    model.eval()
    num_classes = data.num_classes if label_map is None else configs.num_classes(model.config)
    label_map = None if label_map is None else label_map.to(device)
    totals = _Totals(num_classes, device)
    stream = batches.eval_batches(data, batch_size, device, rank=rank, world=world, workers=workers)
    try:
        for batch in agreed_batches(stream, device, world, lockstep, interrupted, progress):
            if batch is None:  # this process's share is done, another's is not: a blank pass joins the collectives
                if lockstep:
                    blank = torch.zeros(1, channels, size, size, device=device)
                    blank_labels = torch.zeros(1, dtype=torch.long, device=device)
                    _view_logits(model, blank, blank_labels, device, autocast_dtype, flip_views)
                continue
            images, labels = batch
            inputs = eval_transform(images, size, mean, std, channels)
            labels = labels if label_map is None else label_map[labels]
            logits, one_view_hits = _view_logits(model, inputs, labels, device, autocast_dtype, flip_views)
            if logits.shape[1] != num_classes:
                raise ValueError(f"the model predicts {logits.shape[1]} classes but the data set has {num_classes}")
            totals.add(*_batch_counts(logits, labels, loss, top_k, one_view_hits), labels)
    finally:
        model.train(was_training)
    return totals.counts(top_k, flip_views)


class _Totals:
    """What an evaluation sums batch by batch (float64, on the device): loss, top-k hits, count and one-view top-1
    hits; per true class its images and top-1 hits; the flattened confusion counts up to CONFUSION_MAX_CLASSES
    (no K x K tensor a batch).  Every process adds its share; `counts` all-reduces them."""

    def __init__(self, num_classes: int, device: torch.device) -> None:
        self.num_classes, self.dense = num_classes, num_classes <= CONFUSION_MAX_CLASSES
        self.confusion = torch.zeros(num_classes**2 if self.dense else 0, dtype=torch.float64, device=device)
        self.by_class = torch.zeros(2, num_classes, dtype=torch.float64, device=device)
        self.sums = torch.zeros(4, dtype=torch.float64, device=device)

    def add(self, predicted: Tensor, sums: Tensor, labels: Tensor) -> None:
        ones = torch.ones(len(labels), dtype=torch.float64, device=labels.device)
        self.by_class[0].index_add_(0, labels, ones)
        self.by_class[1].index_add_(0, labels, (predicted == labels).double())
        if self.dense:
            self.confusion.index_add_(0, labels * self.num_classes + predicted, ones)
        self.sums += sums

    def counts(self, top_k: int, flip_views: bool) -> Counts:
        if torch.distributed.is_available() and torch.distributed.is_initialized():  # every process: the whole split
            for total in (self.sums, self.by_class, self.confusion):
                torch.distributed.all_reduce(total)
        loss_sum, hits, count, one_view = self.sums.tolist()
        if count == 0:
            raise ValueError("evaluation split is empty")
        square = (self.num_classes, self.num_classes)
        return Counts(
            loss_sum=loss_sum,
            topk_hits=hits,
            k=min(top_k, self.num_classes),
            confusion=self.confusion.round().long().reshape(square).cpu() if self.dense else None,
            count=int(count),
            one_view_hits=one_view if flip_views else None,
            by_class=self.by_class.round().long().cpu(),
        )


def agreed_batches(
    stream: Iterable[Any],
    device: torch.device,
    world: int,
    lockstep: bool,
    interrupted: Callable[[], int] | None,
    progress: Callable[[], None] | None = None,
) -> Iterator[Any]:
    """The batches of `stream`; where processes must agree (a collective forward, or a signal that ends every
    process's evaluation), then None until every process is out of them, in one all-reduce a batch.  Raises
    `EvaluationInterrupted` before the batch after a signal.  `progress`: called as each is handed on (a
    training run's stall watch)."""
    for batch in _agreed(stream, device, world, lockstep, interrupted):
        if progress is not None:
            progress()
        yield batch


def _agreed(
    stream: Iterable[Any],
    device: torch.device,
    world: int,
    lockstep: bool,
    interrupted: Callable[[], int] | None,
) -> Iterator[Any]:
    if world == 1 or not (lockstep or interrupted):
        for batch in stream:
            if interrupted is not None and (signum := interrupted()):
                raise EvaluationInterrupted(signum)
            yield batch
        return
    stream = iter(stream)
    while True:
        batch = next(stream, None)
        mine = [float(batch is not None), float(interrupted() if interrupted else 0)]
        more, signum = torch.tensor(mine, dtype=torch.float64, device=device), None
        torch.distributed.all_reduce(more, op=torch.distributed.ReduceOp.MAX)
        more, signum = more.tolist()
        if not more:  # every batch evaluated: whole, whatever signal came during the last one (as with one process)
            return
        if signum:
            raise EvaluationInterrupted(int(signum))
        yield batch


def _batch_counts(
    logits: Tensor, labels: Tensor, loss: str, top_k: int, one_view_hits: Tensor
) -> tuple[Tensor, Tensor]:
    """One batch's predicted classes (B,) and its (loss sum, top-k hits, count, one-view top-1 hits)."""
    top = ranked(logits, top_k)  # (B, k)
    sums = torch.stack(
        [
            _losses(logits, labels, loss).sum().double(),
            (top == labels[:, None]).any(1).sum().double(),
            torch.tensor(float(len(labels)), dtype=torch.float64, device=logits.device),
            one_view_hits.double(),
        ]
    )
    return top[:, 0], sums


def ranked(scores: Tensor, k: int) -> Tensor:
    """The indices of the `k` highest of each row of `scores` (B, K), highest first, a tie to the lower index
    (argmax's rule; torch.topk leaves ties in any order): (B, min(k, K)).  topk's candidates are put in that
    order; only a row whose k-th value ties with a score left out is sorted whole."""
    k = min(k, scores.shape[-1])
    values, index = scores.topk(k, dim=-1)  # highest first
    cut = (scores >= values[..., -1:]).sum(-1) > k  # a score left out ties with the k-th: which are kept is open
    order = index.sort(dim=-1).indices  # the candidates by class index, then stably by value
    index, values = index.gather(-1, order), values.gather(-1, order)
    index = index.gather(-1, values.sort(dim=-1, descending=True, stable=True).indices)
    if cut.any():
        index[cut] = scores[cut].sort(dim=-1, descending=True, stable=True).indices[..., :k]
    return index


def _view_logits(
    model: nn.Module,
    inputs: Tensor,
    labels: Tensor,
    device: torch.device,
    autocast_dtype: torch.dtype | None,
    flip_views: bool,
) -> tuple[Tensor, Tensor]:
    """(fp32 logits (B, K), top-1 hits of the image alone): with `flip_views`, the logits are averaged with the
    mirror image's."""
    with autocast(device, autocast_dtype):
        logits = model(inputs).float()
        mirrored = model(inputs.flip(-1)).float() if flip_views else None
    one_view_hits = (logits.argmax(1) == labels).sum().double()
    if mirrored is not None:
        logits = (logits + mirrored) / 2
    return logits, one_view_hits


def _losses(logits: Tensor, labels: Tensor, kind: str) -> Tensor:
    """Per-image loss: softmax cross-entropy, or the sum of the K sigmoid cross-entropies."""
    if kind == "sigmoid":
        targets = F.one_hot(labels, logits.shape[1]).float()
        return F.binary_cross_entropy_with_logits(logits, targets, reduction="none").sum(-1)
    return F.cross_entropy(logits, labels, reduction="none")
