"""What a run is assembled from before its first step: the data splits, the initial model, the batches.

Where the weights come from, decided once, in this order (STYLE.md section 5):
  (1) a checkpoint in the run directory -> resume it (train/checkpointer.py; weights, optimiser, step,
      RNG and the data position);
  (2) else `run.init_from` -> load that checkpoint, replace the head (Sec. 3.2: zero-initialised
      D x K, pre-logits dropped) and resample the position embeddings to the new resolution;
  (3) else -> a freshly initialised model.
`initial_model` does (2) and (3); the trainer tries (1) first.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vitkit.checkpoints import native
from vitkit.checkpoints.surgery import change_resolution, replace_head
from vitkit.data import loader
from vitkit.data.sources import ImageSet, describe, load_split, separate_val
from vitkit.data.subsets import fraction_subset, labelled_parts
from vitkit.models import build_model
from vitkit.models.configs import image_size, in_channels, num_classes
from vitkit.run_config import same_source
from vitkit.runs import open_checkpoint
from vitkit.train.config import TrainConfig
from vitkit.train.plan import eval_period, total_steps

log = logging.getLogger(__name__)


@dataclass
class Splits:
    """The parts of the data a run reads: train, the splits evaluated during training, the final one."""

    train: ImageSet
    test: ImageSet | None  # the final evaluation split (None: an MPP run without held-out images)
    evals: dict[str, ImageSet] = field(default_factory=dict)  # split name -> set, evaluated during training


AUTO_VAL_FRACTION, AUTO_VAL_MAX = 0.1, 5000  # the validation hold-out of a run that evaluates as it goes


def load_splits(config: TrainConfig, *, need_test: bool = True) -> Splits:
    """The splits of `config.data.uri` (DESIGN.md "Data sources").

    Evaluation during training never reads the final test images: it reads the source's own validation
    split where it has one apart from its test split, else a class-stratified hold-out of train
    (`data.val_fraction`, or 10% capped at about 5,000 images, each class rounding its share, when the run
    evaluates as it goes or ends on val).  With `data.labels_per_class` that hold-out comes out of the N images
    per class.  A run whose evaluation period, in steps of the held-out training split, is not shorter than the
    run evaluates at the end only, and trains on the 10% again.
    """
    uri, data = config.data.uri, config.data
    columns = reading_of(config)
    common = dict(
        image_size=image_size(config.model),
        channels=1 if in_channels(config.model) == 1 else None,  # L before resizing, as eval and predict read
        seed=config.run.seed,
        strict=data.strict,
        max_in_memory_bytes=data.max_in_memory_mb << 20,
        **columns,
    )
    periodic = evaluates_as_it_goes(config)
    val_fraction = data.val_fraction
    final, own_val = config.eval.final_split, separate_val(uri, columns)
    if data.labels_per_class == 1 and not own_val:  # a hold-out of one image a class is empty
        if final == "val" or val_fraction > 0:
            raise ValueError(
                "a validation split held out of 1 label per class is empty (every class keeps its one image "
                "for training): use --labels-per-class 2 or more, or eval.final_split=test and data.val_fraction=0"
            )
        periodic = False  # evaluated at the end only (the trainer's plan says so)
    if (periodic or final == "val") and val_fraction == 0 and not own_val:
        val_fraction = min(AUTO_VAL_FRACTION, AUTO_VAL_MAX / max(describe(uri, **columns).num_train, 1))
    whole = load_split(uri, "train", **common) if data.labels_per_class else None

    def train_part(fraction: float) -> tuple[ImageSet, ImageSet | None]:
        if whole is not None:  # N per class, the validation hold-out taken out of the N (data/subsets.py)
            return labelled_parts(whole, data.labels_per_class, fraction, config.run.seed)
        return fraction_subset(load_split(uri, "train", val_fraction=fraction, **common), data.train_fraction), None

    train, val = train_part(val_fraction)
    if periodic and not evaluates_as_it_goes(config, len(train)):  # its period, in steps, is past its end
        periodic = False
        if final != "val" and val_fraction and not data.val_fraction:  # a hold-out of ours that nothing reads
            val_fraction = 0.0
            train, val = train_part(val_fraction)

    def val_split() -> ImageSet:
        return val if val is not None else load_split(uri, "val", val_fraction=val_fraction, **common)

    test = (val_split() if final == "val" else load_split(uri, "test", **common)) if need_test else None
    evals = {"val": test if final == "val" and test is not None else val_split()} if periodic else {}
    return Splits(train=train, test=test, evals=evals)


def reading_of(config: TrainConfig) -> dict[str, Any]:
    """How the run reads its source: hf: columns; masked patch prediction reads sources without labels too
    (data/sources.py, "Labels")."""
    data = config.data
    return dict(image_column=data.image_column, label_column=data.label_column, labelled=config.mpp is None)


def source_images(config: TrainConfig) -> int:
    """The training images of the run's source as its listing counts them (files, rows, samples of an index),
    before any hold-out or subset, decoded or not: what a resumed run checks its source against."""
    return describe(config.data.uri, **reading_of(config)).num_train


def evaluates_as_it_goes(config: TrainConfig, num_train: int | None = None) -> bool:
    """Whether the run evaluates before its end: `eval.every_epochs` > 0, and a length (in epochs or steps, or
    the epoch bound of a time budget) longer than that period.  Before the data is read (`num_train` None) the
    lengths in epochs are compared, and a length in steps is taken to be longer; with the training split's size
    they are compared in the plan's steps (plan.eval_period, plan.total_steps).  A budget's length alone is
    known only once the warm-up is timed: such a run is taken to evaluate.  The budget itself is not read, so a
    resume that changes it trains on the same split."""
    every, data = config.eval.every_epochs, config.data
    if every <= 0:
        return False
    if num_train is not None:
        steps = total_steps(config, num_train)
        return steps is None or eval_period(config, num_train) < steps
    if data.steps > 0 or data.epochs <= 0:
        return True
    return data.epochs > every


def check_fits_data(config: TrainConfig, train: ImageSet) -> None:
    """The config fits the training split: a head of its classes, a batch it can fill (check_batch)."""
    check_batch(config, len(train))
    if config.mpp is None and train.num_classes != num_classes(config.model):
        raise ValueError(
            f"{config.data.uri} has {train.num_classes} classes but the model head has "
            f"{num_classes(config.model)} (set model.num_classes={train.num_classes})"
        )


LARGEST_RECIPE_BATCH = 4096  # the paper's pre-training batch: no recipe's is larger


def check_batch(config: TrainConfig, num_train: int) -> None:
    """A batch above both the training images and any recipe's is refused before anything is sized by it (a
    hand-edited run config's batch of 1e15 would ask for petabytes).  (`resolve` refuses a batch set by flag
    above the training images alone, and shrinks a recipe's own to a small set.)"""
    batch = config.data.batch_size
    if batch > max(num_train, LARGEST_RECIPE_BATCH):
        raise ValueError(
            f"data.batch_size of {batch:,} is larger than the {num_train:,} training images of {config.data.uri} "
            f"and than any recipe's batch ({LARGEST_RECIPE_BATCH:,}): one step would be {batch / num_train:,.1f} "
            f"epochs; set it to {num_train:,} or less (in {Path(config.run.out) / 'config.json'}, for a run resumed "
            "from its own config)"
        )


