"""The Trainer: one loop for every objective, made of small parts (STYLE.md section 5, DESIGN.md "train/").

    plan (train/plan.py)            the numbers of the run, computed once and printed before the first step
    schedule (train/schedule.py)    learning rate, PatchDropout, side and EMA decay at a position
    budget clock (train/schedule.py) wall-clock time -> position, so a budgeted run ends annealed
    objective (train/objectives.py) the loss of a micro-batch and what an evaluation measures
    guard (train/guard.py)          non-finite steps skipped and counted; too many in a row stop the run
    checkpointer (train/checkpointer.py) + run directory (vitkit/runs.py)   saving, resuming, exports
    stop policy (train/stop.py)     signals and the time budget, agreed by every process
    rehearsal (train/rehearsal.py, estimate.py)  compiled graphs and the measured speed before the clock starts,
                                    checked on the first real steps
    run-length rule (train/short_run.py) regularisation fitted to the epochs that fit

One code path for CPU and CUDA and for 1 or N processes (torchrun; train/distributed.py).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Callable

import torch

from vitkit.data.stream import ShardBatches, ShardSet
from vitkit.device import autocast_dtype, pick_device
from vitkit.eval.evaluator import one_view_note
from vitkit.models.configs import in_channels
from vitkit.runs import RunDir
from vitkit.train import compiled, distributed, short_run
from vitkit.train.assemble import IndexBatches, Splits, check_classes, initial_model, load_splits
from vitkit.train.checkpointer import Checkpointer
from vitkit.train.config import TrainConfig, from_dict, to_dict
from vitkit.train.ema import ModelEMA, averaged
from vitkit.train.estimate import SpeedCheck
from vitkit.train.guard import NonFiniteGuard, NonFiniteLossError  # noqa: F401 (re-exported)
from vitkit.train.objectives import EvalContext, build_objective
from vitkit.train.optim import build_optimizer
from vitkit.train.plan import Plan, augment_seed, init_seed, make_plan, resumed_seed, schedule_of
from vitkit.train.plots import plot_curves
from vitkit.train.rehearsal import Rehearsal
from vitkit.train.progress import TrainRecords, progress_bar
from vitkit.train.schedule import BudgetClock, Phase
from vitkit.train.state import TrainState
from vitkit.train.step import StepSpec, train_step
from vitkit.train.stop import StopPolicy

log = logging.getLogger(__name__)


def reconcile(config: TrainConfig) -> TrainConfig:
    """The config a run in `config.run.out` continues with: the stored one when the directory holds a run
    (vitkit.runs' one resume policy), with a warning naming what the request changed."""
    run = RunDir(config.run.out)
    merged, changed = run.reconcile(to_dict(config))
    if changed:
        log.warning("%s already holds a run with a different config (%s); resuming it with its own config",
                    run.path, ", ".join(changed[:8]))
    return from_dict(merged) if changed or run.latest() is not None else config


def train(config: TrainConfig, *, data: Splits | None = None, progress_stream: Any = None,
          on_plan: Callable[[Plan], None] | None = None) -> dict[str, Any]:
    """Run (or resume) the training described by `config` in `config.run.out`; returns the final metrics.

    `data` replaces loading `config.data.uri` (tests, studies).  `on_plan(plan)` is called on rank 0 once
    the plan and its measured speed are known, before the first step.  Returns a dict with "status"
    ("finished", "time_budget" or "interrupted"), "run_dir", "step", "steps", "plan", the final
    evaluation under the split's name (absent when interrupted), "minutes" and "checkpoint".
    """
    if not config.run.out:
        raise ValueError("run.out (the run directory) must be set")
    started = time.monotonic()
    info = distributed.current()
    device = pick_device(config.run.device, info.local_rank)
    if config.run.parallel == "fsdp" and device.type != "cuda":
        raise ValueError("run.parallel='fsdp' (FSDP2) needs CUDA; use 'ddp' on CPU")
    joined = distributed.setup(info, device)
    threads = torch.get_num_threads()
    if config.run.threads > 0:
        torch.set_num_threads(config.run.threads)
    try:
        trainer = Trainer(config, info, device, started, data=data, progress_stream=progress_stream)
        result = trainer.fit(on_plan)
        # Leave together: a rank that tears its process group down while another still works in its own
        # can abort at exit (gloo: "terminate called without an active exception"; seen once in CI).
        distributed.barrier()
        return result
    finally:
        torch.set_num_threads(threads)
        if joined:
            distributed.teardown()


class Trainer(Rehearsal):
    """A run assembled from its parts; `fit` trains it (see the module docstring)."""

    def __init__(self, config: TrainConfig, info: distributed.DistInfo, device: torch.device, started: float, *,
                 data: Splits | None = None, progress_stream: Any = None):
        self.info, self.device, self.started, self.progress_stream = info, device, started, progress_stream
        self.run = RunDir(config.run.out)
        if info.main:
            self.run.create()
        distributed.barrier()
        self.config = config = reconcile(config)
        torch.manual_seed(init_seed(config.run.seed, info.rank))  # init (DDP broadcasts rank 0's) and dropout
        wants_test = config.mpp is None or config.mpp.eval_images > 0
        self.data = data or load_splits(config, need_test=wants_test)
        if not wants_test:
            self.data = dataclasses.replace(self.data, test=None, evals={})
        check_classes(config, self.data.train)
        self.plan = make_plan(config, len(self.data.train), info.world, info.local_rank)
        self.schedule = schedule_of(config, self.plan)
        self.objective = build_objective(config, self.data.train.num_classes, in_channels(config.model))
        self._build_model()
        batches = ShardBatches if isinstance(self.data.train, ShardSet) else IndexBatches  # both TrainBatches
        self.batches = batches(self.data.train, seed=config.run.seed, global_batch=config.data.batch_size,
                               micro_batch=self.plan.micro_batch, rank=info.rank, world=info.world, device=device,
                               total_steps=self.plan.steps, workers=config.data.workers, strict=config.data.strict)
        self.plan = dataclasses.replace(self.plan, data_path=self.batches.path, splits=self._split_sizes())
        self.skipped_before = self.skipped_total = 0  # batches' corrupt samples of earlier invocations / in all
        self.short: short_run.Decision | None = None  # train/short_run.py's decision, once taken (or resumed)
        self.speed_check: SpeedCheck | None = None  # the rehearsal's speed checked on real steps (train/estimate.py)
        self.checkpointer = Checkpointer(self.run, every=config.run.checkpoint_every, meta=self._meta(), main=info.main,
                                         sharded=self.sharded, extra=self._extra_state)
        self._resume()
        self.metrics = self.run.metrics(enabled=info.main, tensorboard=config.run.tensorboard)
        if info.main:
            self.metrics.truncate_after(self.state.step)
            self.run.write_config(to_dict(config))
        self.guard = NonFiniteGuard(self.state, config.run.nan_patience, report=self._report_skip,
                                    last_good=self.run.latest)

    # ------------------------------------------------------------------------------- assembly
    def _build_model(self) -> None:
        config, info, device = self.config, self.info, self.device
        module = initial_model(config).to(device)
        stride = getattr(getattr(module, "patch_embed", None), "stride", 1)  # pixels per token (1: any side works)
        if any(side % stride for side in config.data.resolutions):
            raise ValueError(f"data.resolutions {config.data.resolutions}: every side must be a multiple of the "
                             f"model's {stride}-pixel patches")
        network = self.objective.network(module)  # what the optimiser trains (MPP: a wrapper around the encoder)
        self.sharded = config.run.parallel == "fsdp" and info.world > 1
        model = distributed.wrap(network, info, device, config.run.parallel)
        self.eager = model
        if config.run.compile:
            model = compiled.compile_for_training(model, device)
        self.deferred = config.run.nan_check == "deferred" or (  # Muon has no fused kernel to skip a step
            config.run.nan_check == "auto" and device.type == "cuda" and config.run.parallel != "fsdp"
            and config.optim.name != "muon")
        # Fused kernels on the CPU too: one pass over the parameters (AdamW's step 2.2 -> 0.7 ms at small-28px).
        optimizer = build_optimizer(model if config.run.parallel == "fsdp" else network, config.optim, self.plan.lr,
                                    fused=self.deferred or device.type == "cpu")
        generator = torch.Generator(device=device).manual_seed(augment_seed(config.run.seed, info.rank))
        ema = ModelEMA(module, config.optim.ema_decay) if config.optim.ema_decay > 0 else None
        self.state = TrainState(model=model, module=module, optimizer=optimizer, generator=generator, ema=ema)
        self.autocast_dtype = autocast_dtype(config.run.precision, device)
        self.pass_rate = any(r > 0 for r in self.schedule.rates[0])  # the model takes the scheduled PatchDropout rate

    def _meta(self) -> dict[str, Any]:
        provenance = {"recipe": self.config.recipe, "data": self.config.data.uri, "run_dir": str(self.run.path),
                      **self.objective.provenance()}
        names = self.data.train.class_names if self.config.mpp is None else None
        return {"class_names": names, "mean": self.config.data.mean, "std": self.config.data.std,
                "provenance": provenance}

    def _extra_state(self) -> dict[str, Any]:
        return {"data": self.batches.state_dict(), "skipped_samples": self.skipped_total, "short_run": self.short,
                **self.objective.state_dict()}

    def _resume(self) -> None:
        def load_extra(payload: dict[str, Any]) -> None:
            self.objective.load_state_dict(payload)
            self.batches.load_state_dict(payload.get("data") or {"step": self.state.step})
            self.skipped_before = int(payload.get("skipped_samples", 0))  # streamed by the earlier invocations
            self.short = payload.get("short_run")  # the first invocation's decision (train/short_run.py)

        resumed = self.checkpointer.restore(self.state, load_extra=load_extra)
        if resumed is None:
            return
        if self.info.rank:  # only rank 0's RNG states were saved: the others continue from a (seed, rank, step) stream
            seed = resumed_seed(self.config.run.seed, self.info.rank, self.state.step)
            torch.manual_seed(seed)
            self.state.generator.manual_seed(seed)
        log.info("resuming %s at step %d", resumed, self.state.step)

    def _split_sizes(self) -> dict[str, Any]:
        """Images per part and where each came from (the plan prints them)."""
        parts = {"train": self.data.train, **self.data.evals}
        if self.data.test is not None:
            parts[self.config.eval.final_split] = self.data.test
        return {name: {"images": len(part), "from": part.origin} for name, part in parts.items()}

    # ---------------------------------------------------------------------------------- rehearsal
    def step_spec(self, phase: Phase) -> StepSpec:
        """What one optimiser step of `phase` does: its learning rate, PatchDropout rate, precision and EMA."""
        return StepSpec(lr=phase.lr, clip_norm=self.config.optim.clip_norm, loss=self.config.optim.loss,
                        autocast_dtype=self.autocast_dtype, deferred=self.deferred,
                        patch_dropout=phase.patch_dropout if self.pass_rate else None, ema_decay=phase.ema_decay or None)

    def _budget_s(self) -> float:
        """Seconds for the training loop of a fitted run: the whole run's budget minus every start-up (the
        earlier invocations' and this one's so far).  A collective: the smallest over the processes, since each
        measured its own start-up and all must read the same schedule position and stop at the same step."""
        startup = self.state.startup + time.monotonic() - self.started
        return distributed.min_across(max(self.config.run.max_minutes * 60 - startup, 1.0), self.device)

    # ------------------------------------------------------------------------------------ the loop
    def fit(self, on_plan: Callable[[Plan], None] | None = None) -> dict[str, Any]:
        """Train until the schedule ends, the budget is spent or a signal arrives; evaluate and save."""
        config, state = self.config, self.state
        self.configured = config  # as asked for; the regularisation decision fits a copy of it
        self.plan = self.rehearsed_plan()
        self._fit_regularisation(self.short)
        if on_plan is not None and self.info.main:
            on_plan(self.plan)
        self.clock = BudgetClock(self.plan.steps, self._budget_s() if self.plan.fitted else math.inf)
        state.startup += time.monotonic() - self.started
        self.clock.observe(state.step, state.elapsed)
        deadline = config.run.max_minutes * 60 if config.run.max_minutes > 0 and not self.plan.fitted else None
        stop = StopPolicy(started=self.started, deadline_s=deadline, world=self.info.world, device=self.device,
                          now=time.monotonic)
        records = TrainRecords(state.step, config.data.batch_size)
        bar = progress_bar(config.run.progress and self.info.main, self.plan.steps, state.step, self.progress_stream)
        self.loop_start, self.saved_step, status = time.monotonic(), -1, "finished"
        batches = iter(self.batches)
        with stop:
            while not self.clock.done(state.step) and (raw := next(batches, None)) is not None:
                position = self.clock.position(state.step)
                phase = self.schedule.at(position)
                spec = self.step_spec(phase)
                out = train_step(state, self.objective.batch(raw, phase, state.generator), spec,
                                 self.objective.loss_of(spec, state.generator))
                self.guard.observe(state.step, out["skipped"])
                records.add(out)
                bar.update(1)
                at_log = state.step % config.run.log_every == 0 or state.step == self.plan.steps
                agree = at_log or self.checkpointer.due(state.step)
                if not self.deferred or agree:
                    self.guard.flush()
                if at_log:
                    self._log(records, phase, bar)
                self._evaluate_if_due()
                self._observe_clock(agree)
                self._check_speed(phase, time.monotonic)
                reason = stop.check(agree)
                if reason and self.guard.pending:
                    self.guard.flush()  # deferred flags: account for them before saving
                if reason or (self.checkpointer.due(state.step) and state.nan_streak == 0):  # keep the last good one
                    self._save()
                if reason or position >= self.plan.steps - 1:  # the last step ran at the schedule's end value
                    status = reason or status
                    break
        bar.close()
        return self._finish(status, stop.signum)

    def _count_skipped(self) -> int:
        """Corrupt samples skipped: the training split's (the same on every process) plus what every process's
        batches dropped in this and earlier invocations.  A collective: every process calls it."""
        streamed = self.batches.skipped
        if self.info.world > 1:  # each process counts its own batches; the record holds the total
            streamed = distributed.sum_across(streamed, self.device)
        self.skipped_total = self.skipped_before + streamed
        return self.data.train.skipped + self.skipped_total

    def _log(self, records: TrainRecords, phase: Phase, bar: Any) -> None:
        skipped = self._count_skipped()
        record = records.record(self.state.step, self._epoch(self.state.step), img_size=phase.side,
                                **({"skipped_samples": skipped} if skipped else {}))
        if record:
            self.metrics.write(record)
            bar.set_postfix(loss=f"{record['loss']:.3f}", img_s=f"{record['images_per_s']:.0f}")

    def _evaluate_if_due(self) -> None:
        every, step = self.plan.eval_every, self.state.step
        if not every or step % every or step >= self.plan.steps:
            return
        began = time.monotonic()
        for split, data in self.data.evals.items():
            self.metrics.write(self._evaluate(split, data))
        if self.plan.fitted:  # keep as long back for the final evaluation
            self.clock.reserve_s = distributed.max_across(time.monotonic() - began, self.device)

    def _observe_clock(self, agree: bool) -> None:
        if self.plan.fitted and (self.info.world == 1 or agree):  # all processes: one position
            elapsed = self.state.elapsed + time.monotonic() - self.loop_start
            self.clock.observe(self.state.step, distributed.max_across(elapsed, self.device))

    def _save(self) -> None:
        self._count_skipped()  # the total goes into the checkpoint (every process calls _save)
        now = time.monotonic()
        self.state.elapsed += now - self.loop_start
        self.loop_start = now
        self.checkpointer.save(self.state)
        self.saved_step = self.state.step

    def _epoch(self, step: int) -> float:
        return round(step * self.config.data.batch_size / self.plan.num_train, 4)

    def _report_skip(self, record: dict[str, Any]) -> None:
        self.metrics.write({**record, "epoch": self._epoch(record["step"])})

    # ------------------------------------------------------------------------------ evaluation
    def _evaluate(self, split: str, data: Any) -> dict[str, Any]:
        """The objective's evaluation of `split` (of the Polyak average when enabled, Sec. 4.1)."""
        config, state = self.config, self.state
        context = EvalContext(size=self.plan.img_size, mean=config.data.mean, std=config.data.std,
                              channels=in_channels(config.model), batch_size=config.eval.batch_size, device=self.device,
                              autocast_dtype=self.autocast_dtype, rank=self.info.rank, world=self.info.world,
                              workers=config.data.workers)
        model = state.model if self.sharded else state.module
        with averaged(state.ema, state.module):
            result = self.objective.evaluate(model, data, context)
        record = {"step": state.step, "epoch": self._epoch(state.step), "split": split, **result}
        if self.info.main and result.get("top1") is not None:
            log.info("step %d %s: loss %.4f top-1 %.2f%% top-5 %.2f%%%s", state.step, split, result["loss"],
                     100 * result["top1"], 100 * result["top5"], one_view_note(result))
        return record

    def _finish(self, status: str, signum: int) -> dict[str, Any]:
        state, config = self.state, self.config
        state.elapsed += time.monotonic() - self.loop_start
        if status == "finished" and state.step < self.plan.steps:
            log.info("time budget: schedule annealed at step %d of at most %d", state.step, self.plan.steps)
        if status == "time_budget":
            log.info("time budget of %.1f min spent at step %d/%d: stopping", config.run.max_minutes, state.step,
                     self.plan.steps)
        result: dict[str, Any] = {"status": status, "run_dir": str(self.run.path), "rank": self.info.rank,
                                  "step": state.step, "steps": self.plan.steps, "skipped_steps": state.skipped_steps,
                                  "plan": self.plan.to_dict()}
        if status == "interrupted":
            log.warning("stopped by signal %d at step %d; checkpoint saved, re-run the same command to resume",
                        signum, state.step)
            self.metrics.close()
            return {**result, "signal": signum, "checkpoint": str(self.run.latest())}
        final = self._evaluate(config.eval.final_split, self.data.test) if self.data.test is not None else None
        if self.saved_step != state.step:
            self.checkpointer.save(state)
        self.checkpointer.export(state)
        if self.info.main:
            if final is not None:
                self.metrics.write({**final, "final": True})
            self.metrics.close()
            try:
                plot_curves(self.run.path / "metrics.jsonl", self.run.path / "plots" / "curves.png")
            except Exception as err:  # a plot must never fail a finished run
                log.warning("could not draw plots/curves.png: %s", err)
        if final is not None:
            result[config.eval.final_split] = {k: v for k, v in final.items() if k not in ("step", "epoch", "split")}
            result["epoch"] = final["epoch"]
        return {**result, "minutes": state.elapsed / 60, "wall_minutes": (time.monotonic() - self.started) / 60,
                "checkpoint": str(self.run.export("final") if not self.sharded else self.run.latest())}

