"""Few-shot linear accuracy (Sec. 4.1, "Metrics"): the frozen representation of k training images
per class, a closed-form regularised least-squares fit to {-1, 1}^K targets (eval/ridge.py holds
the derivation), accuracy on the test split, repeated over seeds (mean +- std).

Choosing lambda.  Candidates are powers of two (`FewShotConfig.l2_exponents`).  For k >= 2 the k
shots of every class are dealt into min(k, folds) class-stratified folds; each fold is held out in
turn, the rest fitted, and the lambda with the most correct held-out predictions wins (ties: lower
held-out squared error, then the larger lambda).  The winner is refitted on all k shots.
For k = 1 nothing can be held out (a class would lose its only image), and no estimate made on the
K shots alone can choose: generalised cross-validation (Golub, Heath & Wahba 1979), the closed-form
stand-in for leave-one-out, falls as lambda grows for any features when the targets are one-hot with
one image a class.  So k = 1 takes the largest lambda of the grid, where W ~ Xc^T Yc / lambda: the
class-prototype classifier, each test image scored by its centred dot product with each shot.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from vitkit.data.fewshot import k_per_class
from vitkit.data.images import BadImageError
from vitkit.data.imageset import ImageSet
from vitkit.data.inmemory import drawn_sample, samples_at
from vitkit.data.shardset import ShardSet, label_index
from vitkit.eval.features import compute
from vitkit.eval.ridge import l2_grid, pm1_targets, ridge_path

log = logging.getLogger(__name__)

MAX_SEEDS = 1000  # draws of the shots; each is listed before any is fitted, so the count is bounded


@dataclass(frozen=True, kw_only=True)
class FewShotConfig:
    """What `run_fewshot` measures."""

    shots: tuple[int, ...] = (1, 5, 10, 25)  # k images per class (Sec. 4.1 / Figure 4 use 1, 5, 10, 25)
    seeds: int = 3  # repetitions with different draws of the k shots (seeds 0 ... seeds-1)
    l2_exponents: tuple[int, ...] = tuple(
        range(-10, 21)
    )  # lambda candidates 2^e: 2^-10 ... 2^20 (large = prototype-like)
    folds: int = 5  # at most this many hold-out folds when choosing lambda (k >= 2)
    layer: str = "features"  # representation: "features" = what the head reads (y, or pre-logits when present)
    img_size: int | None = None  # input resolution; None = the checkpoint's
    batch_size: int = 64  # images per forward pass
    max_test: int | None = None  # evaluate on a fixed random subset of this many test images (None = all)
    device: str = "auto"  # "auto" = CUDA when available

    def __post_init__(self) -> None:
        if not self.shots or min(self.shots) < 1:
            raise ValueError(f"shots must be integers of 1 or more, got {', '.join(map(str, self.shots)) or 'none'}")
        if not 1 <= self.seeds <= MAX_SEEDS:
            raise ValueError(f"seeds must be 1 or more and at most {MAX_SEEDS:,}, got {self.seeds}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be 1 or more, got {self.batch_size}")
        if self.folds < 2:
            raise ValueError(f"folds must be 2 or more, got {self.folds}")
        if not self.l2_exponents:
            raise ValueError("l2_exponents must not be empty")


@dataclass
class FewShotResult:
    """Accuracy per k: mean and std over seeds, plus every (seed, lambda, accuracy)."""

    shots: dict[int, dict[str, Any]] = field(default_factory=dict)
    num_classes: int = 0
    num_test: int = 0
    layer: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_classes": self.num_classes,
            "num_test": self.num_test,
            "layer": self.layer,
            "shots": {str(k): v for k, v in self.shots.items()},
        }


def _fold_ids(labels: Tensor, folds: int, seed: int) -> Tensor:
    """A fold index per image, dealt class by class in a seeded random order (stratified)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.empty_like(labels)
    for cls in labels.unique():
        members = (labels == cls).nonzero().flatten()
        order = members[torch.randperm(len(members), generator=generator)]
        ids[order] = torch.arange(len(order)) % folds
    return ids