def initial_model(config: TrainConfig, class_names: list[str] | None = None) -> nn.Module:
    """Resume order steps (2) and (3): `init_from` with surgery, else a fresh model.  The checkpoint's head is
    kept only where it already classifies these `class_names` of this data set (a fine-tune continued on its own
    data: the checkpoint records the source it was trained on); any other head, one of the same shape included,
    is replaced by a zero-initialised D x K one (Sec. 3.2).  Names alone do not tell: sources without names call
    their classes "0", "1", ..."""
    model = build_model(config.model)
    if not config.run.init_from:
        return model
    checkpoint = open_checkpoint(config.run.init_from)
    source = checkpoint.model
    same_data = same_source(str(checkpoint.provenance.get("data", "")), config.data.uri)
    keep = same_data and bool(class_names) and checkpoint.class_names == list(class_names) and _same_head(source, model)
    if not keep:
        source = replace_head(source, num_classes(config.model))  # Sec. 3.2: zero-init D x K head
    source = change_resolution(source, image_size(config.model))  # Sec. 3.2: 2D-interpolated E_pos
    native.load_state_dict_strict(model, source.state_dict(), source=config.run.init_from)
    log.info(
        "initialised from %s (%s head of %d classes, %d px)",
        config.run.init_from,
        "its own" if keep else "a new zero-initialised",
        num_classes(config.model),
        image_size(config.model),
    )
    return model


