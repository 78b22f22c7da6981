"""The training loop: `train_step` and `evaluate` are small; `train(config)` composes them.

One code path for CPU and CUDA and for 1 or N processes (torchrun; see distributed.py).  A run
lives in a directory (DESIGN.md "A run"): config.json, metrics.jsonl, checkpoints/, plots/.

Where the weights come from, decided once, in this order (STYLE.md section 5):
  (1) a checkpoint in the run directory -> resume it (weights, optimiser, step, RNG; the data
      position is a function of the step, see vitkit.data.loader, and a shard stream's is saved too);
  (2) else `run.init_from` -> load that checkpoint, replace the head (Sec. 3.2: zero-initialised
      D x K, pre-logits dropped) and resample the position embeddings to the new resolution;
  (3) else -> a freshly initialised model.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch import Tensor, nn

from vitkit.checkpoints import native
from vitkit.data import loader as batches
from vitkit.data.sources import ImageSet, load_split
from vitkit.data.stream import ShardBatches, ShardSet
from vitkit.data.transforms import train_transform
from vitkit.models import build_model
from vitkit.models.configs import in_channels, image_size, num_classes
from vitkit.train import compiled, distributed
from vitkit.train.config import TrainConfig, from_dict, to_dict
from vitkit.train.ema import ModelEMA
from vitkit.train.optim import build_optimizer
from vitkit.train.plots import MetricsLog, plot_curves
from vitkit.train.schedule import BudgetClock, lr_multiplier, phase_at, resolve_warmup, scaled_lr
from vitkit.train.step import StepSpec, evaluate, loss_fn, train_step  # noqa: F401 (loss_fn re-exported)
from vitkit.train.state import (TrainState, gather_sharded, latest_checkpoint, load_checkpoint, load_sharded,
                                save_checkpoint)

log = logging.getLogger(__name__)


class NonFiniteLossError(ValueError):
    """The loss (or gradient norm) was NaN/Inf for `run.nan_patience` consecutive steps."""


# ---------------------------------------------------------------------------------- the run
@dataclass
class _Data:
    train: ImageSet
    evals: dict[str, ImageSet]  # split name -> set, evaluated during training ("val" or "test")
    test: ImageSet  # the final evaluation split


def _load_data(config: TrainConfig) -> _Data:
    size = image_size(config.model)
    common = dict(image_size=size, seed=config.run.seed, strict=config.data.strict,
                  max_in_memory_bytes=config.data.max_in_memory_mb << 20, image_column=config.data.image_column,
                  label_column=config.data.label_column)
    train = load_split(config.data.uri, "train", val_fraction=config.data.val_fraction, **common)
    test = load_split(config.data.uri, config.eval.final_split, val_fraction=config.data.val_fraction, **common)
    evals = {}
    if config.data.val_fraction > 0:
        evals["val"] = test if config.eval.final_split == "val" else load_split(
            config.data.uri, "val", val_fraction=config.data.val_fraction, **common)
    else:
        evals[config.eval.final_split] = test
    if train.num_classes != num_classes(config.model):
        raise ValueError(f"{config.data.uri} has {train.num_classes} classes but the model head has "
                         f"{num_classes(config.model)} (set model.num_classes={train.num_classes})")
    return _Data(train=train, evals=evals, test=test)


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


def _autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """bf16 autocast for "bf16", and for "auto" where the device multiplies bf16 natively.

    On such a CPU (AVX512-BF16 / AMX) bf16 autocast with the explicit-softmax attention that
    ViTConfig.attn_impl "auto" selects trains 1.7-1.9x faster than fp32 at equal accuracy
    (benchmarks/compare.py, benchmarks/precision_accuracy.py); without native bf16 it would be slower.
    """
    if precision == "bf16" or (precision == "auto" and _native_bf16(device)):
        return torch.bfloat16
    return None


def _native_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _initial_model(config: TrainConfig) -> nn.Module:
    """Resume order steps (2) and (3): `init_from` with surgery, else a fresh model."""
    model = build_model(config.model)
    if not config.run.init_from:
        return model
    from vitkit.checkpoints import read
    from vitkit.checkpoints.surgery import change_resolution, replace_head

    source = read(config.run.init_from).model
    if num_classes(source.config) != num_classes(config.model) or not _same_head(source, model):
        source = replace_head(source, num_classes(config.model))  # Sec. 3.2: zero-init D x K head
    source = change_resolution(source, image_size(config.model))  # Sec. 3.2: 2D-interpolated E_pos
    native.load_state_dict_strict(model, source.state_dict(), source=config.run.init_from)
    log.info("initialised from %s (head %d classes, %d px)", config.run.init_from, num_classes(config.model),
             image_size(config.model))
    return model


def _same_head(source: nn.Module, target: nn.Module) -> bool:
    ours, theirs = target.state_dict(), source.state_dict()
    keys = [k for k in ours if k.startswith(("head.", "pre_logits."))]
    return all(k in theirs and theirs[k].shape == ours[k].shape for k in keys) and \
        not [k for k in theirs if k.startswith("pre_logits.") and k not in ours]


class _StopFlag:
    """Set by SIGTERM/SIGINT; the loop checks it at step boundaries (handlers only in the main thread)."""

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopFlag:
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = signum

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def count_params(model_config: Any) -> int:
    """Parameters of a model config; big models are built on the meta device (no memory, no init cost)."""
    vit = getattr(model_config, "vit", model_config)
    rough = 12 * getattr(vit, "depth", 50) * getattr(vit, "hidden_size", 1024) ** 2
    if rough < 50_000_000:  # building small models for real is faster than the meta device's first use
        with torch.random.fork_rng(devices=[]):  # counting must not move the RNG that initialises the run
            return sum(p.numel() for p in build_model(model_config).parameters())
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(model_config).parameters())


def summary(config: TrainConfig, num_train: int, world: int = 1) -> dict[str, Any]:
    """What the run will do: model, parameters, effective batch, accumulation, LR rule, steps."""
    params = count_params(config.model)
    micro = micro_batch_size(config, world)
    steps = total_steps(config, num_train)
    base = config.optim.base_batch_size or config.data.batch_size
    lr = scaled_lr(config.optim.lr, config.data.batch_size, base, config.optim.lr_scaling)
    return {"recipe": config.recipe, "data": config.data.uri, "num_train": num_train, "params": params,
            "img_size": image_size(config.model), "global_batch": config.data.batch_size, "processes": world,
            "micro_batch": micro, "accumulation": config.data.batch_size // world // micro, "steps": steps,
            "epochs": steps * config.data.batch_size / num_train, "lr": lr, "base_lr": config.optim.lr,
            "base_batch": base, "lr_scaling": config.optim.lr_scaling, "optimizer": config.optim.name,
            **({"resolution_phases": [[side, until] for side, until in
                                      zip(config.data.resolutions, config.data.resolution_until)]}
               if config.data.resolutions else {})}


def train(config: TrainConfig, *, progress_stream: Any = None) -> dict[str, Any]:
    """Run (or resume) the training described by `config` in `config.run.out`; returns the final metrics.

    Returns a dict with "status" ("finished", "time_budget" or "interrupted"), "run_dir", "step",
    "test" (final evaluation; absent when interrupted) and "minutes".
    """
    if not config.run.out:
        raise ValueError("run.out (the run directory) must be set")
    started = time.monotonic()
    info = distributed.from_env()
    device = distributed.pick_device(config.run.device, info)
    if config.run.parallel == "fsdp" and device.type != "cuda":
        raise ValueError("run.parallel='fsdp' (FSDP2) needs CUDA; use 'ddp' on CPU")
    distributed.setup(info, device)
    threads = torch.get_num_threads()
    if config.run.threads > 0:
        torch.set_num_threads(config.run.threads)
    try:
        return _train(config, info, device, started, progress_stream)
    finally:
        torch.set_num_threads(threads)
        distributed.teardown()


def _reconcile(config: TrainConfig, run_dir: Path) -> TrainConfig:
    """Resuming: the run directory's config.json wins over a different request (time budget and display aside)."""
    stored_path = run_dir / "config.json"
    if not stored_path.is_file() or latest_checkpoint(run_dir) is None:
        return config
    stored = from_dict(json.loads(stored_path.read_text()))
    volatile = dict(max_minutes=config.run.max_minutes, progress=config.run.progress, out=config.run.out)
    stored = dataclasses.replace(stored, run=dataclasses.replace(stored.run, **volatile))
    old, new = to_dict(stored), to_dict(config)
    changed = [f"{group}.{key}" for group in old if isinstance(old[group], dict)
               for key in old[group] if old[group][key] != new.get(group, {}).get(key)]
    if changed:
        log.warning("%s already holds a run with a different config (%s); resuming it with its own config",
                    run_dir, ", ".join(changed[:8]))
    return stored


