"""How a study fits its time budget: the scale of its models, the length of its arms, its base config.

`--budget-minutes` is wall-clock for the whole study.  TRAIN_SHARE of it, less ARM_SECONDS an arm (each
arm's data loading, final evaluation and few-shot probes), is divided over the arms (`Study.units` unit
arms per seed; the rest of the budget pays for start-up, calibration and the report).  A unit arm is a
fixed number of optimiser steps, `unit_steps`, chosen once when the study starts so that every arm's
steps at its own model's measured training speed (`calibrate`, per distinct model) add up to that share
of the budget; it is stored in study.json, so a re-run plans exactly the same arms.
Arms are lengths in steps, not in time, because on a shared machine the speed changes from minute to
minute: time-budgeted arms of the same model were measured to take from 564 to 1,388 steps in the same
1.8 minutes, which would compare the machine's load, not the models.  An arm of `units` trains
round(units x unit_steps) steps with the schedule of its recipe (warmup and cosine decay over those steps,
ending annealed); studies give arms of costlier models fewer units where they compare at equal compute
(`compute`).

The scale follows the minutes of a unit arm:
    tiny   < TINY_UNIT_MINUTES   the recipe's -tiny variant (D=32, L=2), a fixed 10 steps x units: tests
    small  < BASE_UNIT_MINUTES   the data set's own recipe model (28 px: ViT D=64, L=4, 4x4 patches)
    base   otherwise             that model with twice the width and MLP and two more layers

Settings every study arm shares (and why): PatchDropout off (it is not defined for per-layer or
relative position embeddings, and the ablations compare models, not training tricks); eager, because
compiling costs ~1 min per arm; a fixed class-stratified validation hold-out of VAL_FRACTION of the
training split (model selection reads it, reports read the test split); no evaluation during training.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from vitkit.bench.throughput import make_optimizer, num_threads, time_steps, training_step
from vitkit.data.sources import SourceInfo
from vitkit.device import pick_device
from vitkit.models import build_model
from vitkit.models.configs import (
    HybridConfig,
    ModelConfig,
    ResNetConfig,
    ViTConfig,
    config_to_dict,
    image_size,
    in_channels,
    num_classes,
)
from vitkit.models.flops import model_flops
from vitkit.train.choices import eager_precision
from vitkit.train.config import TrainConfig
from vitkit.train.recipes import auto_recipe_name, get_recipe

TRAIN_SHARE = 0.8  # of the budget spent by the arms: their training loops and the time beside them
# an arm's time beside its training loop and its evaluations' forward passes: start-up and its data loaded
# (measured: 12 s a Fashion-MNIST arm of the posemb study on 2 AVX2 cores, of which about 7 s were the
# evaluations' 21,000 forward passes, counted apart)
ARM_SECONDS = 5.0
FORWARD_SHARE = 1 / 3  # a forward pass of an image costs about this share of a training step's (TRAIN_FLOPS_FACTOR)
MIN_TRAINED = 0.25  # of TRAIN_SHARE, left to the training loops however many arms a budget has
TINY_UNIT_MINUTES = 0.3
BASE_UNIT_MINUTES = 30.0
CALIBRATION_ROUNDS, CALIBRATION_STEPS = 3, 2  # timed rounds (median) of steps of each model
VAL_FRACTION = 0.1  # App. B.1.1 holds out 10% of small sets as a development split
CHECKPOINT_EVERY = 200  # steps: a killed arm loses at most this much


@dataclass(frozen=True)
class Scale:
    name: str  # "tiny", "small" or "base"
    unit_minutes: float  # training minutes of an arm of one unit (tiny: 0, fixed steps)
    unit_steps: int = 0  # optimiser steps of an arm of one unit (tiny: the -tiny recipe's)
    images_per_s: float = 0.0  # the calibration: training speed of the base model when the study started
    speeds: dict = field(default_factory=dict)  # model (family and size) -> calibrated training images/s
    beside_s: float = 0.0  # the arms' estimated seconds beside their training loops, in all (start-up, evaluations)


def smallest_budget(units: float, beside_s: float = 0.0) -> float:
    """The smallest budget (minutes) at which `units` units of arms train at the small scale, not the tiny one,
    where the arms' time beside their training loops is `beside_s` seconds in all (Scale.beside_s)."""
    return (TINY_UNIT_MINUTES * units + beside_s / 60) / TRAIN_SHARE


