"""The fine-tuning learning-rate sweep of App. B.1.1.

"We run a small grid search over learning rates ... we use small sub-splits from the training set
(10% for Pets and Flowers, 2% for CIFAR, 1% ImageNet) as development set and train on the
remaining data.  For final results we train on the entire training set."  `train_with_sweep` does
exactly that: one run per learning rate in `optim.lr_sweep` on train minus `data.val_fraction`,
scored by top-1 on the held-out part, then the best learning rate on all of train, evaluated on
test.  Each trial is a run directory under `<out>/sweep/`, so an interrupted sweep resumes.

Within a time budget (`--max-minutes M`) the trials and the final run share it: the G trials take
SWEEP_SHARE of M together (each M x SWEEP_SHARE / G, its schedule fitted to that), the final run the
rest, less whatever the trials took beyond their share, so the whole sweep ends within M (a sweep that stops
early leaves the final run the shares of the trials it did not run as well).  With the
paper's four rates and M = 15 that is 1.9 minutes a trial and 7.5 for the final run.  Shorter trials
than the final run favour larger rates a little; they are all the same length, so they compare the rates
fairly with one another.  A trial that spends STARVED_SHARE of its budget or more starting up (reading
the data, loading the checkpoint, the warm-up) trains too few steps to tell the rates apart: the sweep
stops there and the final run trains at the configured rate, with a warning that names a budget large
enough.

A source with a validation split of its own (a folder's val/ beside test/, val-* shards, an hf:
validation split) scores the trials on it; any other on a class-stratified hold-out of train.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from vitkit.atomic import atomic_write_text
from vitkit.data.sources import separate_val
from vitkit.device import pick_device
from vitkit.runs import SWEEP_RECORD, RunDir
from vitkit.train import distributed
from vitkit.train.assemble import reading_of
from vitkit.train.config import TrainConfig
from vitkit.train.trainer import train

log = logging.getLogger(__name__)

SWEEP_SHARE = 0.5  # of a time budget spent on the trials together; the final run gets the rest
STARVED_SHARE = 0.5  # a trial whose start-up takes this share of its budget stops the sweep
now = time.monotonic  # the sweep's clock


def budget_split(config: TrainConfig) -> tuple[float, float]:
    """(minutes of each trial, minutes of the final run) of a swept run's budget; (0, 0) without one."""
    minutes = config.run.max_minutes
    if minutes <= 0:
        return 0.0, 0.0
    return minutes * SWEEP_SHARE / len(config.optim.lr_sweep), minutes * (1 - SWEEP_SHARE)


def trial_config(config: TrainConfig, lr: float) -> TrainConfig:
    """One sweep trial: learning rate `lr`, scored on the held-out "val" split."""
    out = RunDir(config.run.out).sweep_trial(lr).path
    return dataclasses.replace(
        config,
        optim=dataclasses.replace(config.optim, lr=lr, lr_sweep=()),
        eval=dataclasses.replace(config.eval, final_split="val"),
        run=dataclasses.replace(config.run, out=str(out), max_minutes=budget_split(config)[0]),
    )


def final_config(config: TrainConfig, lr: float, minutes: float | None = None) -> TrainConfig:
    """The final run: the chosen learning rate on the entire training set, evaluated on test, in `minutes` (by
    default its share of the budget)."""
    return dataclasses.replace(
        config,
        data=dataclasses.replace(config.data, val_fraction=0.0),
        optim=dataclasses.replace(config.optim, lr=lr, lr_sweep=()),
        eval=dataclasses.replace(config.eval, final_split="test"),
        run=dataclasses.replace(config.run, max_minutes=budget_split(config)[1] if minutes is None else minutes),
    )


def best_lr(grid: tuple[float, ...], scores: dict[str, float], losses: dict[str, float]) -> float:
    """The learning rate of the highest val top-1; a tie (a small hold-out has few distinct scores) goes to the
    lower val loss, then to the first in the grid."""
    return max(grid, key=lambda lr: (scores[f"{lr:g}"], -losses[f"{lr:g}"]))


def check_hold_out(config: TrainConfig) -> None:
    """Refuse a sweep whose held-out split would be empty, before any trial trains on it."""
    if separate_val(config.data.uri, reading_of(config)) and config.data.val_fraction <= 0:
        return  # the source's own validation split
    if config.data.val_fraction <= 0:
        raise ValueError("optim.lr_sweep needs data.val_fraction > 0 (the held-out split the trials are scored on)")
    if config.data.labels_per_class == 1:  # stratified_split keeps a class's only image on the training side
        raise ValueError(
            "--lr-sweep scores each learning rate on a class-stratified hold-out of the labelled images, and with "
            "1 label per class that hold-out is empty (every class keeps its one image for training): use "
            "--labels-per-class 2 or more, or leave out --lr-sweep"
        )


def train_with_sweep(config: TrainConfig, *, spent_s: float = 0.0, **train_kwargs: Any) -> dict[str, Any]:
    """`train(config)`, preceded by the LR sweep when `config.optim.lr_sweep` is non-empty; `spent_s`, the
    caller's start-up, is charged to the final run's budget, so the trials are equal."""
    if not config.optim.lr_sweep:
        return train(config, spent_s=spent_s, **train_kwargs)
    info = distributed.current()
    with distributed.held(info, pick_device(config.run.device, info.local_rank)):  # one group for every run
        return _sweep(config, spent_s, **train_kwargs)


