"""How a time budget becomes a schedule: vitkit's one model of time (DESIGN.md "One model of time").

Every per-step quantity of a run (learning rate, PatchDropout phase, EMA decay) is read from the schedule
at a position between 0 and its length L (train/schedule.py).  Without a budget the position is the step.
With `--max-minutes M` (run.budget_schedule="fit") the position is the larger of the step (when the run has
a length of its own: --epochs, data.steps, or a recipe's that caps a budgeted run, train/transfer_recipes.py) and
L x the fraction of the usable budget spent training; a
budgeted run without a length of its own goes by the clock alone, its L the steps the warm-up estimates will
fit.  The run takes its last step, at the schedule's end value, when the next position would reach L, so it
ends annealed whichever runs out first.  The usable budget is M minutes less the start-up (loading data,
building and compiling the model) and a reserve for the final evaluation.  A budget is what an uninterrupted
run takes: a resumed invocation's start-up is not charged, so an interrupted run trains the rest of its
schedule in the training time it had left and still ends annealed; each restart costs its start-up on top.
Processes agree on the time spent at log and checkpoint steps and extrapolate it between them at the last
pace, so no collective runs on every step.

`warm_up` runs one forward + backward of every phase before the clock starts (under torch.compile it builds
each phase's graph, which would otherwise cost the first steps of the budget), timing the passes; the plan
prints the estimate they give.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from torch import nn

from vitkit.device import synchronize

GraphKey = tuple[float, int]  # (PatchDropout rate, side): one compiled graph each


class Budget:
    """The schedule position of a run: from its steps, its time budget, or the larger of the two.

    `length` is the schedule's length L in steps; `seconds` the usable budget (None or inf: no budget);
    `steps_count` whether the step count bounds the run too (a run with a length of its own).  The
    position never moves back.
    """

    def __init__(self, length: int, seconds: float | None = None, *, steps_count: bool = True):
        if length < 1:
            raise ValueError(f"a schedule needs at least one step, got {length}")
        if seconds is not None and seconds <= 0:
            raise ValueError(f"a time budget must be positive, got {seconds} s")
        if seconds is None and not steps_count:
            raise ValueError("a run needs a length or a time budget")
        self.length, self.seconds, self.steps_count = length, seconds, steps_count
        self.reserve_s = 0.0  # kept back for the final evaluation (the trainer sets it)
        self._seen: tuple[int, float] | None = None  # (step, clock position) at the last observation
        self._pace = 0.0  # clock position gained per step between the last two observations
        self._reached = 0.0  # the furthest position given out
        self._given = False  # a position was given out in this invocation
        self._last = False  # ... and it was the last one (the end value)

    @property
    def timed(self) -> bool:
        return self.seconds is not None and math.isfinite(self.seconds)

    def observe(self, step: int, elapsed_s: float) -> None:
        """The training seconds spent after `step` steps (the same on every process)."""
        if not self.timed:
            return
        clock = self.length * elapsed_s / max(self.seconds - self.reserve_s, 1e-9)
        if self._seen is not None:
            last_step, last_clock = self._seen
            clock = max(clock, last_clock)
            if step > last_step:
                self._pace = (clock - last_clock) / (step - last_step)
        self._seen = (step, clock)

    def _at(self, step: int) -> float:
        clock = 0.0
        if self._seen is not None:
            last_step, last_clock = self._seen
            clock = last_clock + max(step - last_step, 0) * self._pace
        return min(max(self._reached, float(step) if self.steps_count else 0.0, clock), float(self.length))

    def position(self, step: int) -> float:
        """The position of the update after `step` steps.  Where it or the next one would reach the schedule's
        end, this one is the last and runs at the end value (L - 1): a clock that jumped past the end between
        two steps still ends the run annealed."""
        at = self._at(step)
        if at >= self.length - 1 or self._at(step + 1) >= self.length:
            at = self.length - 1.0
        self._reached, self._given, self._last = max(self._reached, at), True, at >= self.length - 1
        return at

    def done(self, step: int) -> bool:
        """Whether the schedule has run out: its last update ran (or, before any in this invocation, the
        position has reached the end already)."""
        return self._last or (not self._given and self._at(step) >= self.length)


def warm_up(
    module: nn.Module,
    phases: list[GraphKey],
    run_once: Callable[[float, int], None],
    device: torch.device,
    *,
    timed: int = 2,
) -> tuple[float, dict[GraphKey, float]]:
    """Run `run_once(rate, side)` (one micro-batch forward + backward) 1 + `timed` times per phase.

    Returns the seconds spent in all and, per phase, the median seconds of the timed passes (the first pass
    of each phase compiles or warms caches and is not timed).  It runs under a forked RNG, and `module`'s
    gradients are cleared afterwards (also when a pass fails): weights, gradients and random streams are
    what they would be without it.
    """
    start, was_training = time.monotonic(), module.training
    module.train()
    timings: dict[GraphKey, float] = {}
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for rate, side in phases:
                seconds = []
                for index in range(1 + timed):
                    begin = time.perf_counter()
                    run_once(rate, side)
                    synchronize(device)
                    if index:
                        seconds.append(time.perf_counter() - begin)
                if seconds:
                    timings[(rate, side)] = sorted(seconds)[len(seconds) // 2]
    finally:
        module.train(was_training)
        for param in module.parameters():
            param.grad = None
    return time.monotonic() - start, timings


def steps_that_fit(spans: list[tuple[float, float, float]], seconds: float) -> int:
    """Steps a budget of `seconds` holds when the schedule's spans (begin, end fractions, seconds a step) each
    take their share of the time: a phase planned for 80% of the schedule takes 80% of the budget."""
    total = sum(end - begin for begin, end, _ in spans)
    if total <= 0 or seconds <= 0:
        return 1
    return max(1, round(sum((end - begin) / total * seconds / max(step_s, 1e-9) for begin, end, step_s in spans)))
