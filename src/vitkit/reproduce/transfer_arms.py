"""The arms of the `transfer` study: runs built exactly as a user's commands build them, and the few-shot probes.

Each training arm is the config `vitkit train` or `vitkit finetune` resolves (train/resolve.py) for the
request a user would type, so an arm measures what that command gives in its budget:

    pretrain-F          vitkit train --data PRETRAIN --max-minutes P        (F = vit; resnet, hybrid: the model swapped)
    finetune-F@N        vitkit finetune <pretrain-F> --data TARGET --labels-per-class N --max-minutes U
    scratch-F@N         vitkit train --data TARGET --labels-per-class N --max-minutes U
    scratch-total-vit@N the same for U + P minutes: pre-training's minutes added (ViT only)
    fewshot-pretrained-F, fewshot-random-F   10-shot linear accuracy on TARGET of the pre-trained encoder and of
                        the same architecture randomly initialised (no training)

N = 0 means every training image.  The BiT ResNet and the hybrid (with --families) are the ViT's closest in
forward FLOPs (reproduce/scale.py, as in the data-size study), trained by the same recipe.  Arms are budgets
in minutes, not steps: the claims are about what a user gets in M minutes of a plain command, each recipe at
its own speed (unlike the other studies, whose arms compare models at equal steps).  Run the study on an
otherwise idle machine; every arm's record keeps its steps and images seen.  At the tiny scale (tests) arms
run the -tiny recipes for a fixed TINY_STEPS steps per unit.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from vitkit.checkpoints import read
from vitkit.checkpoints.native import Checkpoint
from vitkit.data.sources import describe
from vitkit.device import pick_device
from vitkit.models import build_model
from vitkit.models.configs import ModelConfig, ViTConfig
from vitkit.models.flops import model_flops
from vitkit.reproduce.arms import Probes, reuse, run_train_arm, write_record
from vitkit.reproduce.scale import hybrid_for, matched_resnet
from vitkit.reproduce.spec import Arm, Context
from vitkit.runs import find_checkpoint, open_checkpoint
from vitkit.train.config import TrainConfig, optim_for, to_dict
from vitkit.train.plan import count_params
from vitkit.train.recipes import auto_recipe_name
from vitkit.train.resolve import Request, resolve

LABELS = (10, 100, 0)  # labelled images per class of the target's training split; 0 = all of them
TINY_LABELS = (10, 0)
PRETRAIN_UNITS = 4.0  # pre-training's budget in fine-tuning budgets: 60 minutes against 15
SHOTS = 10  # the few-shot arms' k (Sec. 4.1)
TINY_STEPS = 10  # steps of one unit at the tiny scale
CHECKPOINT_EVERY = 200  # steps: a killed arm loses at most this much
FAMILIES = ("resnet", "hybrid")  # with --families, beside "vit"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Grid:
    """What the transfer study's arms are for one request."""

    tiny: bool
    unit_minutes: float  # the fine-tuning budget U (0 at the tiny scale: TINY_STEPS per unit)
    labels: tuple[int, ...]
    families: tuple[str, ...]  # "vit" first
    pretrain_data: str
    init: str  # a given ViT checkpoint ("" = pre-train one)


def units_per_seed(labels: int, families: int, init: bool) -> float:
    """Unit budgets of one seed's arms: ViT pre-training (unless given), then per label count a fine-tuning, a
    from-scratch and a from-scratch-with-pre-training's-minutes arm; each other family pre-trains, then per label
    count one fine-tuning and one from-scratch arm."""
    vit = (0.0 if init else PRETRAIN_UNITS) + labels * (3 + PRETRAIN_UNITS)
    return vit + (families - 1) * (PRETRAIN_UNITS + 2 * labels)


def grid(context: Context) -> Grid:
    request = context.request
    tiny = context.scale.name == "tiny"
    labels = TINY_LABELS if tiny else LABELS
    families = ("vit", *FAMILIES) if request.families else ("vit",)
    units = units_per_seed(len(labels), len(families), bool(request.init)) * request.seeds
    return Grid(
        tiny=tiny,
        unit_minutes=0.0 if tiny else request.budget_minutes / units,
        labels=labels,
        families=families,
        pretrain_data=request.pretrain_data or request.data,
        init=request.init,
    )


def tag(labels: int) -> str:
    return "all" if labels == 0 else str(labels)


def _config(
    context: Context, g: Grid, request: Request, units: float, tiny_recipe: str, source_model: ModelConfig | None = None
) -> TrainConfig:
    """The config `request` resolves to for `units` unit budgets, with the study's settings (no progress bar, its
    threads and device, checkpoints every CHECKPOINT_EVERY steps)."""
    if g.tiny:
        steps = f"data.steps={round(TINY_STEPS * units)}"
        request = dataclasses.replace(request, recipe=tiny_recipe, overrides=(steps,))
    else:
        request = dataclasses.replace(request, max_minutes=round(g.unit_minutes * units, 3))
    config = resolve(dataclasses.replace(request, out="planned", quiet=True), source_model=source_model).config
    # fp32 at the tiny scale, as the other studies' tiny arms (bf16 GroupNorms of 1x1 maps overflow)
    run = dataclasses.replace(
        config.run,
        tensorboard=False,
        threads=context.request.threads,
        device=context.request.device,
        precision="fp32" if g.tiny else config.run.precision,
        checkpoint_every=min(config.run.checkpoint_every, CHECKPOINT_EVERY),
    )
    return dataclasses.replace(config, run=run)


