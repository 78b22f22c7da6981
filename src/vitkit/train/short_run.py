"""Regularisation fitted to the run's length: a run that holds few epochs trains lighter.

How much regularisation pays depends on how long a model trains.  small-32px's stochastic depth 0.1 and
4-px pad-crop suit the ~80 epochs a fast 2-core CPU fits in 30 minutes of CIFAR-10; in the ~40 epochs a
slow one fits, they hold the model back (16-minute runs on the fast host, ~40 epochs: 79.60-80.05% with
them, 80.11-80.63% without), while at ~76 epochs the lighter setting overfits (79.41% against 80.61-81.42%).

`optim.light_below_epochs=E` (0 = off) turns this into a rule: a run planned for fewer than E epochs
(under a fitted budget, the epochs that fit at the speed the rehearsal measured) trains without
stochastic depth and with half the configured pad-crop.  The speed is only known after the model is
built and compiled, so the lighter setting is applied in place: DropPath's rate is a buffer (no
recompilation, models/vit.py) and the augmentation is read from the objective's config at every batch.
The decision is taken once, on the run's first invocation, agreed by every process (the fewest epochs
any of them measured) and stored with the checkpoints: a resumed run keeps it.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from vitkit.models.configs import HybridConfig, ViTConfig, replace_vit, vit_config
from vitkit.models.vit import VisionTransformer
from vitkit.train import distributed
from vitkit.train.config import TrainConfig
from vitkit.train.plan import Plan


def planned_epochs(plan: Plan) -> float:
    """The epochs the run will train: under a fitted budget those that fit at the measured speed."""
    if plan.fitted and "fit_epochs" in plan.measured:
        return float(plan.measured["fit_epochs"])
    return plan.epochs


def decide(config: TrainConfig, plan: Plan, stored: bool | None, device: torch.device) -> bool | None:
    """True: train lighter; False: as configured; None: the rule is off.  `stored`: an earlier invocation's."""
    if config.optim.light_below_epochs <= 0:
        return None
    if stored is not None:
        return bool(stored)
    return distributed.min_across(planned_epochs(plan), device) < config.optim.light_below_epochs


def lighter(config: TrainConfig) -> TrainConfig:
    """`config` with a short run's regularisation: no stochastic depth, half the pad-crop."""
    model = config.model
    if isinstance(model, (ViTConfig, HybridConfig)):
        model = replace_vit(model, drop_path=0.0)
    augment = dataclasses.replace(config.augment, pad=config.augment.pad // 2)
    return dataclasses.replace(config, model=model, augment=augment)


def lighten(config: TrainConfig, network: nn.Module) -> TrainConfig:
    """`lighter(config)`, and stochastic depth off in every ViT inside `network`, in place (compiled graphs
    stay valid); the objective reads the returned config's augmentation."""
    for module in network.modules():
        if isinstance(module, VisionTransformer):
            module.set_drop_path(0.0)
    return lighter(config)


def describe(config: TrainConfig, plan: Plan, light: bool | None) -> str:
    """The plan's line on the rule (`config` as configured); empty when the rule is off."""
    if light is None:
        return ""
    held = f"about {planned_epochs(plan):g} epochs " + ("fit" if plan.fitted else "planned")
    threshold = f"optim.light_below_epochs={config.optim.light_below_epochs:g}"
    if not light:
        return f"regularisation as configured ({held}, not fewer than {threshold}): {_regularisation(config)}"
    return (f"lighter regularisation for a short run ({held}, fewer than {threshold}): "
            f"{_regularisation(lighter(config))} instead of {_regularisation(config)}")


def _regularisation(config: TrainConfig) -> str:
    model, augment = config.model, config.augment
    drop_path = getattr(vit_config(model), "drop_path", 0.0)
    return f"stochastic depth {drop_path:g}" + (f", pad-crop {augment.pad} px" if augment.crop == "pad" else "")
