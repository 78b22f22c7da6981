"""The plan: the numbers a run is made of, computed once from config + data + world (STYLE.md section 5).

Steps, micro-batch and accumulation, the learning rate and its scaling rule, warmup, device and
precision, seeds, evaluation cadence and the time estimate.  `vitkit train` prints it before the first
step (with the measured speed, see train/estimate.py), the trainer runs it, MPP and bench read it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from vitkit.data.transforms import describe_augment
from vitkit.device import pick_device, resolve_precision
from vitkit.models import build_model
from vitkit.models.configs import image_size, vit_config
from vitkit.train.config import OptimConfig, TrainConfig
from vitkit.train.schedule import Schedule, resolve_warmup, scaled_lr

LONG_RUN_MINUTES = 60.0  # a plan longer than this says so and names --max-minutes

OPTIMIZER_NAMES = {"muon": "muon (encoder matrices{scale}) + adamw (embeddings, norms, biases, head)"}


def optimizer_name(optim: OptimConfig) -> str:
    """The optimiser as the plan names it; Muon's part says its lr factor where it has one."""
    scale = f", lr x {optim.muon_lr_scale:g}" if optim.muon_lr_scale != 1.0 else ""
    return OPTIMIZER_NAMES.get(optim.name, optim.name).format(scale=scale)


def decay_name(kind: str, end_fraction: float) -> str:
    """The learning rate's shape after warmup, as the plan prints it."""
    if kind == "constant":
        return "constant after warmup"
    end = "0" if end_fraction <= 0 else f"{end_fraction:.0%} of the peak"
    return f"{kind} decay to {end}"


# ------------------------------------------------------------------------------------- seeds
def init_seed(seed: int, rank: int) -> int:
    """Global torch RNG (weights, dropout): the same init on every rank (DDP broadcasts rank 0's anyway)."""
    return seed * 1000 + rank


def resumed_seed(seed: int, rank: int, step: int) -> int:
    """Ranks > 0 resume from a (seed, rank, step) stream: only rank 0's RNG state is saved."""
    return seed * 1000 + rank + 7 * step


def augment_seed(seed: int, rank: int) -> int:
    """The augmentation (and MPP corruption) generator on the training device."""
    return seed * 7919 + rank


@dataclass(frozen=True)
class Plan:
    """What a run will do.  `measured` holds the warm-up's speed and the ETA once known."""

    recipe: str
    data: str
    objective: str  # "classification" or "masked patch prediction"
    num_train: int
    params: int
    img_size: int
    processes: int
    global_batch: int
    micro_batch: int
    accumulation: int
    steps: int
    epochs: float
    lr: float  # peak learning rate after scaling
    base_lr: float
    base_batch: int
    lr_scaling: str
    optimizer: str
    warmup: int
    device: str
    precision: str  # "bf16" (autocast) or "fp32"
    seed: int
    eval_every: int  # steps between evaluations during training; 0 = only the final one
    budget_minutes: float  # 0 = none
    budget_schedule: str  # "fit" (the schedule runs by the clock) or "cut"
    augment: tuple[str, ...]
    flip_views: bool = False  # evaluations average each image's logits with its mirror image's
    resolution_phases: tuple[tuple[int, float], ...] = ()
    patch_dropout_phases: tuple[tuple[float, float], ...] = ()  # (rate, until fraction); every patch after the last
    patch_dropout_keep: str = "random"  # which patches PatchDropout keeps: random, or content before flat ones
    data_path: str = ""  # how the training split is read: in memory, files through workers, or a shard stream
    splits: dict[str, Any] = field(default_factory=dict)  # images per part and where they came from
    measured: dict[str, Any] = field(default_factory=dict)  # images/s, ETA (train/estimate.py)
    decay: str = ""  # the learning rate's shape after warmup, in words ("linear decay to 0")
    regularisation: str = ""  # the run-length rule's decision, in words (train/short_run.py); "" = rule off

    @property
    def fitted(self) -> bool:
        return self.budget_minutes > 0 and self.budget_schedule == "fit"

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for name in ("resolution_phases", "patch_dropout_phases"):
            out[name] = [list(p) for p in getattr(self, name)]
            if not out[name]:
                del out[name]
        out["augment"] = list(self.augment)
        return out


