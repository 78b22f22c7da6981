"""The plan: the numbers a run is made of, computed once from config + data + world + host (STYLE.md section 5).

Steps, micro-batch and accumulation, the learning rate and its scaling rule, warmup, device, host,
precision and compilation with the reasons for each, seeds, evaluation cadence, and the time estimate of
the warm-up (train/budget.py).  The trainer makes it once, after its warm-up; `vitkit train` prints it
before the first step (train/plan_text.py); MPP and bench read it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vitkit.data.transforms import describe_augment
from vitkit.models import build_model
from vitkit.models.configs import image_size, in_channels, replace_vit, vit_config
from vitkit.train.budget import GraphKey, steps_that_fit
from vitkit.train.config import OptimConfig, TrainConfig, budget_fitted
from vitkit.train.schedule import Schedule, resolve_warmup, scaled_lr

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
STREAMS = ("init", "augment", "resumed-init", "resumed-augment")  # a run's random streams (data order: data/loader.py)


def _stream_seed(name: str, seed: int, *words: int) -> int:
    """A 63-bit seed of stream `name` of the run seeded `seed`, by numpy's SeedSequence: the streams of one run
    share no seed, so the weights and the augmentation draw independently whatever the run's seed."""
    entropy = [seed, STREAMS.index(name), *words]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> np.uint64(1))


def init_seed(seed: int, rank: int) -> int:
    """Global torch RNG (weights, dropout), one stream a rank, so dropout differs between ranks.  DDP broadcasts
    rank 0's weights; under FSDP each rank keeps its shard of its own draw, from the same distribution."""
    return _stream_seed("init", seed, rank)


def resumed_seeds(seed: int, rank: int, step: int) -> tuple[int, int]:
    """(global, augmentation) seeds from which ranks > 0 resume where the checkpoint lacks their own RNG states
    (written by another number of processes, or keeping rank 0's alone)."""
    return _stream_seed("resumed-init", seed, rank, step), _stream_seed("resumed-augment", seed, rank, step)


def augment_seed(seed: int, rank: int) -> int:
    """The augmentation (and MPP corruption) generator on the training device."""
    return _stream_seed("augment", seed, rank)


@dataclass(frozen=True)
class Plan:
    """What a run will do, and why (the host's choices)."""

    recipe: str
    data: str
    objective: str  # "classification" or "masked patch prediction"
    num_train: int
    params: int
    img_size: int
    channels: int  # of the model's input: 1 reads every image as grayscale
    processes: int
    global_batch: int
    micro_batch: int
    accumulation: int
    steps: int  # the schedule's length; a budgeted run without a length of its own: the steps estimated to fit
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
    steps_given: bool = True  # the run has a length of its own (else the budget alone decides it)
    start_step: int = 0  # the step a resumed run continues from (0: a new run)
    flip_views: bool = False  # evaluations average each image's logits with its mirror image's
    patch_dropout: tuple[float, float] = (0.0, 1.0)  # (rate, until fraction); every patch after it
    patch_dropout_keep: str = "random"  # which patches PatchDropout keeps: random, or content before flat ones
    data_path: str = ""  # how the training split is read: in memory, files through workers, or a shard stream
    splits: dict[str, Any] = field(default_factory=dict)  # images per part and where they came from
    host: str = ""  # the host class, in words (vitkit.host)
    precision_reason: str = ""  # why this precision (vitkit.device.choose_precision)
    compiled: bool = False  # the model runs through torch.compile
    compile_reason: str = ""  # why it does or does not (train/compiled.py)
    measured: dict[str, Any] = field(default_factory=dict)  # the warm-up's estimate: images/s, ETA, epochs that fit
    decay: str = ""  # the learning rate's shape after warmup, in words ("linear decay to 0")
    ema_decay: float = 0.0  # Polyak averaging of the weights (the final model is the average); 0 = none

    @property
    def fitted(self) -> bool:
        return budget_fitted(self.budget_minutes, self.budget_schedule)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["augment"], out["patch_dropout"] = list(self.augment), list(self.patch_dropout)
        return out


def total_steps(config: TrainConfig, num_train: int) -> int | None:
    """Optimiser steps of the run: data.steps, or ceil(epochs x N / B); None when a time budget alone decides."""
    if config.data.steps > 0:
        return config.data.steps
    if config.data.epochs <= 0:
        return None
    return max(1, math.ceil(config.data.epochs * num_train / config.data.batch_size))