def _train(config: TrainConfig, info: distributed.DistInfo, device: torch.device, started: float,
           progress_stream: Any) -> dict[str, Any]:
    run_dir = Path(config.run.out)
    if info.main:
        run_dir.mkdir(parents=True, exist_ok=True)
    distributed.barrier()
    config = _reconcile(config, run_dir)
    torch.manual_seed(config.run.seed * 1000 + info.rank)  # init (same on all ranks: DDP broadcasts rank 0's) and dropout
    data = _load_data(config)
    steps = total_steps(config, len(data.train))
    plan = summary(config, len(data.train), info.world)
    warmup = resolve_warmup(steps, config.optim.warmup_steps, config.optim.warmup_fraction)
    micro = plan["micro_batch"]
    channels, size = in_channels(config.model), image_size(config.model)

    module = _initial_model(config).to(device)
    stride = getattr(getattr(module, "patch_embed", None), "stride", 1)  # pixels per token (1: any side works)
    if any(side % stride for side in config.data.resolutions):
        raise ValueError(f"data.resolutions {config.data.resolutions}: every side must be a multiple of the "
                         f"model's {stride}-pixel patches")
    model = distributed.wrap(module, info, device, config.run.parallel)
    eager = model
    if config.run.compile:
        model = compiled.compile_for_training(model, device)
    deferred = config.run.nan_check == "deferred" or (
        config.run.nan_check == "auto" and device.type == "cuda" and config.run.parallel != "fsdp")
    # Fused kernels on the CPU too: one pass over the parameters (AdamW's step 2.2 -> 0.7 ms at small-28px).
    optimizer = build_optimizer(model if config.run.parallel == "fsdp" else module, config.optim, plan["lr"],
                                fused=deferred or device.type == "cpu")
    generator = torch.Generator(device=device).manual_seed(config.run.seed * 7919 + info.rank)
    ema = ModelEMA(module, config.optim.ema_decay) if config.optim.ema_decay > 0 else None
    feed = ShardBatches(data.train, seed=config.run.seed, global_batch=config.data.batch_size, rank=info.rank,
                        world=info.world, micro_batch=micro, device=device, workers=config.data.workers,
                        strict=config.data.strict) if isinstance(data.train, ShardSet) else None
    state = TrainState(model=model, module=module, optimizer=optimizer, generator=generator, ema=ema, data=feed)

    resumed = latest_checkpoint(run_dir)
    if resumed is not None:  # (1) resume
        if config.run.parallel == "fsdp" and info.world > 1:
            load_sharded(resumed, state)
        else:
            load_checkpoint(resumed, state, device)
        if info.rank:  # only rank 0's RNG was saved; others continue from a (seed, rank, step) stream
            torch.manual_seed(config.run.seed * 1000 + info.rank + 7 * state.step)
        log.info("resuming %s at step %d", resumed, state.step)
    metrics = MetricsLog(run_dir, enabled=info.main, tensorboard=config.run.tensorboard)
    if info.main:
        metrics.truncate_after(state.step)
        native.atomic_write_text(run_dir / "config.json", json.dumps(to_dict(config), indent=2) + "\n")
    meta = {"class_names": data.train.class_names, "mean": config.data.mean, "std": config.data.std,
            "provenance": {"recipe": config.recipe, "data": config.data.uri, "run_dir": str(run_dir)}}
    autocast_dtype = _autocast_dtype(config.run.precision, device)
    eval_kwargs = dict(size=size, mean=config.data.mean, std=config.data.std, channels=channels,
                       batch_size=config.eval.batch_size, device=device, loss=config.optim.loss,
                       autocast_dtype=autocast_dtype, rank=info.rank, world=info.world, workers=config.data.workers)
    steps_per_epoch = len(data.train) / config.data.batch_size
    eval_every = max(1, round(config.eval.every_epochs * steps_per_epoch)) if config.eval.every_epochs > 0 else 0

    def epoch_of(step: int) -> float:
        return round(step / steps_per_epoch, 4)

    def run_eval(split: str, ref: ImageSet, write: bool = True) -> dict[str, Any]:
        if state.ema is not None:  # evaluate the Polyak average (Sec. 4.1)
            backup = {k: v.clone() for k, v in state.module.state_dict().items()}
            state.ema.copy_to(state.module)
        result = evaluate(state.module if info.world == 1 or config.run.parallel != "fsdp" else state.model,
                          ref, **eval_kwargs)
        if state.ema is not None:
            state.module.load_state_dict(backup)
        record = {"step": state.step, "epoch": epoch_of(state.step), "split": split, "loss": result["loss"],
                  "top1": result["top1"], "top5": result["top5"], "count": result["count"]}
        if write:
            metrics.write(record)
        if info.main:
            log.info("step %d %s: loss %.4f top-1 %.2f%% top-5 %.2f%%", state.step, split, result["loss"],
                     100 * result["top1"], 100 * result["top5"])
        return record

    sharded = config.run.parallel == "fsdp" and info.world > 1

    def checkpoint() -> Path | None:
        path = None
        full = gather_sharded(state) if sharded else None  # a collective: all processes
        if info.main:
            path = save_checkpoint(run_dir, state, meta, full)
        distributed.barrier()
        return path

    if model is not eager:  # every graph the run still needs, before the clock starts
        needed = compiled.phases(getattr(module, "patch_dropout", 0.0), config.data.patch_dropout_until,
                                 config.data.resolutions, config.data.resolution_until, size, start=state.step / steps)
        inputs = _blank_batches(config, data.train, micro, channels, device)
        log.info("torch.compile: compiling %d graph(s) before the first step (tens of seconds each on a CPU)",
                 len(needed))
        try:
            seconds = compiled.warm_up(model, module, needed, inputs, autocast_dtype, device)
            log.info("torch.compile: %d graph(s) (PatchDropout rate, side) %s compiled in %.0f s", len(needed), needed,
                     seconds)
        except Exception as err:  # a broken compiler toolchain: train eagerly rather than not at all
            log.warning("torch.compile failed (%s: %s); training eagerly (run.compile=false skips compiling)",
                        type(err).__name__, (str(err).strip().splitlines() or [""])[0])
            model = state.model = eager
    if feed is None:
        stream = batches.IndexStream(len(data.train), config.run.seed)
        feed = step_batches(config, data.train, stream, state.step, steps, info, micro, device)
    batch_iter = iter(feed)
    skipped_before = state.skipped_samples

    def count_skipped() -> int:
        """Corrupt samples skipped over all processes and invocations (a collective: every process calls it)."""
        here = torch.tensor([float(getattr(feed, "skipped", 0))], dtype=torch.float64, device=device)
        state.skipped_samples = skipped_before + int(distributed.all_reduce_sum(here).item())
        return state.skipped_samples
    num_classes_ = data.train.num_classes
    bar = _progress(config, info, steps, state.step, progress_stream)
    status, invocation_start = "finished", time.monotonic()
    pending: list[dict[str, Any]] = []
    last_log_time, last_log_step = time.monotonic(), state.step
    stop = _StopFlag()
    unchecked: list[tuple[int, Any]] = []  # (step, skipped flag) not yet looked at

    def check_skips(bar: Any) -> None:
        """Account and report skipped steps; stop after run.nan_patience in a row (one sync per call)."""
        flags = [bool(f) for _, f in unchecked]
        for (step, _), skipped in zip(unchecked, flags):
            if deferred:  # train_step left the counters to us
                state.nan_streak = state.nan_streak + 1 if skipped else 0
                state.skipped_steps += int(skipped)
            if not skipped:
                continue
            log.warning("step %d: non-finite loss or gradient; update skipped (%d in a row)", step, state.nan_streak)
            metrics.write({"step": step, "epoch": epoch_of(step), "split": "train", "skipped": True,
                           "nan_streak": state.nan_streak})
            if state.nan_streak >= config.run.nan_patience:
                bar.close()
                last = latest_checkpoint(run_dir)
                raise NonFiniteLossError(
                    f"loss/gradient was NaN or Inf for {state.nan_streak} consecutive steps, the last at step "
                    f"{step}; stopped without saving. Last good checkpoint: {last or 'none (no checkpoint yet)'}. "
                    "Lower optim.lr, raise optim.warmup_steps or use run.precision=fp32")
        unchecked.clear()

    # The schedule's clock: unfitted, an infinite budget leaves position = step and done = (step >= steps);
    # fitted, the budget is what max_minutes leaves after this invocation's start-up.
    fitted = config.run.budget_schedule == "fit"
    budget_s = max(config.run.max_minutes * 60 - (time.monotonic() - started), 1.0) if fitted else math.inf
    clock = BudgetClock(steps, budget_s)
    clock.observe(state.step, state.elapsed)
    train_size, patch_dropout = 0, getattr(module, "patch_dropout", 0.0)
    with stop:
        while not clock.done(state.step):
            raw = next(batch_iter)
            position = clock.position(state.step)
            fraction = position / steps  # how far the schedule is: the phases follow it
            phase_rate, phase_size = phase_at(fraction, patch_dropout, config.data.patch_dropout_until,
                                              config.data.resolutions, config.data.resolution_until, size)
            if phase_size != train_size and config.data.resolutions and info.main:
                log.info("step %d: training at %dx%d", state.step, phase_size, phase_size)
            train_size = phase_size
            if patch_dropout:  # PatchDropout early, all patches for the last part of the schedule
                module.patch_dropout = phase_rate
            batch = [train_transform(images, labels, num_classes_, train_size, config.data.mean, config.data.std,
                                     channels, config.augment, state.generator) for images, labels in raw]
            mult = lr_multiplier(position, steps, warmup, config.optim.schedule, config.optim.end_lr_fraction)
            spec = StepSpec(lr=plan["lr"] * mult, clip_norm=config.optim.clip_norm, loss=config.optim.loss,
                            autocast_dtype=autocast_dtype, deferred=deferred)
            out = train_step(state, batch, spec)
            pending.append(out)
            unchecked.append((state.step, out["skipped"]))
            at_log = state.step % config.run.log_every == 0 or state.step == steps
            if not deferred or at_log or state.step % config.run.checkpoint_every == 0:
                check_skips(bar)
            bar.update(1)
            if at_log:
                now = time.monotonic()
                record = _train_record(pending, state.step, epoch_of(state.step),
                                       (state.step - last_log_step) * config.data.batch_size / max(now - last_log_time, 1e-9))
                pending, last_log_time, last_log_step = [], now, state.step
                if data.train.access != "memory":  # files or a stream: corrupt samples are skipped and totalled
                    seen = state.skipped_samples
                    if count_skipped() > seen and info.main:
                        log.warning("step %d: %d corrupt samples skipped so far", state.step, state.skipped_samples)
                    record = record and {**record, "skipped_samples": state.skipped_samples}
                if record:
                    metrics.write({**record, "img_size": train_size})
                    bar.set_postfix(loss=f"{record['loss']:.3f}", img_s=f"{record['images_per_s']:.0f}")
            if eval_every and state.step % eval_every == 0 and state.step < steps:
                eval_start = time.monotonic()
                for split, ref in data.evals.items():
                    run_eval(split, ref)
                if fitted:  # keep as long back for the final evaluation
                    clock.reserve_s = distributed.max_across(time.monotonic() - eval_start, device)
            if fitted and (info.world == 1 or at_log or state.step % config.run.checkpoint_every == 0):
                elapsed = state.elapsed + time.monotonic() - invocation_start
                clock.observe(state.step, distributed.max_across(elapsed, device))  # all processes: one position
            out_of_time = config.run.max_minutes > 0 and (time.monotonic() - started) / 60 >= config.run.max_minutes
            out_of_time = out_of_time and not (fitted and clock.done(state.step))  # the fitted schedule ends it annealed
            signalled = stop.signum != 0
            if info.world > 1:  # all processes must stop at the same step: agree at log/checkpoint steps only
                agree = at_log or state.step % config.run.checkpoint_every == 0
                signalled = agree and distributed.any_true(signalled, device)
                out_of_time = agree and distributed.any_true(out_of_time, device)
            periodic = state.step % config.run.checkpoint_every == 0 and state.nan_streak == 0  # keep the last good one
            if (signalled or out_of_time) and unchecked:
                check_skips(bar)  # deferred flags: account for them before saving
            if periodic or signalled or out_of_time:
                state.elapsed += time.monotonic() - invocation_start
                invocation_start = time.monotonic()
                count_skipped()
                checkpoint()
            if signalled:
                status = "interrupted"
                break
            if out_of_time:
                status = "time_budget"
                log.info("time budget of %.1f min spent at step %d/%d: stopping", config.run.max_minutes, state.step, steps)
                break
    bar.close()
    if fitted and state.step < steps and status == "finished":
        log.info("time budget (budget_schedule=fit): schedule annealed at step %d of at most %d", state.step, steps)
    state.elapsed += time.monotonic() - invocation_start
    result: dict[str, Any] = {"status": status, "run_dir": str(run_dir), "rank": info.rank, "step": state.step, "steps": steps,
                              "skipped_steps": state.skipped_steps, "skipped_samples": count_skipped(), "plan": plan}
    if status == "interrupted":
        log.warning("stopped by signal %d at step %d; checkpoint saved, re-run the same command to resume",
                    stop.signum, state.step)
        result["signal"] = stop.signum
        metrics.close()
        return result
    final = run_eval(config.eval.final_split, data.test, write=False)
    checkpoint()
    if info.main and not sharded:  # checkpoints/final: the evaluated model (Polyak average when enabled)
        backup = {k: v.clone() for k, v in state.module.state_dict().items()}
        if state.ema is not None:
            state.ema.copy_to(state.module)
        native.save(state.module, run_dir / "checkpoints" / "final", **meta)
        if state.ema is not None:  # the name vitkit.eval's find_checkpoint prefers over LATEST
            native.save(state.module, run_dir / "checkpoints" / "ema", **meta)
        state.module.load_state_dict(backup)
    if info.main:
        metrics.write({**final, "final": True})
        metrics.close()
        try:
            plot_curves(run_dir / "metrics.jsonl", run_dir / "plots" / "curves.png")
        except Exception as err:  # a plot must never fail a finished run
            log.warning("could not draw plots/curves.png: %s", err)
    result.update({config.eval.final_split: {k: final[k] for k in ("loss", "top1", "top5", "count")},
                   "epoch": final["epoch"], "minutes": state.elapsed / 60,
                   "wall_minutes": (time.monotonic() - started) / 60})
    return result


