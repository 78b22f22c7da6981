"""The Trainer's rehearsal part: compile and time every phase before the clock starts, plan the speed, check it
on the first real steps, and fit the regularisation to the epochs that fit (train/estimate.py, train/short_run.py).

`Rehearsal` is a base of `Trainer` (train/trainer.py) and reads the run's parts from it: the model and its
state, the data, the objective, the schedule, the plan and, once the loop runs, the budget clock.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import torch

from vitkit.data.transforms import describe_augment
from vitkit.device import autocast
from vitkit.train import distributed, short_run
from vitkit.train.estimate import SpeedCheck, check_lines, checked, eta, rehearse
from vitkit.train.plan import Plan
from vitkit.train.schedule import Phase

log = logging.getLogger("vitkit.train.trainer")


class Rehearsal:
    """Methods of the Trainer that measure its speed and fit the run to it."""

    config: Any
    configured: Any
    plan: Plan
    short: short_run.Decision | None
    speed_check: SpeedCheck | None
    check_decides: bool

    def _run_once(self, rate: float, side: int) -> None:
        """One forward + backward of a blank micro-batch laid out as the training ones (the rehearsal's unit)."""
        train, micro = self.data.train, self.plan.micro_batch
        shape = tuple(train.images.shape[1:]) if train.images is not None else (train.channels, train.load_size or side,
                                                                                 train.load_size or side)
        raw = [(torch.zeros(micro, *shape, dtype=torch.uint8, device=self.device),
                torch.zeros(micro, dtype=torch.long, device=self.device))]
        generator = torch.Generator(device=self.device).manual_seed(0)
        phase = Phase(lr=0.0, patch_dropout=rate, side=side, ema_decay=0.0)
        inputs = self.objective.batch(raw, phase, generator)[0]
        with autocast(self.device, self.autocast_dtype):
            loss, _ = self.objective.loss_of(self.step_spec(phase), generator)(self.state.model, inputs)
        loss.float().backward()

    def rehearsed_plan(self) -> Plan:
        """Compile (when asked) and time every phase still ahead; the plan with its measured speed and ETA."""
        needed = self.schedule.phases(start=self.state.step / self.plan.steps)
        compiling = self.state.model is not self.eager
        if compiling:
            log.info("torch.compile: compiling %d graph(s) before the first step (tens of seconds each on a CPU)",
                     len(needed))
        try:
            seconds, timings = rehearse(self.state.module, needed, self._run_once, self.device)
        except Exception as err:
            if not compiling:
                raise
            # A broken compiler toolchain: train eagerly rather than not at all.
            log.warning("torch.compile failed (%s: %s); training eagerly (run.compile=false skips compiling)",
                        type(err).__name__, (str(err).strip().splitlines() or [""])[0])
            self.state.model = self.eager
            compiling, (seconds, timings) = False, rehearse(self.state.module, needed, self._run_once, self.device)
        if compiling:
            log.info("torch.compile: %d graph(s) (PatchDropout rate, side) %s compiled in %.0f s", len(needed), needed,
                     seconds)
        budget_left = self._budget_s() if self.plan.fitted else None
        evals = sum(len(s) for s in self.data.evals.values()) if self.plan.eval_every else 0
        self.eval_images = evals + (len(self.data.test) if self.data.test is not None else 0)
        measured = eta(self.plan, self.schedule, timings, start_step=self.state.step, eval_images=self.eval_images,
                       budget_left_s=budget_left)
        check = SpeedCheck(timings, self.plan.accumulation, self.state.step, measured.get("step_seconds", 0.0),
                           budget_left, self.plan.steps)
        check.end = int(distributed.min_across(check.end, self.device))  # the same step on every process
        # Under a fitted budget the check decides the regularisation again, unless an earlier invocation decided it.
        self.check_decides = self.plan.fitted and self.short is None and short_run.active(self.config)
        if measured and check.ends_in(self.plan.steps):
            self.speed_check = check
            measured.update(check_steps=[check.begin, check.end], check_decides=self.check_decides)
        return dataclasses.replace(self.plan, measured=measured)

    def _check_speed(self, phase: Phase, clock: Callable[[], float]) -> None:
        """The first real steps timed: the ETA and the epochs that fit again, and the regularisation with them
        (`clock`: the loop's)."""
        state, check = self.state, self.speed_check
        overhead = check.observe(state.step, clock, (phase.patch_dropout, phase.side)) if check else None
        if overhead is None:
            return
        now = clock()
        left = self.clock.budget_s - state.elapsed - (now - self.loop_start) if self.plan.fitted else None
        measured = checked(self.plan, self.schedule, check, overhead, step=state.step, eval_images=self.eval_images,
                           position=self.clock.position(state.step), budget_left_s=left)
        self.plan = dataclasses.replace(self.plan, measured=measured)
        if self.check_decides:
            self._fit_regularisation(None)
        if self.info.main:
            for line in check_lines(self.plan) + ([self.plan.regularisation] if self.check_decides else []):
                log.info("%s", line)

    def _fit_regularisation(self, stored: short_run.Decision | None) -> None:
        """Regularisation by the epochs that fit (optim.light_below_epochs, heavy_from_epochs; train/short_run.py)."""
        self.short = short_run.decide(self.configured, self.plan, stored, self.device)
        line = short_run.describe(self.configured, self.plan, self.short)
        self.config = self.objective.config = short_run.apply(self.configured, self.short, self.state.module)
        self.plan = dataclasses.replace(self.plan, regularisation=line, augment=tuple(describe_augment(self.config.augment)))