def _family_model(model: ModelConfig, family: str) -> ModelConfig:
    """The recipe's ViT, or the BiT ResNet / hybrid closest to it in forward FLOPs (PatchDropout off: it is the
    ViT's speed-up, not defined on a ResNet's feature map)."""
    if family == "vit" or not isinstance(model, ViTConfig):
        return model
    if family == "resnet":
        return matched_resnet(model)
    hybrid = hybrid_for(model)
    return dataclasses.replace(hybrid, vit=dataclasses.replace(hybrid.vit, patch_dropout=0.0))


def _with_model(config: TrainConfig, family: str) -> TrainConfig:
    model = _family_model(config.model, family)
    return dataclasses.replace(config, model=model, optim=optim_for(config.optim, model))


def pretrain_arm(context: Context, g: Grid, family: str, seed: int) -> Arm:
    info = describe(g.pretrain_data)
    config = _config(
        context, g, Request(data=g.pretrain_data, seed=seed), PRETRAIN_UNITS, auto_recipe_name(info) + "-tiny"
    )
    return Arm(
        name=f"pretrain-{family}",
        seed=seed,
        config=_with_model(config, family),
        labels={"kind": "pretrain", "family": family},
        measure=(),
        units=PRETRAIN_UNITS,
    )


Encoder = tuple[str, ModelConfig]  # a checkpoint path (it may not exist yet) and its model config


def given_encoder(path: str) -> Encoder:
    """--init: a pre-trained checkpoint or run directory, and its model config."""
    return path, read(find_checkpoint(path)).model.config


def trained_encoder(context: Context, pretrain: Arm) -> Encoder:
    """A pre-training arm's final checkpoint (written when it has run) and its model config (known before)."""
    return str(context.arm_model(pretrain.key)), pretrain.config.model


def finetune_arm(context: Context, g: Grid, encoder: Encoder, family: str, labels: int, seed: int) -> Arm:
    request = Request(data=context.request.data, seed=seed, init_from=encoder[0], labels_per_class=labels or None)
    config = _config(context, g, request, 1.0, "finetune-small-tiny", encoder[1])
    return Arm(
        name=f"finetune-{family}@{tag(labels)}",
        seed=seed,
        config=config,
        measure=(),
        units=1.0,
        labels={"kind": "finetune", "family": family, "labels_per_class": labels},
    )


def scratch_arm(context: Context, g: Grid, family: str, labels: int, seed: int, total: bool = False) -> Arm:
    units = 1.0 + (PRETRAIN_UNITS if total else 0.0)
    request = Request(data=context.request.data, seed=seed, labels_per_class=labels or None)
    config = _config(context, g, request, units, auto_recipe_name(context.info) + "-tiny")
    kind = "scratch-total" if total else "scratch"
    return Arm(
        name=f"{kind}-{family}@{tag(labels)}",
        seed=seed,
        config=_with_model(config, family),
        measure=(),
        units=units,
        labels={"kind": kind, "family": family, "labels_per_class": labels},
    )


def fewshot_arm(context: Context, g: Grid, encoder: Encoder, family: str, seed: int, pretrained: bool) -> Arm:
    """SHOTS-shot linear accuracy on the target of the encoder (or its random initialisation): the config says
    which data, resolution and encoder (`run.init_from`; "" = random) the probe reads."""
    tuned = finetune_arm(context, g, encoder, family, 0, seed).config  # the target at the fine-tuning resolution
    run = dataclasses.replace(tuned.run, init_from=encoder[0] if pretrained else "")
    config = dataclasses.replace(tuned, model=encoder[1], run=run)
    which = "pretrained" if pretrained else "random"
    return Arm(
        name=f"fewshot-{which}-{family}",
        seed=seed,
        config=config,
        measure=("fewshot",),
        units=0.0,
        labels={"kind": f"fewshot-{which}", "family": family},
    )


def run_arm(arm: Arm, path: Path, probes: Probes) -> dict[str, Any]:
    """Train and record a training arm (reproduce/arms.py), or probe an encoder for a few-shot arm."""
    if not arm.labels["kind"].startswith("fewshot"):
        return run_train_arm(arm, path, probes)
    stored = reuse(arm, path, to_dict(arm.config))
    if stored is not None:
        return stored
    began, config = time.monotonic(), arm.config
    if config.run.init_from:
        checkpoint = open_checkpoint(config.run.init_from)
    else:  # the same architecture, initialised by the arm's seed (its classes and head are never read)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(arm.seed)
            checkpoint = Checkpoint(model=build_model(config.model).eval(), mean=config.data.mean, std=config.data.std)
    probe = Probes(config.run.device, shots=(SHOTS,), draws=probes.draws)  # the study's draws (2 at the tiny scale)
    record = {
        "arm": arm.name,
        "seed": arm.seed,
        "labels": arm.labels,
        "units": 0.0,
        "config": to_dict(config),
        "params": count_params(config.model),
        "forward_flops": model_flops(config.model),
        "device": str(pick_device(config.run.device)),
        "encoder": config.run.init_from or "random",
        "fewshot": probe.fewshot(checkpoint, config),
        "reused": False,
    }
    record["wall_minutes"] = round((time.monotonic() - began) / 60, 3)
    write_record(path, record)
    return record
