"""Objectives: what a step's loss is and what an evaluation measures.  Everything else (schedule, guard,
checkpoints, stop policy, metrics, progress) is the Trainer's and shared, so a rule is written once.

An objective turns the uint8 micro-batches of a step into model inputs (`batch`), gives the loss of
one micro-batch (`loss_of`), evaluates a split (`evaluate`), and may keep state of its own beside the
model's (`state_dict`).  Two objectives: classification, and masked patch prediction (Sec. 4.6, App.
B.1.2), whose corruption, targets and loss are vitkit.ssl.masked_patch's; `mpp_train_config` turns a
run's config into the paper's MPP settings.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from vitkit.data.sources import ImageSet
from vitkit.data.transforms import train_transform
from vitkit.eval.evaluator import evaluate
from vitkit.models.configs import HybridConfig, ResNetConfig, image_size, in_channels
from vitkit.ssl.masked_patch import MaskedPatchPrediction, MPPConfig, evaluate_mpp
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
    lockstep: bool = False  # the model's forward is a collective (FSDP): evaluator.evaluate's `lockstep`
    interrupted: Callable[[], int] | None = None  # a pending signal ends it (evaluator.evaluate's)
    progress: Callable[[], None] | None = None  # told of each batch (evaluator.evaluate's)

    @classmethod
    def of(cls, config: TrainConfig, device: torch.device, autocast_dtype: torch.dtype | None, **where: Any):
        """A run's: its model's input, its evaluation batch and workers; `where` the process's rank, world and
        lockstep."""
        model, data = config.model, config.data
        return cls(
            size=image_size(model),
            mean=data.mean,
            std=data.std,
            channels=in_channels(model),
            batch_size=config.eval.batch_size,
            device=device,
            autocast_dtype=autocast_dtype,
            workers=data.workers,
            **where,
        )


class Objective(Protocol):
    name: str
    config: TrainConfig

    def network(self, module: nn.Module) -> nn.Module: ...
    def batch(self, raw: list[tuple[Tensor, Tensor]], phase: Phase, generator: torch.Generator) -> list[Any]: ...
    def loss_of(self, spec: StepSpec, generator: torch.Generator) -> LossOf: ...
    def evaluate(self, model: nn.Module, data: ImageSet, context: EvalContext) -> dict[str, Any]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, payload: dict[str, Any]) -> None: ...
    def provenance(self) -> dict[str, Any]: ...


def augmented(
    config: TrainConfig,
    num_classes: int,
    channels: int,
    raw: list[tuple[Tensor, Tensor]],
    phase: Phase,
    generator: torch.Generator,
) -> list[tuple[Tensor, Tensor]]:
    """Each micro-batch of `raw` through the training transform at the phase's side: (images, soft targets)."""
    data = config.data
    return [
        train_transform(
            images, labels, num_classes, phase.side, data.mean, data.std, channels, config.augment, generator
        )
        for images, labels in raw
    ]


class Classification:
    """Cross-entropy (softmax, or big_vision's summed sigmoid) on augmented images with soft targets."""

    name = "classification"

    def __init__(self, config: TrainConfig, num_classes: int, channels: int):
        self.config, self.num_classes, self.channels = config, num_classes, channels

    def network(self, module: nn.Module) -> nn.Module:
        return module

    def batch(self, raw: list[tuple[Tensor, Tensor]], phase: Phase, generator: torch.Generator) -> list[Any]:
        return augmented(self.config, self.num_classes, self.channels, raw, phase, generator)

    def loss_of(self, spec: StepSpec, generator: torch.Generator) -> LossOf:
        return classification_loss(spec)

    def evaluate(self, model: nn.Module, data: ImageSet, context: EvalContext) -> dict[str, Any]:
        counts = evaluate(
            model,
            data,
            size=context.size,
            mean=context.mean,
            std=context.std,
            channels=context.channels,
            batch_size=context.batch_size,
            device=context.device,
            loss=self.config.optim.loss,
            autocast_dtype=context.autocast_dtype,
            rank=context.rank,
            world=context.world,
            workers=context.workers,
            flip_views=self.config.eval.flip_views,
            lockstep=context.lockstep,
            interrupted=context.interrupted,
            progress=context.progress,
        )
        return counts.summary()

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        pass

    def provenance(self) -> dict[str, Any]:
        return {}


# ------------------------------------------------------------------------ masked patch prediction
# Paper settings (App. B.1.2): Adam, base learning rate 2e-4, 10k warmup steps, cosine decay, batch 4096, 1M
# steps on JFT ("diminishing returns after 100k steps").  The weight decay is not given for MPP; 0.1, the
# paper's value for supervised pre-training (App. B.1), is used.  The augmentation keeps the recipe's crop and
# flip; Mixup, CutMix, RandAugment and label smoothing are off (label-side or colour-altering tricks of
# supervised training).  Labels are never used.  The Trainer optimises the MaskedPatchPrediction wrapper, but
# checkpoints hold the *encoder alone* (a plain ViT, so `vitkit finetune RUN/checkpoints/final` and `vitkit
# fewshot RUN` take it); the [mask] embedding and the MPP head live in train_state.pt under "mpp".
MPP_PAPER_LR = 2e-4  # App. B.1.2: Adam base learning rate
MPP_PAPER_WARMUP = 10_000  # App. B.1.2: warmup steps (of 1M)