def select_l2(features: Tensor, labels: Tensor, num_classes: int, grid: list[float], folds: int, seed: int) -> float:
    """The lambda of `grid` with the best held-out accuracy on the few-shot set (module docstring)."""
    per_class = torch.bincount(labels, minlength=num_classes)
    shots = int(per_class[per_class > 0].min())
    if shots < 2:  # k = 1: nothing to hold out and nothing to choose by (module docstring)
        return max(grid)
    targets = pm1_targets(labels, num_classes)
    ids = _fold_ids(labels, min(shots, folds), seed)
    correct = torch.zeros(len(grid), dtype=torch.float64)
    error = torch.zeros(len(grid), dtype=torch.float64)
    for fold in ids.unique():
        held = ids == fold
        path = ridge_path(features[~held], targets[~held])
        for index, l2 in enumerate(grid):
            scores = path.predict(features[held], l2)
            correct[index] += float((scores.argmax(dim=1) == labels[held]).sum())
            error[index] += float(((scores - targets[held]) ** 2).sum())
    # lexicographic: most correct, then least squared error, then the larger lambda (later in the grid)
    ranking = sorted(range(len(grid)), key=lambda i: (-correct[i].item(), error[i].item(), -grid[i]))
    return grid[ranking[0]]


def fewshot_accuracy(
    train_features: Tensor,
    train_labels: Tensor,
    test_features: Tensor,
    test_labels: Tensor,
    num_classes: int,
    config: FewShotConfig,
    seed: int,
) -> tuple[float, float]:
    """(test accuracy, chosen lambda) of the ridge probe fitted on the given few-shot features."""
    grid = l2_grid(config.l2_exponents)
    l2 = select_l2(train_features, train_labels, num_classes, grid, config.folds, seed)
    path = ridge_path(train_features, pm1_targets(train_labels, num_classes))
    predictions = path.predict(test_features, l2).argmax(dim=1)
    return float((predictions == test_labels.to(predictions.device)).double().mean()), l2


def evaluate_fewshot(
    train_features: Tensor,
    train_labels: Tensor,
    test_features: Tensor,
    test_labels: Tensor,
    num_classes: int,
    config: FewShotConfig,
    pool: Tensor | None = None,
) -> FewShotResult:
    """Few-shot accuracy for every k and seed from precomputed features: `train_features` are those of the
    training images at the sorted positions `pool` (None: of every image), `train_labels` of every image (-1:
    not to be drawn)."""
    result = FewShotResult(num_classes=num_classes, num_test=len(test_labels), layer=config.layer)
    for k in config.shots:
        runs = []
        for seed in range(config.seeds):
            index = k_per_class(train_labels, k, seed, num_classes=num_classes)
            rows = index if pool is None else _rows_of(pool, index)
            accuracy, l2 = fewshot_accuracy(
                train_features[rows], train_labels[index], test_features, test_labels, num_classes, config, seed
            )
            runs.append({"seed": seed, "accuracy": accuracy, "l2": l2})
            log.info("few-shot k=%d seed=%d: accuracy %.4f (lambda 2^%d)", k, seed, accuracy, round(math.log2(l2)))
        accuracies = torch.tensor([r["accuracy"] for r in runs], dtype=torch.float64)
        std = float(accuracies.std(unbiased=True)) if len(runs) > 1 else 0.0
        result.shots[k] = {"mean": float(accuracies.mean()), "std": std, "runs": runs}
    return result