def scale_for(budget_minutes: float, units: float) -> Scale:
    """The scale at which `units` units of arms fit `budget_minutes` (module docstring); not yet calibrated."""
    if budget_minutes <= 0 or units <= 0:
        raise ValueError(f"the budget must be > 0 minutes and the study must have arms (got {budget_minutes}, {units})")
    if budget_minutes < smallest_budget(units):
        return Scale("tiny", 0.0)
    unit = budget_minutes * TRAIN_SHARE / units
    return Scale("small" if unit < BASE_UNIT_MINUTES else "base", unit)


def base_config(info: SourceInfo, scale: Scale, *, threads: int = 0, device: str = "auto") -> TrainConfig:
    """The config every arm of a study starts from: the data set's recipe at the scale, study settings applied."""
    name = auto_recipe_name(info) + ("-tiny" if scale.name == "tiny" else "")
    config = get_recipe(name, info)
    model = config.model
    if not isinstance(model, ViTConfig):
        raise ValueError(f"recipe {name} trains a {type(model).__name__}; the studies start from a ViT")
    model = dataclasses.replace(model, patch_dropout=0.0)
    # Tiny arms train in fp32: on 8 px images the ResNets' last GroupNorms see 1x1 maps,
    # whose bf16 variances give non-finite gradients (measured: NaN at the second step of a (1, 1, 1) ResNet).
    precision = "fp32" if scale.name == "tiny" else config.run.precision
    if scale.name == "base":
        model = dataclasses.replace(
            model, hidden_size=2 * model.hidden_size, mlp_dim=2 * model.mlp_dim, depth=model.depth + 2
        )
    return dataclasses.replace(
        config,
        recipe=f"study({name})",
        model=model,
        data=dataclasses.replace(config.data, val_fraction=VAL_FRACTION),
        eval=dataclasses.replace(config.eval, every_epochs=0.0, final_split="test"),
        run=dataclasses.replace(
            config.run,
            compile="off",
            progress=False,
            tensorboard=False,
            threads=threads,
            precision=precision,
            device=device,
            checkpoint_every=min(config.run.checkpoint_every, CHECKPOINT_EVERY),
        ),
    )


def timed(config: TrainConfig, units: float, scale: Scale) -> TrainConfig:
    """`config` trained for `units` unit arms: round(units x unit_steps) steps (tiny: the recipe's steps x units)."""
    per_unit = config.data.steps if scale.name == "tiny" else scale.unit_steps
    if per_unit < 1:
        raise ValueError(f"the {scale.name} scale has no calibrated steps per unit arm (calibrate first)")
    data = dataclasses.replace(config.data, steps=max(1, round(per_unit * units)))
    return dataclasses.replace(config, data=data, run=dataclasses.replace(config.run, max_minutes=0.0))


def calibrate(config: TrainConfig) -> float:
    """Training images/s of `config.model` on this device (synthetic batches of the run's batch size: forward,
    backward and AdamW step at the precision its arms will choose, "auto" timed as a run times it, and at the
    run's threads; the median of CALIBRATION_ROUNDS rounds).  The real loop adds augmentation and logging,
    which tiny models feel most: arms may run somewhat over."""
    device = pick_device(config.run.device)
    batch, size = config.data.batch_size, image_size(config.model)
    with num_threads(config.run.threads or None), torch.random.fork_rng(devices=[]):
        model = build_model(config.model).to(device).train()
        precision = eager_precision(config.run.precision, model, config.model, device, batch).precision
        images = torch.randn(batch, in_channels(config.model), size, size, device=device)
        labels = torch.randint(0, max(num_classes(config.model), 1), (batch,), device=device)
        step = training_step(model, make_optimizer(model, device), images, labels, device, precision)
        step()  # warm-up
        seconds = statistics.median(time_steps(step, device, CALIBRATION_STEPS) for _ in range(CALIBRATION_ROUNDS))
    return batch / seconds