def _same_head(source: nn.Module, target: nn.Module) -> bool:
    ours, theirs = target.state_dict(), source.state_dict()
    keys = [k for k in ours if k.startswith(("head.", "pre_logits."))]
    return all(k in theirs and theirs[k].shape == ours[k].shape for k in keys) and not [
        k for k in theirs if k.startswith("pre_logits.") and k not in ours
    ]


def blank_batch(train: ImageSet, micro: int, side: int, device: torch.device) -> list[tuple[Tensor, Tensor]]:
    """One blank micro-batch laid out as the training ones (uint8 images as the split stores or loads them)."""
    shape = (
        tuple(train.images.shape[1:])
        if train.images is not None
        else (train.channels, train.load_size or side, train.load_size or side)
    )
    return [
        (
            torch.zeros(micro, *shape, dtype=torch.uint8, device=device),
            torch.zeros(micro, dtype=torch.long, device=device),
        )
    ]


class IndexBatches:
    """The training batches of an in-memory or file-based split: one deterministic stream of per-epoch
    permutations (vitkit.data.loader), so the data position is a function of the step alone.

    Implements the TrainBatches protocol: iterating yields each step's micro-batches (uint8 images,
    labels) on the device; `state_dict` is the position (the step), `skipped` counts corrupt files.
    """

    def __init__(
        self,
        data: ImageSet,
        *,
        seed: int,
        global_batch: int,
        micro_batch: int,
        rank: int,
        world: int,
        device: torch.device,
        total_steps: int,
        workers: int = 0,
        strict: bool = False,
    ):
        self.data, self.seed, self.global_batch, self.micro_batch = data, seed, global_batch, micro_batch
        self.rank, self.world, self.device, self.total_steps = rank, world, device, total_steps
        self.workers, self.strict = workers, strict
        self.step = 0
        self._files: loader.FileBatches | None = None

    @property
    def skipped(self) -> int:
        return self._files.skipped if self._files is not None else 0

    @property
    def path(self) -> str:
        return "in memory" if self.data.images is not None else f"files, decoded by {self.workers} DataLoader worker(s)"

    def state_dict(self) -> dict[str, Any]:
        return {"kind": "index", "step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])

    def __iter__(self) -> Iterator[list[tuple[Tensor, Tensor]]]:
        stream = loader.IndexStream(len(self.data), self.seed)
        if self.data.images is not None:
            images = loader.DeviceImages(self.data, self.device)
            while self.step < self.total_steps:
                indices = loader.micro_batches(
                    stream, self.step, self.global_batch, self.rank, self.world, self.micro_batch
                )
                self.step += 1
                yield [images.batch(index) for index in indices]
            return
        self._files = loader.FileBatches(
            self.data,
            stream,
            start_step=self.step,
            total_steps=self.total_steps,
            global_batch=self.global_batch,
            rank=self.rank,
            world=self.world,
            micro_batch=self.micro_batch,
            device=self.device,
            workers=self.workers,
            strict=self.strict,
        )
        for batch in self._files:
            self.step += 1
            yield batch