def total_steps(config: TrainConfig, num_train: int) -> int:
    """Optimiser steps of the run: data.steps, or ceil(epochs x N / B)."""
    if config.data.steps > 0:
        return config.data.steps
    return max(1, math.ceil(config.data.epochs * num_train / config.data.batch_size))


def micro_batch_size(config: TrainConfig, world: int) -> int:
    local, rest = divmod(config.data.batch_size, world)
    if rest:
        raise ValueError(f"data.batch_size {config.data.batch_size} is not divisible by {world} processes")
    micro = config.data.micro_batch_size or local
    if local % micro:
        raise ValueError(f"per-process batch {local} is not a multiple of data.micro_batch_size {micro}")
    return micro


def warmup_steps(config: TrainConfig, steps: int) -> int:
    """Warmup of a run of `steps`: explicit steps, else the fraction (capped by optim.warmup_max_steps)."""
    warmup = resolve_warmup(steps, config.optim.warmup_steps, config.optim.warmup_fraction)
    if config.optim.warmup_max_steps and not config.optim.warmup_steps:
        warmup = min(warmup, config.optim.warmup_max_steps)
    return warmup


def count_params(model_config: Any) -> int:
    """Parameters of a model config; big models are built on the meta device (no memory, no init cost)."""
    vit = getattr(model_config, "vit", model_config)
    rough = 12 * getattr(vit, "depth", 50) * getattr(vit, "hidden_size", 1024) ** 2
    if rough < 50_000_000:  # building small models for real is faster than the meta device's first use
        with torch.random.fork_rng(devices=[]):  # counting must not move the RNG that initialises the run
            return sum(p.numel() for p in build_model(model_config).parameters())
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(model_config).parameters())


def make_plan(config: TrainConfig, num_train: int, world: int = 1, local_rank: int = 0) -> Plan:
    """The plan of `config` on `num_train` training images with `world` processes."""
    micro = micro_batch_size(config, world)
    steps = total_steps(config, num_train)
    base = config.optim.base_batch_size or config.data.batch_size
    warmup = warmup_steps(config, steps)
    device = pick_device(config.run.device, local_rank)
    per_epoch = num_train / config.data.batch_size
    every = max(1, round(config.eval.every_epochs * per_epoch)) if config.eval.every_epochs > 0 else 0
    return Plan(
        recipe=config.recipe, data=config.data.uri,
        objective="masked patch prediction" if config.mpp is not None else "classification",
        num_train=num_train, params=count_params(config.model), img_size=image_size(config.model), processes=world,
        global_batch=config.data.batch_size, micro_batch=micro, accumulation=config.data.batch_size // world // micro,
        steps=steps, epochs=steps * config.data.batch_size / num_train,
        lr=scaled_lr(config.optim.lr, config.data.batch_size, base, config.optim.lr_scaling), base_lr=config.optim.lr,
        base_batch=base, lr_scaling=config.optim.lr_scaling, warmup=warmup,
        optimizer=optimizer_name(config.optim), decay=decay_name(config.optim.schedule, config.optim.end_lr_fraction),
        device=str(device), precision=resolve_precision(config.run.precision, device), seed=config.run.seed,
        eval_every=every, budget_minutes=config.run.max_minutes, budget_schedule=config.run.budget_schedule,
        augment=tuple(describe_augment(config.augment)), flip_views=config.eval.flip_views,
        resolution_phases=tuple(zip(config.data.resolutions, config.data.resolution_until)),
        patch_dropout_phases=_patch_dropout_phases(config),
        patch_dropout_keep=str(getattr(vit_config(config.model), "patch_dropout_keep", "random")),
    )


