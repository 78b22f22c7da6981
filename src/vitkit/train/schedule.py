"""Learning-rate schedules as pure functions of the step (Sec. 4.1, App. B.1, Tables 3-4).

Pre-training: linear warmup (10k steps in Table 3) then linear decay to 0 (or cosine).
Fine-tuning: cosine decay (Table 4), with a short warmup as the official fine-tuning code.
A pure function keeps resuming trivial: the multiplier at step t depends on t only.
"""

from __future__ import annotations

import math
from typing import Literal

ScheduleKind = Literal["cosine", "linear", "constant"]


def lr_multiplier(step: int, total_steps: int, warmup_steps: int = 0, kind: ScheduleKind = "cosine",
                  end_fraction: float = 0.0) -> float:
    """Factor applied to the peak learning rate for optimiser step `step` (0-based).

    Warmup ramps linearly as (step + 1) / warmup_steps, so the first update is not wasted at lr 0;
    afterwards progress p runs from 0 (first step after warmup) to 1 (last step, `total_steps - 1`)
    and the factor decays from 1 to `end_fraction`: linearly, as a half cosine, or not at all.
    """
    if total_steps < 1:
        raise ValueError(f"total_steps must be >= 1, got {total_steps}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    decay_steps = max(total_steps - 1 - warmup_steps, 1)
    progress = min(max((step - warmup_steps) / decay_steps, 0.0), 1.0)
    if kind == "constant":
        shape = 1.0
    elif kind == "linear":
        shape = 1.0 - progress
    elif kind == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"unknown schedule {kind!r}; expected cosine, linear or constant")
    return end_fraction + (1.0 - end_fraction) * shape


def resolution_at(fraction: float, sizes: tuple[int, ...], until: tuple[float, ...], final: int) -> int:
    """Training side length at `fraction` (0..1) of the schedule: sizes[i] before until[i], then `final`.

    Progressive resolution as the paper's own practice of training low and fine-tuning high
    (Sec. 3.2), applied within one run: the early phases see fewer tokens per image, so each step
    is cheaper; the last phase trains at the resolution the model is evaluated at.
    """
    for size, end in zip(sizes, until):
        if fraction < end:
            return size
    return final


def phase_at(fraction: float, rate: float, until: float, sizes: tuple[int, ...], size_until: tuple[float, ...],
             final: int) -> tuple[float, int]:
    """(PatchDropout rate, training side) at `fraction` of the schedule: `rate` before `until`, then all
    patches; the side as `resolution_at`.  The loop and the compile warm-up both read the phases here."""
    return (rate if fraction < until else 0.0), resolution_at(fraction, sizes, size_until, final)


def resolve_warmup(total_steps: int, warmup_steps: int, warmup_fraction: float) -> int:
    """Warmup length in steps: explicit steps win; else a fraction of the run; never the whole run."""
    steps = warmup_steps if warmup_steps > 0 else int(round(warmup_fraction * total_steps))
    return min(steps, max(total_steps - 1, 0))


def scaled_lr(lr: float, batch_size: int, base_batch_size: int, rule: Literal["none", "linear", "sqrt"]) -> float:
    """The learning-rate scaling rule (Goyal et al. 2017 linear; sqrt for Adam) from base to actual batch."""
    if rule == "none" or base_batch_size <= 0 or batch_size == base_batch_size:
        return lr
    ratio = batch_size / base_batch_size
    return lr * (ratio if rule == "linear" else math.sqrt(ratio))


class BudgetClock:
    """Schedule position under a wall-clock budget: the schedule ends when the budget is spent.

    With `run.budget_schedule="fit"` the run's planned steps are an upper bound, and the schedule is
    read at position max(step, total_steps * elapsed / usable budget): on a slower machine the decay
    advances by the clock, so the run still ends annealed (a budget that merely cuts a cosine run
    ends it at a high learning rate). The budget left for the final evaluation is the length of the
    last periodic one. The position only moves forward; `observe` must get the same elapsed time on
    every process (the loop takes the maximum over processes). An infinite budget is the plain
    step schedule: position = step, done once step reaches total_steps.
    """

    def __init__(self, total_steps: int, budget_s: float):
        if budget_s <= 0:
            raise ValueError(f"a fitted schedule needs a time budget (run.max_minutes > 0), got {budget_s} s")
        self.total_steps, self.budget_s = total_steps, budget_s
        self.offset = 0.0  # schedule position - optimiser step; grows when the clock runs ahead of the steps
        self.reserve_s = 0.0  # kept back for the final evaluation

    def observe(self, step: int, elapsed_s: float) -> None:
        usable = max(self.budget_s - self.reserve_s, 1e-9)
        self.offset = max(self.offset, self.total_steps * elapsed_s / usable - step)

    def position(self, step: int) -> float:
        return min(step + self.offset, float(self.total_steps))

    def done(self, step: int) -> bool:
        """Whether the schedule has reached its end: the next update would be at (or past) the last step."""
        return step + self.offset >= self.total_steps
