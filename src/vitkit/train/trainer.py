"""The Trainer: one loop for every objective, made of small parts (STYLE.md section 5, DESIGN.md "train/").

    parts (train/parts.py)          what the loop runs, assembled from the config before the first step
    host choices (train/choices.py)  precision and torch.compile for this host and model, with their reasons
    warm-up + budget (train/budget.py) every phase compiled and timed before the clock starts; the one model
                                    of time: the schedule position from the steps and the time budget
    plan (train/plan.py)            the numbers of the run, computed once, printed before the first step
    schedule (train/schedule.py)    learning rate, PatchDropout and EMA decay at a position
    objective (train/objectives.py) the loss of a micro-batch and what an evaluation measures
    guard (train/guard.py)          non-finite steps skipped and counted; too many in a row stop the run
    checkpointer (train/checkpointer.py) + run directory (vitkit/runs.py)   saving, resuming, exports
    stop policy (train/stop.py)     signals, the time budget and checkpoints by the clock, agreed by every process

One code path for CPU and CUDA and for 1 or N processes (torchrun; train/distributed.py).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch

from vitkit import host as hosts
from vitkit.atomic import removed_if_left_empty
from vitkit.data.imageset import ImageSet
from vitkit.device import autocast, pick_device, synchronize
from vitkit.eval.evaluator import EvaluationInterrupted, one_view_note
from vitkit.models.configs import image_size
from vitkit.runs import FINAL, RunDir
from vitkit.train import compiled, distributed, finish
from vitkit.train.assemble import Splits, blank_batch
from vitkit.train.budget import Budget
from vitkit.train.config import TrainConfig
from vitkit.train.ema import averaged
from vitkit.train.finish import EvaluationError  # noqa: F401 (re-exported: the CLI catches it)
from vitkit.train.guard import NonFiniteLossError  # noqa: F401 (re-exported)
from vitkit.train.objectives import EvalContext
from vitkit.train.parts import RunParts, reconcile  # noqa: F401 (reconcile re-exported: the CLI calls it)
from vitkit.train.plan import Plan, make_plan, patch_dropout_of, schedule_of
from vitkit.train.progress import TrainRecords, progress_bar
from vitkit.train.schedule import Phase
from vitkit.train.step import StepSpec, train_step
from vitkit.train.stop import StopPolicy

log = logging.getLogger(__name__)


def train(
    config: TrainConfig,
    *,
    data: Splits | None = None,
    progress_stream: Any = None,
    on_plan: Callable[[Plan], None] | None = None,
    spent_s: float = 0.0,
) -> dict[str, Any]:
    """Run (or resume) the training described by `config` in `config.run.out`; returns the final metrics.

    `data` replaces loading `config.data.uri` (tests, studies).  `on_plan(plan)` is called on rank 0 once
    the plan and its measured speed are known, before the first step.  `spent_s`: seconds the caller spent
    before (the command's imports and data description), charged to a time budget's start-up.  Returns a
    dict with "status" ("finished", "time_budget" or "interrupted"), "run_dir", "step", "steps", "plan",
    the final evaluation under the split's name (absent when interrupted), "minutes" and "checkpoint".
    """
    if not config.run.out:
        raise ValueError("run.out (the run directory) must be set")
    started = time.monotonic() - spent_s
    info = distributed.current()
    device = pick_device(config.run.device, info.local_rank)
    if config.run.parallel == "fsdp" and device.type != "cuda":
        raise ValueError("run.parallel='fsdp' (FSDP2) needs CUDA; use 'ddp' on CPU")
    threads = torch.get_num_threads()
    hosts.set_threads(config.run.threads)
    try:
        with distributed.held(info, device):
            with removed_if_left_empty(config.run.out) if info.main else nullcontext():  # rank 0 creates it
                with distributed.entered_on_main(RunDir(config.run.out).locked, info, "lock the run directory"):
                    trainer = Trainer(config, info, device, started, data=data, progress_stream=progress_stream)
                    result = trainer.fit(on_plan)
            # Leave together, so no rank tears the group down while another still works in it.  (What the
            # process must do after that to exit cleanly: distributed.leave.)
            distributed.barrier()
            return result
    finally:
        torch.set_num_threads(threads)


class Trainer(RunParts):
    """A run assembled from its parts (train/parts.py); `fit` trains it (see the module docstring)."""

    # ------------------------------------------------------------------------- warm-up and plan
    def step_spec(self, phase: Phase) -> StepSpec:
        """What one optimiser step of `phase` does: its learning rate, PatchDropout rate, precision and EMA."""
        return StepSpec(
            lr=phase.lr,
            clip_norm=self.config.optim.clip_norm,
            loss=self.config.optim.loss,
            autocast_dtype=self.autocast_dtype,
            deferred=self.deferred,
            patch_dropout=phase.patch_dropout if patch_dropout_of(self.config)[0] > 0 else None,  # it has PatchDropout
            ema_decay=phase.ema_decay or None,
        )

    def _run_once(self, rate: float, side: int) -> None:
        """One forward + backward of a blank micro-batch laid out as the training ones (the warm-up's unit)."""
        generator = torch.Generator(device=self.device).manual_seed(0)
        phase = Phase(lr=0.0, patch_dropout=rate, side=side, ema_decay=0.0)
        inputs = self.objective.batch(blank_batch(self.data.train, self.micro, side, self.device), phase, generator)[0]
        with autocast(self.device, self.autocast_dtype):
            loss, _ = self.objective.loss_of(self.step_spec(phase), generator)(self.state.model, inputs)
        loss.float().backward()

    def _eval_image_seconds(self, count: int) -> float:
        """Seconds per image of the final evaluation, timed through the evaluation itself (transform, forward at
        the evaluation's batch size, metrics) on up to one batch of blank images, after an untimed one of the same
        size (a CPU's first pass at a batch shape, allocation and kernel set-up, takes about twice as long).
        Timed, not derived from a training pass: evaluation runs eagerly, without PatchDropout, and at a larger
        batch, which on a CPU is slower per image."""
        n = max(1, min(count, self.config.eval.batch_size))
        blank = blank_batch(self.data.train, n, image_size(self.config.model), torch.device("cpu"))[0][0]
        images = ImageSet(blank, torch.zeros(n, dtype=torch.long), self.data.train.class_names)
        model, context = self._eval_model, self._eval_context()
        was_training = model.training
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            self.objective.evaluate(model, images, context)
            synchronize(self.device)
            began = time.perf_counter()
            evaluated = self.objective.evaluate(model, images, context).get("count") or n  # MPP: its eval_images
            synchronize(self.device)
        model.train(was_training)
        return distributed.max_across((time.perf_counter() - began) / evaluated, self.device)

    def _warm_up(self) -> dict:
        """Compile (when chosen) and time every phase still ahead, before the clock starts; a compiler that
        fails leaves the run eager."""
        needed = schedule_of(self.config, self.length or 1, 1.0).phases(
            start=self.state.step / (self.length or math.inf)
        )
        compiling = self.state.model is not self.eager
        timings, failed = compiled.warm_up_compiled(
            self.state.module,
            needed,
            self._run_once,
            self.device,
            compiling=compiling,
            to_eager=lambda: setattr(self.state, "model", self.eager),
            timed=2 if compiling or self.config.run.max_minutes > 0 else 1,  # 1: it only feeds the estimate line
        )
        if failed:
            self.choices = dataclasses.replace(self.choices, compiled=False, compile_reason=failed)
        # One plan on every process: the slowest process's passes set the estimate.
        return {key: distributed.max_across(seconds, self.device) for key, seconds in sorted(timings.items())}

    def _usable_s(self) -> float:
        """Seconds for the training loop of a fitted run: the whole run's budget minus its first invocation's
        start-up.  A resumed invocation's start-up is not charged (train/budget.py).  A collective: the smallest
        over the processes, since each measured its own start-up and all must read the same schedule position
        and stop at the same step."""
        return distributed.min_across(max(self.config.run.max_minutes * 60 - self._startup_s(), 1.0), self.device)

    def _training_left_s(self) -> float | None:
        """The usable seconds of a time budget less what earlier invocations trained (None without a budget): the
        run the compile decision weighs."""
        if self.config.run.max_minutes <= 0:
            return None
        return max(self._usable_s() - self.state.elapsed, 0.0)

    def _startup_s(self) -> float:
        """The start-up charged to a fitted budget: this invocation's so far, or a resumed run's first one's."""
        return self.state.startup if self.resumed else time.monotonic() - self.started

    def _make_plan(self, timings: dict) -> Plan:
        """The plan, once: numbers, host choices and the warm-up's estimate.  A run that held out nothing to
        evaluate as it goes (assemble.evaluates_as_it_goes) plans its evaluation at the end only."""
        config = self.config
        if config.eval.every_epochs > 0 and not self.data.evals:
            config = dataclasses.replace(config, eval=dataclasses.replace(config.eval, every_epochs=0.0))
        fitted = config.run.fitted
        reserve = fitted  # the budget keeps the final evaluation's time back: time it
        evals = sum(len(s) for s in self.data.evals.values()) if config.eval.every_epochs > 0 else 0
        eval_images = evals + (len(self.data.test) if self.data.test is not None else 0)
        if config.mpp is not None:  # masked patch prediction evaluates its first mpp.eval_images only
            eval_images = min(eval_images, config.mpp.eval_images)
        plan = make_plan(
            config,
            self.num_train,
            self.info.world,
            device=self.device,
            choices=self.choices,
            timings=timings,
            budget_s=self._usable_s() if fitted else None,
            eval_images=eval_images,
            eval_image_s=self._eval_image_seconds(eval_images) if reserve and eval_images else None,
            start_step=self.state.step,
        )
        if not plan.steps_given:  # every process must read the same schedule length
            plan = dataclasses.replace(plan, steps=int(distributed.min_across(plan.steps, self.device)))
        if fitted and plan.measured:  # the plan warns of a budget its start-up spent
            plan = dataclasses.replace(plan, measured={**plan.measured, "startup_seconds": round(self._startup_s(), 1)})
        return dataclasses.replace(plan, data_path=self.batches.path, splits=self._split_sizes())

    # ------------------------------------------------------------------------------------ the loop
    def fit(self, on_plan: Callable[[Plan], None] | None = None) -> dict[str, Any]:
        """Train until the schedule ends, the budget is spent or a signal arrives; evaluate and save."""
        config, state = self.config, self.state
        self.plan = plan = self._make_plan(self._warm_up())
        self.schedule = schedule_of(config, plan.steps, plan.lr)
        status = self._begin(plan, on_plan)
        stop = self._stop_policy(plan)
        records = TrainRecords(state.step, config.data.batch_size, state.records)
        bar = progress_bar(config.run.progress and self.info.main, plan.steps, state.step, self.progress_stream)
        self.loop_start, self.saved_step = time.monotonic(), -1
        batches = iter(self.batches)
        with stop:
            cut = state.eval_pending and self._evaluate_if_due(stop)  # the one a signal cut, before the next step
            status = "interrupted" if cut else status
            while not (cut or state.ended or self.budget.done(state.step)) and (raw := next(batches, None)) is not None:
                position = self.budget.position(state.step)
                state.ended = position >= plan.steps - 1
                phase = self.schedule.at(position)
                spec = self.step_spec(phase)
                batch = self.objective.batch(raw, phase, state.generator)
                out = train_step(state, batch, spec, self.objective.loss_of(spec, state.generator))
                self.guard.observe(state.step, out["skipped"])
                records.add(out)
                bar.update(1)
                at_log = state.step % config.run.log_every == 0 or state.ended  # a fitted run: its estimate moves
                agree = at_log or self.checkpointer.due(state.step)
                if not self.deferred or agree:
                    self.guard.flush()
                if at_log:
                    self._log(records, phase, bar)
                cut_short = self._evaluate_if_due(stop)  # by a signal, on every process: agree on it now
                self._observe_budget(agree)
                reason, by_clock = stop.check(agree or cut_short, saved_at=self.loop_start)  # _save resets the clock
                if reason and self.guard.pending:
                    self.guard.flush()  # deferred flags: account for them before saving
                if reason and not at_log:  # the steps since the last record are in one, not lost with the process
                    self._log(records, phase, bar)
                due = self.checkpointer.due(state.step) or by_clock
                if reason or (due and state.nan_streak == 0):  # keep the last good one
                    self._save()
                if reason or state.ended:  # the last step ran at the schedule's end value
                    status = reason or status
                    break
        bar.close()
        if self.info.main and not self.ended_before:  # every process stops at the same step: one says so
            finish.log_end(status, stop.signum, state.step, plan.steps, config.run.max_minutes, plan.steps_given)
        stop.watch.activity = "final save or evaluation batch"  # a peer stopped now would hold this one too
        with stop.watch:
            return self._finish(status, stop.signum, stop.watch.beat)

    def _begin(self, plan: Plan, on_plan: Callable[[Plan], None] | None) -> str:
        """The plan said (a finished run's: that nothing is left) and the budget set; the status a run ends with
        that takes no step ("time_budget": earlier invocations spent a fitted budget)."""
        state = self.state
        self.ended_before = self.resumed and state.ended  # its plan's estimates and warnings would read as news
        if self.ended_before and self.info.main:
            finish.log_nothing_left(self.run.path, state.step)
        elif on_plan is not None and self.info.main:
            on_plan(plan)
        self.budget = Budget(plan.steps, self._usable_s() if plan.fitted else None, steps_count=plan.steps_given)
        if plan.fitted:  # keep back what the final evaluation is timed to take (a periodic one re-times it)
            self.budget.reserve_s = plan.measured.get("final_eval_seconds", 0.0)
        if not self.resumed:
            state.startup = time.monotonic() - self.started
        self.budget.observe(state.step, state.elapsed)
        spent = self.budget.done(state.step) or (plan.steps_given and plan.steps <= state.step)  # by earlier runs
        if self.resumed and plan.fitted and not state.ended and spent:
            finish.log_spent(self.config.run.max_minutes, state.elapsed, state.step)
            return "time_budget"
        return "finished"

    def _stop_policy(self, plan: Plan) -> StopPolicy:
        """Signals, a cut budget's deadline and checkpoints every run.checkpoint_minutes, on the engine's clock."""
        run = self.config.run
        return StopPolicy(
            started=self.started,
            deadline_s=run.max_minutes * 60 if run.max_minutes > 0 and not plan.fitted else None,
            checkpoint_s=run.checkpoint_minutes * 60 or None,
            world=self.info.world,
            rank=self.info.rank,
            device=self.device,
            now=time.monotonic,
        )

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

    def _evaluate_if_due(self, stop: StopPolicy) -> bool:
        """The periodic evaluations, if due; True where a signal ended them, on every process: the run stops at
        once, not after an evaluation longer than a scheduler waits between its SIGTERM and its SIGKILL."""
        every, step = self.plan.eval_every, self.state.step
        self.state.eval_pending = False
        if not every or step % every or step >= self.plan.steps:
            return False
        began = time.monotonic()
        try:
            for split, data in self.data.evals.items():
                self.metrics.write(self._evaluate(split, data, interrupted=stop.pending_signal))
        except EvaluationInterrupted as cut:  # not recorded; the re-run evaluates again before its first step
            stop.agreed_signum, self.state.eval_pending = cut.signum, True
            return True
        if self.plan.fitted:  # keep as long back for the final evaluation
            self.budget.reserve_s = distributed.max_across(time.monotonic() - began, self.device)
        return False

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

    # ------------------------------------------------------------------------------ evaluation
    @property
    def _eval_model(self) -> torch.nn.Module:
        """What an evaluation runs: the sharded model under FSDP (its forward is collective), else the plain one."""
        return self.state.model if self.sharded else self.state.module

    def _eval_context(self, **hooks: Callable[[], Any] | None) -> EvalContext:
        where = {"rank": self.info.rank, "world": self.info.world, "lockstep": self.sharded, **hooks}
        return EvalContext.of(self.config, self.device, self.autocast_dtype, **where)

    def _evaluate(self, split: str, data: Any, **hooks: Callable[[], Any] | None) -> dict[str, Any]:
        """The objective's evaluation of `split` (of the Polyak average when enabled, Sec. 4.1); `hooks`: the
        EvalContext's `interrupted` (this process's pending signal ends it) and `progress` (told of each batch)."""
        state = self.state
        with averaged(state.ema, state.module):
            result = self.objective.evaluate(self._eval_model, data, self._eval_context(**hooks))
        record = {"step": state.step, "epoch": self._epoch(state.step), "split": split, **result}
        if self.info.main and result.get("top1") is not None:
            log.info(
                "step %d %s: loss %.4f top-1 %.2f%% top-%d %.2f%%%s",
                state.step,
                split,
                result["loss"],
                100 * result["top1"],
                result.get("k", 5),
                100 * result["top5"],
                one_view_note(result),
            )
        return record

    def _finish(self, status: str, signum: int, progress: Callable[[], None]) -> dict[str, Any]:
        """Save, export the final model, then evaluate it (told `progress`): a failing evaluation loses nothing."""
        state, config = self.state, self.config
        state.elapsed += time.monotonic() - self.loop_start
        result: dict[str, Any] = {
            "status": status,
            "run_dir": str(self.run.path),
            "rank": self.info.rank,
            "step": state.step,
            "steps": self.plan.steps,
            "skipped_steps": state.skipped_steps,
            "startup_seconds": round(state.startup, 1),  # the first invocation's (data, model, warm-up)
            "plan": self.plan.to_dict(),
        }
        if status == "interrupted":
            self.metrics.close()
            return {**result, "signal": signum, "checkpoint": str(self.run.latest())}
        if self.saved_step != state.step:
            self.checkpointer.save(state)
        self.checkpointer.export(state)
        checkpoint = str(self.run.export(FINAL) if not self.sharded else self.run.latest())
        final = None
        if self.data.test is not None:
            with finish.evaluation_failure(self.run.path, config, checkpoint, self.metrics):
                final = self._evaluate(config.eval.final_split, self.data.test, progress=progress)
        late = finish.close_metrics(self.metrics, final, self.run.path) if self.info.main else 0  # a signal now
        if final is not None:
            result[config.eval.final_split] = {k: v for k, v in final.items() if k not in ("step", "epoch", "split")}
            result["epoch"] = final["epoch"]
        return {
            **result,
            "minutes": state.elapsed / 60,
            "wall_minutes": (time.monotonic() - self.started) / 60,
            "checkpoint": checkpoint,
            "late_signal": late,
        }