def run_fewshot(checkpoint, train_set, test_set, config: FewShotConfig) -> FewShotResult:
    """Few-shot linear accuracy of a checkpoint's frozen representation (Sec. 4.1).

    Only the images some (k, seed) draw uses are passed through the model; `train_set` and `test_set` are splits
    of `vitkit.data.sources.load_split` with the same classes, in memory, read from files or streamed.
    """
    if train_set.num_classes != test_set.num_classes:
        raise ValueError(f"train has {train_set.num_classes} classes but test has {test_set.num_classes}")
    if train_set.num_classes < 2:  # one class: every probe is right, and says nothing
        raise ValueError(f"few-shot accuracy needs 2 classes or more; {train_set.origin} has 1")
    if config.max_test is not None and config.max_test < len(test_set):
        test_set = drawn_sample(test_set, config.max_test)
    options = {"img_size": config.img_size, "batch_size": config.batch_size, "device": config.device}
    labels, pool, pool_features = _shot_features(checkpoint, train_set, config, options)
    test_features, test_labels = compute(checkpoint, test_set, config.layer, **options)
    return evaluate_fewshot(pool_features, labels, test_features, test_labels, train_set.num_classes, config, pool)


def _shot_features(checkpoint, train_set, config: FewShotConfig, options: dict[str, Any]):
    """(the label of every training image, -1 for those that do not decode; the sorted positions every draw uses;
    their features).  An image that does not decode leaves the draws, which are made again among the rest, and
    only images not computed before go through the model (each unreadable one is found once)."""
    streamed = isinstance(train_set, ShardSet)
    labels = label_index(train_set) if streamed else train_set.labels.clone()
    known: dict[int, Tensor] = {}  # features by position
    while True:
        draws = [(k, seed) for k in config.shots for seed in range(config.seeds)]
        needed = torch.cat(
            [k_per_class(labels, k, seed, train_set.class_names, train_set.num_classes) for k, seed in draws]
        )
        pool = needed.unique()  # sorted positions of every image any draw uses
        todo = [i for i in pool.tolist() if i not in known]
        if todo:
            computed, bad = _features_at(checkpoint, train_set, todo, config.layer, options)
            unread = frozenset(bad)
            known.update(zip((i for i in todo if i not in unread), computed, strict=True))
            if bad:
                labels[bad] = -1
                log.warning("%d drawn shots do not decode; the shots are drawn again among the other images", len(bad))
                continue
        return labels, pool, torch.stack([known[i] for i in pool.tolist()])


def _features_at(checkpoint, train_set, positions: list[int], layer: str, options: dict[str, Any]):
    """(the features of the images at `positions` that decode, in order; the positions that do not)."""
    if isinstance(train_set, ShardSet):
        decoded, bad = samples_at(train_set, positions)
        if not len(decoded):
            return torch.empty(0), bad
        computed, _ = compute(checkpoint, decoded, layer, **options)
    else:
        try:
            computed, _ = compute(checkpoint, train_set.subset(torch.tensor(positions)), layer, **options)
        except ValueError:  # "the data set is empty" where none of them decodes; any other error stands
            bad = _unreadable(train_set, positions)
            if len(bad) < len(positions):
                raise
            return torch.empty(0), bad
        bad = _unreadable(train_set, positions) if len(computed) < len(positions) else []
    if computed.ndim != 2:
        raise ValueError(f"layer {layer!r} gives {tuple(computed.shape[1:])} per image; few-shot needs a vector")
    return computed, bad


def _rows_of(pool: Tensor, index: Tensor) -> Tensor:
    """The rows of the sorted positions `pool` that hold the positions `index` (ValueError where one is not)."""
    rows = torch.searchsorted(pool, index).clamp(max=len(pool) - 1)
    if not torch.equal(pool[rows], index):
        raise ValueError("the features given do not cover the images drawn: pool must hold every drawn position")
    return rows


def _unreadable(train_set: ImageSet, positions: list[int]) -> list[int]:
    """The `positions` of `train_set` whose images do not decode (each named in the log as it was skipped)."""
    bad = []
    for i in positions:
        try:
            train_set.read(i)
        except BadImageError:
            bad.append(i)
    if not bad:  # every one decodes now: the set changed while it was read
        raise ValueError(f"{train_set.origin or 'the training split'}: images failed to decode and then decoded")
    return bad