def _train_record(pending: list[dict[str, Any]], step: int, epoch: float, images_per_s: float) -> dict[str, Any] | None:
    good = [p for p in pending if not p["skipped"]]
    if not good:
        return None
    losses = torch.stack([p["loss"] for p in good]).float()
    norms = torch.stack([p["grad_norm"].float().to(losses.device) for p in good])
    return {"step": step, "epoch": epoch, "split": "train", "loss": float(losses.mean()),
            "grad_norm": float(norms.mean()), "lr": good[-1]["lr"], "images_per_s": images_per_s}


def _blank_batches(config: TrainConfig, train: ImageSet, micro: int, channels: int, device: torch.device
                   ) -> Callable[[int], Tensor]:
    """side -> a training batch of blank images, laid out (shape and strides) as the transform lays out real ones."""
    side = train.load_size or image_size(config.model)
    raw = tuple(train.images.shape[1:]) if train.images is not None else (train.channels, side, side)
    blank = torch.zeros(micro, *raw, dtype=torch.uint8, device=device), torch.zeros(micro, dtype=torch.long)
    return lambda size: train_transform(*blank, train.num_classes, size, config.data.mean, config.data.std, channels,
                                        config.augment, torch.Generator(device=device).manual_seed(0))[0]


def step_batches(config: TrainConfig, train: ImageSet, stream: batches.IndexStream, start: int, steps: int,
                 info: distributed.DistInfo, micro: int, device: torch.device) -> Iterable[list[tuple[Tensor, Tensor]]]:
    """uint8 micro-batches (images, labels) for each step from `start`, on `device` (FileBatches counts `skipped`)."""
    if train.images is None:
        return batches.FileBatches(train, stream, start_step=start, total_steps=steps,
                                   global_batch=config.data.batch_size, rank=info.rank, world=info.world,
                                   micro_batch=micro, device=device, workers=config.data.workers,
                                   strict=config.data.strict)
    data = batches.DeviceImages(train, device)
    return ([data.batch(index) for index in
             batches.micro_batches(stream, step, config.data.batch_size, info.rank, info.world, micro)]
            for step in range(start, steps))


class _NoBar:
    postfix = ""

    def update(self, n: int) -> None:
        pass

    def set_postfix(self, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(config: TrainConfig, info: distributed.DistInfo, steps: int, start: int, stream: Any) -> Any:
    """tqdm bar (steps, images/s, ETA) on `stream` when enabled, rank 0, and `stream` is a terminal."""
    if stream is None or not config.run.progress or not info.main or not getattr(stream, "isatty", lambda: False)():
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=steps, initial=start, file=stream, unit="step", dynamic_ncols=True, smoothing=0.05)