def _sweep(config: TrainConfig, spent_s: float, **train_kwargs: Any) -> dict[str, Any]:
    check_hold_out(config)
    info = distributed.current()
    device = pick_device(config.run.device, info.local_rank)
    if info.main:  # only rank 0 writes
        RunDir(config.run.out).create()  # a directory of other files is refused before any trial
    distributed.barrier()
    scores: dict[str, float] = {}
    losses: dict[str, float] = {}
    trial_minutes, final_minutes = budget_split(config)
    began, stopped = now(), ""
    for lr in config.optim.lr_sweep:
        result = train(trial_config(config, lr), **train_kwargs)
        if result["status"] not in ("finished", "time_budget"):  # interrupted: the sweep's own --out resumes it
            return {**result, "sweep": scores, "status": result["status"], "resume_out": str(config.run.out)}
        config = same_precision(config, result)
        scores[f"{lr:g}"], losses[f"{lr:g}"] = result["val"]["top1"], result["val"]["loss"]
        log.info("sweep lr %g: val top-1 %.2f%%, loss %.4f", lr, 100 * scores[f"{lr:g}"], losses[f"{lr:g}"])
        stopped = starved(result, trial_minutes, config)  # by this process's start-up: all agree to stop
        if distributed.any_each([bool(stopped)], device)[0]:
            stopped = stopped or "another process's trial spent its budget starting up: the sweep stops"
            if info.main:  # every process stops; one says why
                log.warning("sweep: %s", stopped)
            break
    best = None if stopped else choose(config, scores, losses)  # a stopped sweep compared no rates
    lr = config.optim.lr if best is None else best
    overrun = max(0.0, now() - began - trial_minutes * len(scores) * 60)  # past their shares: the final run's
    final_minutes += trial_minutes * (len(config.optim.lr_sweep) - len(scores))  # the trials a stop left unrun
    record: dict[str, Any] = {"val_top1": scores, "val_loss": losses, "best_lr": best, "final_lr": lr}
    record.update(trial_minutes=trial_minutes, final_minutes=final_minutes, **({"stopped": stopped} if stopped else {}))
    if info.main:
        atomic_write_text(Path(config.run.out) / SWEEP_RECORD, json.dumps(record, indent=2) + "\n")
    trials_s = now() - began - overrun  # the trials' own time, which the final run's clock does not hold
    result = train(final_config(config, lr, final_minutes), spent_s=spent_s + overrun, **train_kwargs)
    if "wall_minutes" in result:  # the command's whole time, as its final line says it
        result = {**result, "wall_minutes": result["wall_minutes"] + trials_s / 60}
    return {**result, "sweep": scores, "best_lr": best, "final_lr": lr, "sweep_minutes": trials_s / 60}


def same_precision(config: TrainConfig, result: dict[str, Any]) -> TrainConfig:
    """`config` with run.precision "auto" replaced by what the first trial chose: every trial and the final run
    train at one precision, so the rates are compared with nothing else changed (a choice made by timing can
    go either way near its threshold)."""
    chosen = result.get("plan", {}).get("precision")
    if config.run.precision != "auto" or chosen not in ("bf16", "fp32"):
        return config
    if distributed.current().main:  # the later plans say "as requested": this is who asked
        log.info("sweep: the other trials and the final run train in %s, as precision auto chose for the first", chosen)
    return dataclasses.replace(config, run=dataclasses.replace(config.run, precision=chosen))


def choose(config: TrainConfig, scores: dict[str, float], losses: dict[str, float]) -> float:
    """The swept rate the final run trains at (`best_lr`), said, with a warning at the edge of the grid."""
    best = best_lr(config.optim.lr_sweep, scores, losses)
    log.info("sweep: best lr %g (val top-1 %.2f%%); training on all of train", best, 100 * scores[f"{best:g}"])
    grid = sorted(config.optim.lr_sweep)
    if len(grid) > 2 and best in (grid[0], grid[-1]) and distributed.current().main:  # one process says it
        log.warning(
            "sweep: the best lr %g is at the edge of the grid; a wider optim.lr_sweep may find a better one", best
        )
    return best


def starved(result: dict[str, Any], trial_minutes: float, config: TrainConfig) -> str:
    """Why the sweep stops after this trial ("" to go on): its start-up took STARVED_SHARE of its budget."""
    startup = result.get("startup_seconds", 0.0)
    budget = trial_minutes * 60
    if budget <= 0 or startup < STARVED_SHARE * budget:
        return ""
    least = len(config.optim.lr_sweep) * startup / (STARVED_SHARE * SWEEP_SHARE)  # seconds of M, no fewer
    return (
        f"a trial spent {startup:g} s of its {budget:g}-s budget starting up, too few steps left to tell the "
        f"rates apart: the sweep stops, and the final run trains at lr {config.optim.lr:g}; --max-minutes "
        f"{math.ceil(2 * least / 60)} or more, with a new --out, lets the sweep run"
    )