def model_key(model: ModelConfig) -> str:
    """A short, stable name of a model config (what calibration speeds are stored under)."""
    digest = hashlib.sha1(json.dumps(config_to_dict(model), sort_keys=True).encode()).hexdigest()
    return f"{family(model)}-{digest[:10]}"


def calibrated(
    scale: Scale,
    budget_minutes: float,
    configs: Sequence[tuple[float, TrainConfig]],
    base: TrainConfig,
    measure=calibrate,
    *,
    eval_images: Sequence[int] = (),
) -> Scale:
    """`scale` with its unit arm in steps: the arms (units, config) at their models' measured speeds fill
    TRAIN_SHARE of `budget_minutes`, less each arm's time beside its training loop: ARM_SECONDS and the forward
    passes of its evaluations, `eval_images` an arm (none where not given; at least MIN_TRAINED of that share
    trains).  The tiny scale where what is left trains a unit arm for less than TINY_UNIT_MINUTES: its arms
    would sit near chance."""
    if scale.name == "tiny":
        return scale
    speeds: dict[str, float] = {}
    for _, config in [(1.0, base), *configs]:
        key = model_key(config.model)
        if key not in speeds:
            speeds[key] = round(measure(config), 1)
    speed = [speeds[model_key(config.model)] for _, config in configs]
    seconds = sum(units * config.data.batch_size / v for (units, config), v in zip(configs, speed, strict=True))
    evaluated = list(eval_images) or [0] * len(configs)
    beside = sum(ARM_SECONDS + images * FORWARD_SHARE / v for images, v in zip(evaluated, speed, strict=True))
    share = budget_minutes * TRAIN_SHARE * 60
    if share - beside < TINY_UNIT_MINUTES * 60 * sum(units for units, _ in configs):
        return Scale("tiny", 0.0, beside_s=round(beside, 1))
    steps = max(1, round(max(share - beside, MIN_TRAINED * share) / seconds))
    base_speed = speeds[model_key(base.model)]
    return dataclasses.replace(
        scale,
        unit_steps=steps,
        images_per_s=base_speed,
        speeds=speeds,
        unit_minutes=round(steps * base.data.batch_size / base_speed / 60, 3),
        beside_s=round(beside, 1),
    )


# ------------------------------------------------------------------------ the CNN baselines
def resnet_for(vit: ViTConfig, layers: tuple[int, ...]) -> ResNetConfig:
    """A BiT ResNet-v2 (models/resnet.py) with `layers` units per stage for the ViT's images and classes."""
    return ResNetConfig(
        layers=layers, width_factor=1, img_size=vit.img_size, in_chans=vit.in_chans, num_classes=vit.num_classes
    )


RESNET_LADDER = ((1,), (1, 1), (1, 1, 1), (2, 2, 2), (2, 2, 2, 2), (3, 4, 6, 3))  # units per stage, R50 last


def matched_resnet(vit: ViTConfig) -> ResNetConfig:
    """The BiT ResNet of RESNET_LADDER closest to the ViT in forward FLOPs ("comparable computational cost",
    Sec. 4.3), counted analytically (models/flops.py)."""
    target = math.log(model_flops(vit))
    return min(
        (resnet_for(vit, layers) for layers in RESNET_LADDER), key=lambda r: abs(math.log(model_flops(r)) - target)
    )


def hybrid_for(vit: ViTConfig, layers: tuple[int, ...] = (1,)) -> HybridConfig:
    """The ViT on a ResNet feature map (Sec. 3.1): `layers` units per stage of the official code's ResNet, and
    patches of the feature map as large as keeps the ViT's token grid where the stride allows (else 1x1)."""
    stride = 4 * 2 ** max(len(layers) - 1, 0)
    patch = max(1, vit.patch_size // stride)
    if vit.img_size % (stride * patch):
        raise ValueError(
            f"a hybrid with {len(layers)} stage(s) (stride {stride}) does not tile {vit.img_size} px images"
        )
    return HybridConfig(vit=dataclasses.replace(vit, patch_size=patch), resnet_layers=layers, width_factor=1)


def family(model: ModelConfig) -> str:
    """ "vit", "resnet" or "hybrid"."""
    return {ViTConfig: "vit", ResNetConfig: "resnet", HybridConfig: "hybrid"}[type(model)]