def eval_period(config: TrainConfig, num_train: int) -> int:
    """Optimiser steps between evaluations during training: `eval.every_epochs` rounded to steps; 0 = none."""
    every = config.eval.every_epochs
    return max(1, round(every * num_train / config.data.batch_size)) if every > 0 else 0


def micro_batch_size(config: TrainConfig, world: int) -> int:
    local, rest = divmod(config.data.batch_size, world)
    if rest:
        raise ValueError(f"data.batch_size {config.data.batch_size} is not divisible by {world} processes")
    micro = min(config.data.micro_batch_size or local, local)  # a bound on a forward pass: one above a process's
    if local % micro:  # share (a recipe's 16 when 2 processes hold 8 each) is no accumulation, not an error
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
        if getattr(vit, "init", "official") == "mimetic":  # its SVDs cost seconds on a loaded host, and no count
            model_config = replace_vit(model_config, init="official")
        with torch.random.fork_rng(devices=[]):  # counting must not move the RNG that initialises the run
            return sum(p.numel() for p in build_model(model_config).parameters())
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(model_config).parameters())


def patch_dropout_of(config: TrainConfig) -> tuple[float, float]:
    """(PatchDropout rate, the schedule fraction it lasts until); (0, 1) without PatchDropout."""
    vit = vit_config(config.model)
    rate = float(getattr(vit, "patch_dropout", 0.0))
    return (rate, float(getattr(vit, "patch_dropout_until", 1.0))) if rate > 0 else (0.0, 1.0)


def schedule_of(config: TrainConfig, steps: int, lr: float) -> Schedule:
    """Every per-step quantity of a run of `steps` as a function of the position."""
    rate, until = patch_dropout_of(config)
    return Schedule(
        total_steps=steps,
        peak_lr=lr,
        warmup_steps=warmup_steps(config, steps),
        kind=config.optim.schedule,
        end_fraction=config.optim.end_lr_fraction,
        patch_dropout=rate,
        patch_until=until,
        side=image_size(config.model),
        ema_decay=config.optim.ema_decay,
    )


@dataclass(frozen=True)
class HostChoices:
    """What the host decided before the plan: its class, the precision and compilation, with their reasons."""

    host: str = ""
    precision: str = "fp32"
    precision_reason: str = ""
    compiled: bool = False
    compile_reason: str = ""


def make_plan(
    config: TrainConfig,
    num_train: int,
    world: int = 1,
    *,
    device: torch.device | None = None,
    choices: HostChoices | None = None,
    timings: dict[GraphKey, float] | None = None,
    budget_s: float | None = None,
    eval_images: int = 0,
    eval_image_s: float | None = None,
    start_step: int = 0,
) -> Plan:
    """The plan of `config` on `num_train` training images with `world` processes.

    `timings` (the warm-up's seconds per micro-batch pass and phase) give the estimate; `budget_s` (the usable
    seconds of a fitted budget) the steps that fit, which are the schedule's length when the run has none;
    `eval_image_s` (a timed evaluation forward, seconds per image) what the `eval_images` evaluations take;
    `start_step` where a resumed run continues (the estimate is of the steps left).
    """
    choices = choices or HostChoices()
    micro, batch = micro_batch_size(config, world), config.data.batch_size
    accumulation = batch // world // micro
    given, spans, fit, steps = _length(config, num_train, accumulation, timings or {}, budget_s)
    base = config.optim.base_batch_size or batch
    plan = Plan(
        **_from_config(config),
        num_train=num_train,
        processes=world,
        global_batch=batch,
        micro_batch=micro,
        accumulation=accumulation,
        steps=steps,
        epochs=steps * batch / num_train,
        lr=scaled_lr(config.optim.lr, batch, base, config.optim.lr_scaling),
        base_lr=config.optim.lr,
        base_batch=base,
        lr_scaling=config.optim.lr_scaling,
        warmup=warmup_steps(config, steps),
        device=str(device or "cpu"),
        **dataclasses.asdict(choices),  # host, precision and compilation, each with its reason
        eval_every=eval_period(config, num_train),
        steps_given=given is not None,
        start_step=start_step,
    )
    evaluation = (eval_images, eval_image_s)
    return dataclasses.replace(plan, measured=_estimate(plan, spans, timings or {}, fit, budget_s, evaluation))


