"""Objectives: what a step's loss is and what an evaluation measures.  Everything else (schedule, guard,
checkpoints, stop policy, metrics, progress) is the Trainer's and shared, so a rule is written once.

An objective turns the uint8 micro-batches of a step into model inputs (`batch`), gives the loss of
one micro-batch (`loss_of`), evaluates a split (`evaluate`), and may keep state of its own beside the
model's (`state_dict`).  Classification lives here; masked patch prediction (App. B.1.2) is
`vitkit.ssl.objective.MaskedPatchObjective`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from vitkit.data.sources import ImageSet
from vitkit.data.transforms import train_transform
from vitkit.eval.evaluator import evaluate
from vitkit.train.config import TrainConfig
from vitkit.train.schedule import Phase
from vitkit.train.step import LossOf, StepSpec, classification_loss


@dataclass(frozen=True)
class EvalContext:
    """How every evaluation of a run reads its split."""

    size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    channels: int
    batch_size: int
    device: torch.device
    autocast_dtype: torch.dtype | None
    rank: int = 0
    world: int = 1
    workers: int = 0


class Objective(Protocol):
    name: str
    config: TrainConfig  # read at every batch: the Trainer may lighten its regularisation (train/short_run.py)

    def network(self, module: nn.Module) -> nn.Module: ...
    def batch(self, raw: list[tuple[Tensor, Tensor]], phase: Phase, generator: torch.Generator) -> list[Any]: ...
    def loss_of(self, spec: StepSpec, generator: torch.Generator) -> LossOf: ...
    def evaluate(self, model: nn.Module, data: ImageSet, context: EvalContext) -> dict[str, Any]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, payload: dict[str, Any]) -> None: ...
    def provenance(self) -> dict[str, Any]: ...


class Classification:
    """Cross-entropy (softmax, or big_vision's summed sigmoid) on augmented images with soft targets."""

    name = "classification"

    def __init__(self, config: TrainConfig, num_classes: int, channels: int):
        self.config, self.num_classes, self.channels = config, num_classes, channels

    def network(self, module: nn.Module) -> nn.Module:
        return module

    def batch(self, raw: list[tuple[Tensor, Tensor]], phase: Phase, generator: torch.Generator) -> list[Any]:
        data = self.config.data
        return [train_transform(images, labels, self.num_classes, phase.side, data.mean, data.std, self.channels,
                                self.config.augment, generator) for images, labels in raw]

    def loss_of(self, spec: StepSpec, generator: torch.Generator) -> LossOf:
        return classification_loss(spec)

    def evaluate(self, model: nn.Module, data: ImageSet, context: EvalContext) -> dict[str, Any]:
        counts = evaluate(model, data, size=context.size, mean=context.mean, std=context.std, channels=context.channels,
                          batch_size=context.batch_size, device=context.device, loss=self.config.optim.loss,
                          autocast_dtype=context.autocast_dtype, rank=context.rank, world=context.world,
                          workers=context.workers, flip_views=self.config.eval.flip_views)
        return counts.summary()

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        pass

    def provenance(self) -> dict[str, Any]:
        return {}


def build_objective(config: TrainConfig, num_classes: int, channels: int) -> Objective:
    """Classification, or masked patch prediction when the config has an `mpp` group."""
    if config.mpp is None:
        return Classification(config, num_classes, channels)
    from vitkit.ssl.objective import MaskedPatchObjective  # ssl builds on the engine, not the other way round

    return MaskedPatchObjective(config, channels, num_classes)
