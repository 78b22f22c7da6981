"""The Trainer: one loop for every objective, made of small parts (STYLE.md section 5, DESIGN.md "train/").

    host choices (train/choices.py)  precision and torch.compile for this host and model, with their reasons
    warm-up + budget (train/budget.py) every phase compiled and timed before the clock starts; the one model
                                    of time: the schedule position from the steps and the time budget
    plan (train/plan.py)            the numbers of the run, computed once, printed before the first step
    schedule (train/schedule.py)    learning rate, PatchDropout and EMA decay at a position
    objective (train/objectives.py) the loss of a micro-batch and what an evaluation measures
    guard (train/guard.py)          non-finite steps skipped and counted; too many in a row stop the run
    checkpointer (train/checkpointer.py) + run directory (vitkit/runs.py)   saving, resuming, exports
    stop policy (train/stop.py)     signals and the time budget, agreed by every process

One code path for CPU and CUDA and for 1 or N processes (torchrun; train/distributed.py).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from vitkit.data.stream import ShardBatches, ShardSet
from vitkit.device import pick_device
from vitkit.eval.evaluator import one_view_note
from vitkit.models.configs import image_size, in_channels
from vitkit.runs import RunDir
from vitkit.train import choices, compiled, distributed, finish
from vitkit.train.assemble import IndexBatches, Splits, blank_batch, check_classes, initial_model, load_splits
from vitkit.train.budget import Budget
from vitkit.train.checkpointer import Checkpointer
from vitkit.train.config import TrainConfig, from_dict, to_dict
from vitkit.train.ema import ModelEMA, averaged
from vitkit.train.finish import EvaluationError  # noqa: F401 (re-exported: the CLI catches it)
from vitkit.train.guard import NonFiniteGuard, NonFiniteLossError  # noqa: F401 (re-exported)
from vitkit.train.objectives import EvalContext, build_objective
from vitkit.train.optim import build_optimizer
from vitkit.train.plan import (
    HostChoices,
    Plan,
    augment_seed,
    init_seed,
    make_plan,
    micro_batch_size,
    patch_dropout_of,
    resumed_seed,
    schedule_of,
    total_steps,
)
from vitkit.train.progress import TrainRecords, progress_bar
from vitkit.train.schedule import Phase, scaled_lr
from vitkit.train.state import TrainState
from vitkit.train.step import StepSpec, train_step
from vitkit.train.stop import StopPolicy

log = logging.getLogger(__name__)

UNBOUNDED = 2**62  # the batch streams' bound for a run whose time budget alone decides its length


def reconcile(config: TrainConfig) -> TrainConfig:
    """The config a run in `config.run.out` continues with: the stored one when the directory holds a run
    (vitkit.runs' one resume policy), with a warning naming what the request changed."""
    run = RunDir(config.run.out)
    merged, changed = run.reconcile(to_dict(config))
    if changed:
        log.warning(
            "%s already holds a run with a different config (%s); resuming it with its own config",
            run.path,
            ", ".join(changed[:8]),
        )
    return from_dict(merged) if changed or run.latest() is not None else config


def train(
    config: TrainConfig,
    *,
    data: Splits | None = None,
    progress_stream: Any = None,
    on_plan: Callable[[Plan], None] | None = None,
) -> dict[str, Any]:
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


class Trainer:
    """A run assembled from its parts; `fit` trains it (see the module docstring)."""

    def __init__(
        self,
        config: TrainConfig,
        info: distributed.DistInfo,
        device: torch.device,
        started: float,
        *,
        data: Splits | None = None,
        progress_stream: Any = None,
    ):
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
        self.num_train, self.micro = len(self.data.train), micro_batch_size(config, info.world)
        self.length = total_steps(config, self.num_train)  # None: the time budget alone decides
        self.objective = build_objective(config, self.data.train.num_classes, in_channels(config.model))
        self.skipped_before = self.skipped_total = 0  # batches' corrupt samples of earlier invocations / in all
        self.stored_precision: str | None = None  # the precision an earlier invocation chose (kept on resume)
        self._build_model()
        batches = ShardBatches if isinstance(self.data.train, ShardSet) else IndexBatches  # both TrainBatches
        self.batches = batches(
            self.data.train,
            seed=config.run.seed,
            global_batch=config.data.batch_size,
            micro_batch=self.micro,
            rank=info.rank,
            world=info.world,
            device=device,
            total_steps=self.length or UNBOUNDED,
            workers=config.data.workers,
            strict=config.data.strict,
        )
        self.checkpointer = Checkpointer(
            self.run,
            every=config.run.checkpoint_every,
            meta=self._meta(),
            main=info.main,
            sharded=self.sharded,
            extra=self._extra_state,
        )
        self._resume()
        self.choices = self._choose()
        self.metrics = self.run.metrics(enabled=info.main, tensorboard=config.run.tensorboard)
        if info.main:
            self.metrics.truncate_after(self.state.step)
            self.run.write_config(to_dict(config))
        self.guard = NonFiniteGuard(
            self.state, config.run.nan_patience, report=self._report_skip, last_good=self.run.latest
        )

    # ------------------------------------------------------------------------------- assembly
    def _build_model(self) -> None:
        config, info, device = self.config, self.info, self.device
        module = initial_model(config).to(device)
        network = self.objective.network(module)  # what the optimiser trains (MPP: a wrapper around the encoder)
        self.sharded = config.run.parallel == "fsdp" and info.world > 1
        model = distributed.wrap(network, info, device, config.run.parallel)
        self.eager = model
        self.deferred = config.run.nan_check == "deferred" or (  # Muon has no fused kernel to skip a step
            config.run.nan_check == "auto"
            and device.type == "cuda"
            and config.run.parallel != "fsdp"
            and config.optim.name != "muon"
        )
        # Fused kernels on the CPU too: one pass over the parameters (AdamW's step 2.2 -> 0.7 ms at small-28px).
        optimizer = build_optimizer(
            model if config.run.parallel == "fsdp" else network,
            config.optim,
            self._peak_lr(),
            fused=self.deferred or device.type == "cpu",
        )
        generator = torch.Generator(device=device).manual_seed(augment_seed(config.run.seed, info.rank))
        ema = ModelEMA(module, config.optim.ema_decay) if config.optim.ema_decay > 0 else None
        self.state = TrainState(model=model, module=module, optimizer=optimizer, generator=generator, ema=ema)

    def _peak_lr(self) -> float:
        """The peak learning rate after the batch-size scaling rule (the plan's `lr`)."""
        optim, batch = self.config.optim, self.config.data.batch_size
        return scaled_lr(optim.lr, batch, optim.base_batch_size or batch, optim.lr_scaling)

    def _choose(self) -> HostChoices:
        """Precision and compilation for this host and model (train/choices.py); compiles when chosen."""
        config = self.config
        phases = schedule_of(config, self.length or 1, 1.0).phases(start=self.state.step / (self.length or math.inf))
        budget = config.run.max_minutes * 60 if config.run.max_minutes > 0 else None
        picked = choices.choose(
            config,
            self.state.module,
            self.device,
            micro_batch=self.micro,
            accumulation=config.data.batch_size // self.info.world // self.micro,
            graphs=len(phases),
            steps=None if self.length is None else self.length - self.state.step,
            budget_s=budget,
            stored_precision=self.stored_precision,
        )
        self.autocast_dtype = torch.bfloat16 if picked.precision == "bf16" else None
        if picked.compiled:
            self.state.model = compiled.compile_for_training(self.eager, self.device)
        return picked

    def _meta(self) -> dict[str, Any]:
        provenance = {
            "recipe": self.config.recipe,
            "data": self.config.data.uri,
            "run_dir": str(self.run.path),
            **self.objective.provenance(),
        }
        names = self.data.train.class_names if self.config.mpp is None else None
        return {
            "class_names": names,
            "mean": self.config.data.mean,
            "std": self.config.data.std,
            "provenance": provenance,
        }

    def _extra_state(self) -> dict[str, Any]:
        return {
            "data": self.batches.state_dict(),
            "skipped_samples": self.skipped_total,
            "precision": self.choices.precision,
            **self.objective.state_dict(),
        }

    def _resume(self) -> None:
        def load_extra(payload: dict[str, Any]) -> None:
            self.objective.load_state_dict(payload)
            self.batches.load_state_dict(payload.get("data") or {"step": self.state.step})
            self.skipped_before = int(payload.get("skipped_samples", 0))  # streamed by the earlier invocations
            self.stored_precision = payload.get("precision")

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

    # ------------------------------------------------------------------------- warm-up and plan
    def step_spec(self, phase: Phase) -> StepSpec:
        """What one optimiser step of `phase` does: its learning rate, PatchDropout rate, precision and EMA."""
        return StepSpec(
            lr=phase.lr,
            clip_norm=self.config.optim.clip_norm,
            loss=self.config.optim.loss,
            autocast_dtype=self.autocast_dtype,
            deferred=self.deferred,
            patch_dropout=phase.patch_dropout if self._has_rate else None,
            ema_decay=phase.ema_decay or None,
        )

    @property
    def _has_rate(self) -> bool:
        """Whether the model takes the scheduled PatchDropout rate (it has PatchDropout)."""
        return patch_dropout_of(self.config)[0] > 0

    def _run_once(self, rate: float, side: int) -> None:
        """One forward + backward of a blank micro-batch laid out as the training ones (the warm-up's unit)."""
        generator = torch.Generator(device=self.device).manual_seed(0)
        phase = Phase(lr=0.0, patch_dropout=rate, side=side, ema_decay=0.0)
        inputs = self.objective.batch(blank_batch(self.data.train, self.micro, side, self.device), phase, generator)[0]
        with torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None):
            loss, _ = self.objective.loss_of(self.step_spec(phase), generator)(self.state.model, inputs)
        loss.float().backward()

    def _warm_up(self) -> dict:
        """Compile (when chosen) and time every phase still ahead, before the clock starts; a compiler that
        fails leaves the run eager."""
        needed = schedule_of(self.config, self.length or 1, 1.0).phases(
            start=self.state.step / (self.length or math.inf)
        )
        timings, failed = compiled.warm_up_compiled(
            self.state.module,
            needed,
            self._run_once,
            self.device,
            compiling=self.state.model is not self.eager,
            to_eager=lambda: setattr(self.state, "model", self.eager),
        )
        if failed:
            self.choices = dataclasses.replace(self.choices, compiled=False, compile_reason=failed)
        # One plan on every process: the slowest process's passes set the estimate.
        return {key: distributed.max_across(seconds, self.device) for key, seconds in sorted(timings.items())}

    def _usable_s(self) -> float:
        """Seconds for the training loop of a fitted run: the whole run's budget minus every start-up (the
        earlier invocations' and this one's so far).  A collective: the smallest over the processes, since each
        measured its own start-up and all must read the same schedule position and stop at the same step."""
        startup = self.state.startup + time.monotonic() - self.started
        return distributed.min_across(max(self.config.run.max_minutes * 60 - startup, 1.0), self.device)

    def _make_plan(self, timings: dict) -> Plan:
        """The plan, once: numbers, host choices and the warm-up's estimate."""
        config = self.config
        fitted = config.run.max_minutes > 0 and config.run.budget_schedule == "fit"
        evals = sum(len(s) for s in self.data.evals.values()) if config.eval.every_epochs > 0 else 0
        eval_images = evals + (len(self.data.test) if self.data.test is not None else 0)
        plan = make_plan(
            config,
            self.num_train,
            self.info.world,
            device=self.device,
            choices=self.choices,
            timings=timings,
            budget_s=self._usable_s() if fitted else None,
            eval_images=eval_images,
        )
        if not plan.steps_given:  # every process must read the same schedule length
            plan = dataclasses.replace(plan, steps=int(distributed.min_across(plan.steps, self.device)))
        return dataclasses.replace(plan, data_path=self.batches.path, splits=self._split_sizes())

    # ------------------------------------------------------------------------------------ the loop
    def fit(self, on_plan: Callable[[Plan], None] | None = None) -> dict[str, Any]:
        """Train until the schedule ends, the budget is spent or a signal arrives; evaluate and save."""
        config, state = self.config, self.state
        self.plan = plan = self._make_plan(self._warm_up())
        self.schedule = schedule_of(config, plan.steps, plan.lr)
        if on_plan is not None and self.info.main:
            on_plan(plan)
        self.budget = Budget(plan.steps, self._usable_s() if plan.fitted else None, steps_count=plan.steps_given)
        if plan.eval_every == 0:  # keep back what the final evaluation is estimated to take
            self.budget.reserve_s = plan.measured.get("eval_seconds", 0.0)
        state.startup += time.monotonic() - self.started
        self.budget.observe(state.step, state.elapsed)
        deadline = config.run.max_minutes * 60 if config.run.max_minutes > 0 and not plan.fitted else None
        stop = StopPolicy(
            started=self.started, deadline_s=deadline, world=self.info.world, device=self.device, now=time.monotonic
        )
        records = TrainRecords(state.step, config.data.batch_size)
        bar = progress_bar(config.run.progress and self.info.main, plan.steps, state.step, self.progress_stream)
        self.loop_start, self.saved_step, status = time.monotonic(), -1, "finished"
        batches = iter(self.batches)
        with stop:
            while not self.budget.done(state.step) and (raw := next(batches, None)) is not None:
                position = self.budget.position(state.step)
                phase = self.schedule.at(position)
                spec = self.step_spec(phase)
                out = train_step(
                    state,
                    self.objective.batch(raw, phase, state.generator),
                    spec,
                    self.objective.loss_of(spec, state.generator),
                )
                self.guard.observe(state.step, out["skipped"])
                records.add(out)
                bar.update(1)
                at_log = state.step % config.run.log_every == 0 or state.step == plan.steps
                agree = at_log or self.checkpointer.due(state.step)
                if not self.deferred or agree:
                    self.guard.flush()
                if at_log:
                    self._log(records, phase, bar)
                self._evaluate_if_due()
                self._observe_budget(agree)
                reason = stop.check(agree)
                if reason and self.guard.pending:
                    self.guard.flush()  # deferred flags: account for them before saving
                if reason or (self.checkpointer.due(state.step) and state.nan_streak == 0):  # keep the last good one
                    self._save()
                if reason or position >= plan.steps - 1:  # the last step ran at the schedule's end value
                    status = reason or status
                    break
        bar.close()
        finish.log_end(status, stop.signum, state.step, plan.steps, config.run.max_minutes)
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
        record = records.record(
            self.state.step,
            self._epoch(self.state.step),
            img_size=phase.side,
            **({"skipped_samples": skipped} if skipped else {}),
        )
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
            self.budget.reserve_s = distributed.max_across(time.monotonic() - began, self.device)

    def _observe_budget(self, agree: bool) -> None:
        if self.plan.fitted and (self.info.world == 1 or agree):  # all processes: one position
            elapsed = self.state.elapsed + time.monotonic() - self.loop_start
            self.budget.observe(self.state.step, distributed.max_across(elapsed, self.device))

    def _save(self) -> None:
        self._count_skipped()  # the total goes into the checkpoint (every process calls _save)
        now = time.monotonic()
        self.state.elapsed += now - self.loop_start
        self.loop_start = now
        self.checkpointer.save(self.state)
        self.saved_step = self.state.step

    def _epoch(self, step: int) -> float:
        return round(step * self.config.data.batch_size / self.num_train, 4)

    def _report_skip(self, record: dict[str, Any]) -> None:
        self.metrics.write({**record, "epoch": self._epoch(record["step"])})

    # ------------------------------------------------------------------------------ evaluation
    def _evaluate(self, split: str, data: Any) -> dict[str, Any]:
        """The objective's evaluation of `split` (of the Polyak average when enabled, Sec. 4.1)."""
        config, state = self.config, self.state
        context = EvalContext(
            size=image_size(config.model),
            mean=config.data.mean,
            std=config.data.std,
            channels=in_channels(config.model),
            batch_size=config.eval.batch_size,
            device=self.device,
            autocast_dtype=self.autocast_dtype,
            rank=self.info.rank,
            world=self.info.world,
            workers=config.data.workers,
        )
        model = state.model if self.sharded else state.module
        with averaged(state.ema, state.module):
            result = self.objective.evaluate(model, data, context)
        record = {"step": state.step, "epoch": self._epoch(state.step), "split": split, **result}
        if self.info.main and result.get("top1") is not None:
            log.info(
                "step %d %s: loss %.4f top-1 %.2f%% top-5 %.2f%%%s",
                state.step,
                split,
                result["loss"],
                100 * result["top1"],
                100 * result["top5"],
                one_view_note(result),
            )
        return record

    def _finish(self, status: str, signum: int) -> dict[str, Any]:
        """Save, export the final model, then evaluate it: a failing evaluation loses nothing."""
        state, config = self.state, self.config
        state.elapsed += time.monotonic() - self.loop_start
        result: dict[str, Any] = {
            "status": status,
            "run_dir": str(self.run.path),
            "rank": self.info.rank,
            "step": state.step,
            "steps": self.plan.steps,
            "skipped_steps": state.skipped_steps,
            "plan": self.plan.to_dict(),
        }
        if status == "interrupted":
            self.metrics.close()
            return {**result, "signal": signum, "checkpoint": str(self.run.latest())}
        if self.saved_step != state.step:
            self.checkpointer.save(state)
        self.checkpointer.export(state)
        checkpoint = str(self.run.export("final") if not self.sharded else self.run.latest())
        final = None
        if self.data.test is not None:
            with finish.evaluation_failure(self.run.path, config, checkpoint, self.metrics):
                final = self._evaluate(config.eval.final_split, self.data.test)
        if self.info.main:
            finish.close_metrics(self.metrics, final, self.run.path)
        if final is not None:
            result[config.eval.final_split] = {k: v for k, v in final.items() if k not in ("step", "epoch", "split")}
            result["epoch"] = final["epoch"]
        return {
            **result,
            "minutes": state.elapsed / 60,
            "wall_minutes": (time.monotonic() - self.started) / 60,
            "checkpoint": checkpoint,
        }