def mpp_train_config(
    config: TrainConfig, mpp: MPPConfig | None = None, *, lr: float | None = None, warmup_steps: int | None = None
) -> TrainConfig:
    """App. B.1.2's objective and optimiser on top of a resolved TrainConfig; the encoder loses its head (K = 0).

    Warmup defaults to min(10k, 5% of the run); pass `warmup_steps` for another value.
    """
    model = config.model
    if isinstance(model, ResNetConfig):
        raise ValueError("masked patch prediction needs a ViT or hybrid (patch tokens); got a ResNet")
    # No head, and no pre-logits layer: it belongs to the supervised head.
    vit = dataclasses.replace(
        model.vit if isinstance(model, HybridConfig) else model,
        num_classes=0,
        representation_size=None,
        patch_dropout=0.0,
    )
    model = dataclasses.replace(model, vit=vit) if isinstance(model, HybridConfig) else vit
    optim = dataclasses.replace(
        config.optim,
        name="adamw",
        lr=lr or MPP_PAPER_LR,
        base_batch_size=0,
        lr_scaling="none",
        betas=(0.9, 0.999),
        weight_decay=0.1,
        schedule="cosine",
        end_lr_fraction=0.0,
        clip_norm=1.0,
        warmup_steps=warmup_steps or 0,
        warmup_fraction=0.0 if warmup_steps else 0.05,
        warmup_max_steps=MPP_PAPER_WARMUP,
        loss="softmax",
        lr_sweep=(),
        ema_decay=0.0,
    )
    augment = dataclasses.replace(config.augment, mixup=0.0, cutmix=0.0, randaugment=None, label_smoothing=0.0)
    data = dataclasses.replace(config.data, val_fraction=0.0)
    evaluation = dataclasses.replace(config.eval, every_epochs=0.0)
    return dataclasses.replace(
        config,
        recipe=f"mpp({config.recipe})",
        model=model,
        optim=optim,
        augment=augment,
        data=data,
        eval=evaluation,
        mpp=mpp or config.mpp or MPPConfig(),
    )


class MaskedPatchObjective:
    """The MPP loss on corrupted patch embeddings; the corruption draws from the run's augmentation generator."""

    name = "masked patch prediction"

    def __init__(self, config: TrainConfig, channels: int, num_classes: int = 1):
        self.config, self.num_classes = config, max(1, num_classes)  # labels only fill the unused soft targets
        # The colour targets undo the run's own input normalisation.
        self.mpp = dataclasses.replace(
            config.mpp, mean=tuple(config.data.mean[:channels]), std=tuple(config.data.std[:channels])
        )
        self.channels = channels
        self.wrapper: MaskedPatchPrediction | None = None

    def network(self, module: nn.Module) -> nn.Module:
        self.wrapper = MaskedPatchPrediction(module, self.mpp).to(next(module.parameters()).device)
        return self.wrapper

    def batch(self, raw: list[tuple[Tensor, Tensor]], phase: Phase, generator: torch.Generator) -> list[Any]:
        return [images for images, _ in augmented(self.config, self.num_classes, self.channels, raw, phase, generator)]

    def loss_of(self, spec: StepSpec, generator: torch.Generator) -> LossOf:
        def loss_of(model: nn.Module, images: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            out = model(images, generator)
            return out["loss"], {"accuracy": out["accuracy"]}

        return loss_of

    def evaluate(self, model: nn.Module, data: ImageSet, context: EvalContext) -> dict[str, Any]:
        count = min(self.mpp.eval_images, len(data))
        images = data.images[:count] if data.images is not None else torch.stack([data.read(i) for i in range(count)])
        result = evaluate_mpp(
            self.wrapper,
            images,
            context.size,
            self.mpp.mean,
            self.mpp.std,
            context.device,
            progress=context.progress,
            interrupted=context.interrupted,
            world=context.world,
        )
        return {**result, "count": count}

    def state_dict(self) -> dict[str, Any]:
        own = {k: v for k, v in self.wrapper.state_dict().items() if not k.startswith("encoder.")}
        return {"mpp": own}

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        own = {k: v for k, v in self.wrapper.state_dict().items() if not k.startswith("encoder.")}
        saved = payload.get("mpp", {})
        if set(saved) != set(own) or any(saved[k].shape != own[k].shape for k in own):
            raise ValueError(
                f"train_state.pt holds MPP weights {sorted(saved)} that do not fit this MPP model ({sorted(own)})"
            )
        with torch.no_grad():
            for name, tensor in own.items():
                tensor.copy_(saved[name])

    def provenance(self) -> dict[str, Any]:
        return {"objective": "masked_patch_prediction", "mpp": _jsonable(dataclasses.asdict(self.mpp))}


def _jsonable(value: Any) -> Any:
    """Tuples -> lists, as a JSON round trip stores them."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def build_objective(config: TrainConfig, num_classes: int, channels: int) -> Objective:
    """Classification, or masked patch prediction when the config has an `mpp` group."""
    if config.mpp is None:
        return Classification(config, num_classes, channels)
    return MaskedPatchObjective(config, channels, num_classes)
