"""How a study fits its time budget: the scale of its models, the length of its arms, its base config.

`--budget-minutes` is wall-clock for the whole study.  TRAIN_SHARE of it is divided over the arms'
training in proportion to each arm's `units` (a unit arm trains `unit_minutes`); the rest pays for
loading data, final evaluations and few-shot probes.  Every arm is a run with `run.max_minutes`, so the
engine FITS its schedule to that time (warmup and decay by the clock, ending annealed) and a killed
study resumes each run where it stopped.

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
import math
from dataclasses import dataclass

from vitkit.data.sources import SourceInfo
from vitkit.models.configs import HybridConfig, ModelConfig, ResNetConfig, ViTConfig
from vitkit.train.config import TrainConfig
from vitkit.train.recipes import auto_recipe_name, get_recipe

TRAIN_SHARE = 0.8  # of the budget spent in training loops; the rest loads, evaluates and probes
TINY_UNIT_MINUTES = 0.3
BASE_UNIT_MINUTES = 30.0
EPOCH_CAP = 300.0  # a fitted arm ends at its time budget or after this many epochs, whichever is first
VAL_FRACTION = 0.1  # App. B.1.1 holds out 10% of small sets as a development split
CHECKPOINT_EVERY = 200  # steps: a killed arm loses at most this much


@dataclass(frozen=True)
class Scale:
    name: str  # "tiny", "small" or "base"
    unit_minutes: float  # training minutes of an arm of one unit (tiny: 0, fixed steps)


def scale_for(budget_minutes: float, units: float) -> Scale:
    """The scale at which `units` units of arms fit `budget_minutes` (module docstring)."""
    if budget_minutes <= 0 or units <= 0:
        raise ValueError(f"the budget must be > 0 minutes and the study must have arms (got {budget_minutes}, {units})")
    unit = budget_minutes * TRAIN_SHARE / units
    if unit < TINY_UNIT_MINUTES:
        return Scale("tiny", 0.0)
    return Scale("small" if unit < BASE_UNIT_MINUTES else "base", unit)


def base_config(info: SourceInfo, scale: Scale, *, threads: int = 0, device: str = "auto") -> TrainConfig:
    """The config every arm of a study starts from: the data set's recipe at the scale, study settings applied."""
    name = auto_recipe_name(info) + ("-tiny" if scale.name == "tiny" else "")
    config = get_recipe(name, info)
    model = config.model
    if not isinstance(model, ViTConfig):
        raise ValueError(f"recipe {name} trains a {type(model).__name__}; the studies start from a ViT")
    model = dataclasses.replace(model, patch_dropout=0.0)
    # Tiny arms train in fp32, as small-8px does: on 8 px images the ResNets' last GroupNorms see 1x1 maps,
    # whose bf16 variances give non-finite gradients (measured: NaN at the second step of a (1, 1, 1) ResNet).
    precision = "fp32" if scale.name == "tiny" else config.run.precision
    if scale.name == "base":
        model = dataclasses.replace(model, hidden_size=2 * model.hidden_size, mlp_dim=2 * model.mlp_dim,
                                    depth=model.depth + 2)
    return dataclasses.replace(
        config, recipe=f"study({name})", model=model,
        data=dataclasses.replace(config.data, val_fraction=VAL_FRACTION, patch_dropout_until=1.0),
        eval=dataclasses.replace(config.eval, every_epochs=0.0, final_split="test"),
        run=dataclasses.replace(config.run, compile=False, progress=False, tensorboard=False, threads=threads,
                                precision=precision,
                                device=device, checkpoint_every=min(config.run.checkpoint_every, CHECKPOINT_EVERY)))


def timed(config: TrainConfig, units: float, scale: Scale) -> TrainConfig:
    """`config` trained for `units` units: fitted to units x unit_minutes, or (tiny) the recipe's steps x units."""
    if scale.name == "tiny":
        steps = max(1, round(config.data.steps * units))
        return dataclasses.replace(config, data=dataclasses.replace(config.data, steps=steps))
    data = dataclasses.replace(config.data, steps=0, epochs=EPOCH_CAP)
    run = dataclasses.replace(config.run, max_minutes=round(units * scale.unit_minutes, 4), budget_schedule="fit")
    return dataclasses.replace(config, data=data, run=run)


def with_model(config: TrainConfig, model: ModelConfig) -> TrainConfig:
    return dataclasses.replace(config, model=model)


# ------------------------------------------------------------------------ the CNN baselines
def resnet_for(vit: ViTConfig, layers: tuple[int, ...]) -> ResNetConfig:
    """A BiT ResNet-v2 (models/resnet.py) with `layers` units per stage for the ViT's images and classes."""
    return ResNetConfig(layers=layers, width_factor=1, img_size=vit.img_size, in_chans=vit.in_chans,
                        num_classes=vit.num_classes)


RESNET_LADDER = ((1,), (1, 1), (1, 1, 1), (2, 2, 2), (2, 2, 2, 2), (3, 4, 6, 3))  # units per stage, R50 last


def matched_resnet(vit: ViTConfig) -> ResNetConfig:
    """The BiT ResNet of RESNET_LADDER closest to the ViT in forward FLOPs ("comparable computational cost",
    Sec. 4.3), counted analytically (bench/flops.py)."""
    from vitkit.bench.flops import model_flops

    target = math.log(model_flops(vit))
    return min((resnet_for(vit, layers) for layers in RESNET_LADDER),
               key=lambda r: abs(math.log(model_flops(r)) - target))


def hybrid_for(vit: ViTConfig, layers: tuple[int, ...] = (1,)) -> HybridConfig:
    """The ViT on a ResNet feature map (Sec. 3.1): `layers` units per stage of the official code's ResNet, and
    patches of the feature map as large as keeps the ViT's token grid where the stride allows (else 1x1)."""
    stride = 4 * 2 ** max(len(layers) - 1, 0)
    patch = max(1, vit.patch_size // stride)
    if vit.img_size % (stride * patch):
        raise ValueError(f"a hybrid with {len(layers)} stage(s) (stride {stride}) does not tile {vit.img_size} px images")
    return HybridConfig(vit=dataclasses.replace(vit, patch_size=patch), resnet_layers=layers, width_factor=1)


def family(model: ModelConfig) -> str:
    """"vit", "resnet" or "hybrid"."""
    return {ViTConfig: "vit", ResNetConfig: "resnet", HybridConfig: "hybrid"}[type(model)]
