"""Regularisation fitted to the run's length: a run that holds few epochs trains lighter, a long one heavier.

How much regularisation pays depends on how long a model trains.  small-32px's stochastic depth 0.1 and
4-px pad-crop suit ~50-75 epochs; in the ~40 epochs a slow 2-core CPU fits in 30 minutes of CIFAR-10 they
hold the model back (16-minute runs on a fast host, ~40 epochs: 79.60-80.05% with them, 80.11-80.63% without),
and at the 80-85 epochs a fast one fits they let it overfit (79.99% at 85.5 epochs, test loss 0.65; with
stochastic depth 0.2: 81.20%, 81.01%, test loss 0.61).

Two thresholds turn this into a rule (each 0 = off).  A run planned for fewer than `optim.light_below_epochs`
epochs (under a fitted budget, the epochs that fit at the measured speed, checked below) trains without
stochastic depth and with half the configured pad-crop; one planned for at least `optim.heavy_from_epochs`
trains with twice the configured stochastic depth.  The speed is only known after the model is built and
compiled, so the setting is applied in place: DropPath's rate is a buffer (no recompilation, models/vit.py)
and the augmentation is read from the objective's config at every batch.  The decision is taken on the run's
first invocation, from the rehearsal's estimate and then, for good, from the speed check's (train/estimate.py,
SpeedCheck: the first real steps timed whole, since the rehearsal leaves out the batch and the optimiser step),
agreed by every process (the fewest epochs any of them measured) and stored with the checkpoints: a resumed run
keeps it.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from torch import nn

from vitkit.models.configs import HybridConfig, ViTConfig, replace_vit, vit_config
from vitkit.models.vit import VisionTransformer
from vitkit.train import distributed
from vitkit.train.config import TrainConfig
from vitkit.train.plan import Plan

Decision = Literal["light", "configured", "heavy"]


def planned_epochs(plan: Plan) -> float:
    """The epochs the run will train: under a fitted budget those that fit at the measured speed."""
    if plan.fitted and "fit_epochs" in plan.measured:
        return float(plan.measured["fit_epochs"])
    return plan.epochs


def active(config: TrainConfig) -> bool:
    """Whether the rule is on (either threshold set)."""
    return config.optim.light_below_epochs > 0 or config.optim.heavy_from_epochs > 0


def decide(config: TrainConfig, plan: Plan, stored: Decision | bool | None, device: torch.device) -> Decision | None:
    """The run's regularisation tier; None: the rule is off.  `stored`: an earlier invocation's decision
    (checkpoints before session 42 stored a bool: True = light)."""
    light_below, heavy_from = config.optim.light_below_epochs, config.optim.heavy_from_epochs
    if not active(config):
        return None
    if stored is not None:
        return ("light" if stored else "configured") if isinstance(stored, bool) else stored
    epochs = distributed.min_across(planned_epochs(plan), device)
    if epochs < light_below:
        return "light"
    return "heavy" if 0 < heavy_from <= epochs else "configured"


def lighter(config: TrainConfig) -> TrainConfig:
    """`config` with a short run's regularisation: no stochastic depth, half the pad-crop."""
    augment = dataclasses.replace(config.augment, pad=config.augment.pad // 2)
    return dataclasses.replace(config, model=_with_drop_path(config, 0.0), augment=augment)


def heavier(config: TrainConfig) -> TrainConfig:
    """`config` with a long run's regularisation: twice the stochastic depth."""
    return dataclasses.replace(config, model=_with_drop_path(config, 2 * _drop_path(config)))


def fitted(config: TrainConfig, decision: Decision | None) -> TrainConfig:
    """`config` as the decision trains it."""
    return lighter(config) if decision == "light" else heavier(config) if decision == "heavy" else config


def apply(config: TrainConfig, decision: Decision | None, network: nn.Module) -> TrainConfig:
    """`fitted(config, decision)`, with stochastic depth set in every ViT inside `network`, in place (compiled
    graphs stay valid; a decision taken again overrides the first); the objective reads the returned config's
    augmentation.  `config`: as configured."""
    new = fitted(config, decision)
    if _drop_path(new) > 0 or _drop_path(config) > 0:
        for module in network.modules():
            if isinstance(module, VisionTransformer):
                module.set_drop_path(_drop_path(new))
    return new


def describe(config: TrainConfig, plan: Plan, decision: Decision | None) -> str:
    """The plan's line on the rule (`config` as configured); empty when the rule is off."""
    if decision is None:
        return ""
    held = f"about {planned_epochs(plan):g} epochs " + ("fit" if plan.fitted else "planned")
    light = f"optim.light_below_epochs={config.optim.light_below_epochs:g}"
    heavy = f"optim.heavy_from_epochs={config.optim.heavy_from_epochs:g}"
    if decision == "configured":
        bounds = ", ".join(f"{word} {name}" for word, name, on in (
            ("not fewer than", light, config.optim.light_below_epochs > 0),
            ("fewer than", heavy, config.optim.heavy_from_epochs > 0)) if on)
        return f"regularisation as configured ({held}, {bounds}): {_regularisation(config)}"
    kind, length, bound = (("lighter", "short", f"fewer than {light}") if decision == "light"
                           else ("heavier", "long", f"at least {heavy}"))
    return (f"{kind} regularisation for a {length} run ({held}, {bound}): "
            f"{_regularisation(fitted(config, decision))} instead of {_regularisation(config)}")


def _drop_path(config: TrainConfig) -> float:
    return getattr(vit_config(config.model), "drop_path", 0.0)


def _with_drop_path(config: TrainConfig, rate: float):
    model = config.model
    return replace_vit(model, drop_path=rate) if isinstance(model, (ViTConfig, HybridConfig)) else model


def _regularisation(config: TrainConfig) -> str:
    augment = config.augment
    return f"stochastic depth {_drop_path(config):g}" + (f", pad-crop {augment.pad} px" if augment.crop == "pad" else "")