def schedule_of(config: TrainConfig, plan: Plan) -> Schedule:
    """Every per-step quantity of the run as a function of the schedule position."""
    return Schedule(total_steps=plan.steps, peak_lr=plan.lr, warmup_steps=plan.warmup, kind=config.optim.schedule,
                    end_fraction=config.optim.end_lr_fraction, patch_dropout=_patch_dropout(config),
                    patch_until=config.data.patch_dropout_until, patch_later=config.data.patch_dropout_later,
                    patch_later_until=config.data.patch_dropout_later_until, resolutions=config.data.resolutions,
                    resolution_until=config.data.resolution_until, side=plan.img_size,
                    ema_decay=config.optim.ema_decay, ema_warmup=config.optim.ema_warmup)


def _patch_dropout_phases(config: TrainConfig) -> tuple[tuple[float, float], ...]:
    data = config.data
    later = zip(data.patch_dropout_later, data.patch_dropout_later_until)
    phases = ((_patch_dropout(config), data.patch_dropout_until), *later)
    return tuple((rate, until) for rate, until in phases if until > 0) if any(r > 0 for r, _ in phases) else ()


def _patch_dropout(config: TrainConfig) -> float:
    return float(getattr(vit_config(config.model), "patch_dropout", 0.0))


def plan_lines(plan: Plan) -> list[str]:
    """The plan in words, as `vitkit train` prints it before the first step."""
    from vitkit.train.estimate import eta_lines

    rule = (f"lr {plan.base_lr:g} at global batch {plan.global_batch} (tuned for this batch; no rescaling)"
            if plan.lr_scaling == "none" or plan.base_batch == plan.global_batch else
            f"lr {plan.base_lr:g} x {plan.lr_scaling} rule ({plan.global_batch}/{plan.base_batch}) = {plan.lr:g}")
    lines = [
        f"objective: {plan.objective}; model: {plan.params:,} parameters at {plan.img_size}px",
        f"data: {plan.data}; training split read {plan.data_path or 'in memory'}",
        *(f"  {name}: {part['images']:,} images from {part['from'] or plan.data}" for name, part in plan.splits.items()),
        f"effective global batch: {plan.global_batch} = {plan.processes} process(es) x {plan.micro_batch} x "
        f"{plan.accumulation} accumulation step(s); {plan.steps:,} steps ({plan.epochs:.1f} epochs), warmup {plan.warmup}",
        f"learning rate: {rule}" + (f", {plan.decay}" if plan.decay else "") + f"; {plan.optimizer}",
        f"augmentation: {', '.join(plan.augment) or 'none'}" + _flip_note(plan),
        f"device: {plan.device}, precision {plan.precision}; seed {plan.seed}; evaluation "
        + (f"every {plan.eval_every} steps" if plan.eval_every else "at the end only")
        + ("; each image and its mirror image, logits averaged (the one-view top-1 is reported too)"
           if plan.flip_views else ""),
    ]
    if plan.resolution_phases:
        lines.append("resolution phases: " + ", ".join(f"{side}px until {until:.0%}" for side, until in
                                                          plan.resolution_phases) + f", then {plan.img_size}px")
    if plan.patch_dropout_phases:
        keep = " (patches with content kept first)" if plan.patch_dropout_keep == "content" else ""
        lines.append(f"PatchDropout{keep}: " + ", ".join(f"{rate:g} until {until:.0%}" for rate, until in
                                                  plan.patch_dropout_phases) + ", then every patch")
    if plan.regularisation:
        lines.append(plan.regularisation)
    return lines + eta_lines(plan)


def _flip_note(plan: Plan) -> str:
    """Where the source cannot tell whether a mirror image keeps its label, say which convention runs."""
    from vitkit.data.sources import mirror_keeps_label

    if "horizontal flip" in plan.augment and mirror_keeps_label(plan.data) is None:
        return " (flips: the convention for natural images; --set augment.flip=false if a mirror image changes the label)"
    return ""