def _from_config(config: TrainConfig) -> dict[str, Any]:
    """The plan's fields that the config alone decides: what trains, how, and with what regularisation."""
    return {
        "recipe": config.recipe,
        "data": config.data.uri,
        "objective": "masked patch prediction" if config.mpp is not None else "classification",
        "params": count_params(config.model),
        "img_size": image_size(config.model),
        "channels": in_channels(config.model),
        "optimizer": optimizer_name(config.optim),
        "decay": decay_name(config.optim.schedule, config.optim.end_lr_fraction),
        "seed": config.run.seed,
        "budget_minutes": config.run.max_minutes,
        "budget_schedule": config.run.budget_schedule,
        "augment": tuple(describe_augment(config.augment)),
        "flip_views": config.eval.flip_views,
        "patch_dropout": patch_dropout_of(config),
        "patch_dropout_keep": str(getattr(vit_config(config.model), "patch_dropout_keep", "random")),
        "ema_decay": config.optim.ema_decay,
    }


def _length(
    config: TrainConfig,
    num_train: int,
    accumulation: int,
    timings: dict[GraphKey, float],
    budget_s: float | None,
) -> tuple[int | None, list[tuple[float, float, float]], int | None, int]:
    """(the run's own steps or None, the phases' spans, the steps a fitted budget holds or None, the length)."""
    given = total_steps(config, num_train)
    spans = _step_spans(config, accumulation, timings)
    fit = steps_that_fit(spans, budget_s) if spans and budget_s else None
    return given, spans, fit, given or fit or max(1, math.ceil(num_train / config.data.batch_size))


def _step_spans(
    config: TrainConfig, accumulation: int, timings: dict[GraphKey, float]
) -> list[tuple[float, float, float]]:
    """(begin, end fraction, seconds a step) of each phase of the schedule, from the warm-up's passes."""
    if not timings:
        return []
    slowest, side = max(timings.values()), image_size(config.model)
    spans = schedule_of(config, 1, 1.0).spans()
    return [(begin, end, accumulation * timings.get((rate, side), slowest)) for begin, end, rate in spans]


def _estimate(
    plan: Plan,
    spans: list[tuple[float, float, float]],
    timings: dict[GraphKey, float],
    fit: int | None,
    budget_s: float | None,
    evaluation: tuple[int, float | None],
) -> dict[str, Any]:
    """Images/s, minutes and (fitted budget) epochs that fit, as the warm-up's forward + backward passes give them
    (the batch and the optimiser step are not in them: a real step is slower), the evaluations' seconds and,
    with a fitted budget, the seconds left to train once they are kept back."""
    eval_images, eval_image_s = evaluation
    if not spans:
        return {}
    step_s = sum((end - begin) * seconds for begin, end, seconds in spans)  # the phases weighed by their share
    per_image_s = timings.get((0.0, plan.img_size), max(timings.values())) / plan.micro_batch
    left = max(plan.steps - plan.start_step, 0)
    evals = ((plan.steps // plan.eval_every - plan.start_step // plan.eval_every) if plan.eval_every else 0) + 1
    views = 2 if plan.flip_views else 1  # the measured figure has them; the guess: forward only, a third of a pass
    eval_image_s = eval_image_s or views * per_image_s / 3
    eval_s = evals * eval_images * eval_image_s
    out = {
        "images_per_s": round(plan.global_batch / step_s, 1),
        "step_seconds": round(step_s, 4),
        "eta_minutes": round((left * step_s + eval_s) / 60, 2),
        "eval_seconds": round(eval_s, 1),
        "final_eval_seconds": round(eval_images * eval_image_s, 3),  # the last of them, which a budget keeps back
        "eval_image_ms": round(eval_image_s * 1000, 4),
    }
    if fit is not None:  # the final evaluation kept back, the periodic ones of the steps that fit beside them
        final_s = eval_images * eval_image_s
        periodic_s = final_s / plan.eval_every if plan.eval_every else 0.0  # a step's share of one
        train_s = max((budget_s or 0.0) - final_s, 0.0) * step_s / (step_s + periodic_s)
        trained = steps_that_fit(spans, train_s) if train_s > 0 else 0
        run = min(trained, plan.steps - plan.start_step) if plan.steps_given else trained  # its own steps end it
        out["eval_seconds"] = round(final_s + periodic_s * run, 1)
        out["fit_steps"], out["fit_epochs"] = trained, round(trained * plan.global_batch / plan.num_train, 1)
        out["eta_minutes"] = round(plan.budget_minutes, 2)
        out["train_seconds"] = round(train_s, 1)
    return out
