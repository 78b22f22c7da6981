"""The schedule at a position: learning rate, PatchDropout rate, training side, EMA decay (Sec. 4.1, App. B.1,
Tables 3-4), and the budget clock that turns wall-clock time into a position.

Pre-training: linear warmup (10k steps in Table 3) then linear decay to 0 (or cosine).
Fine-tuning: cosine decay (Table 4), with a short warmup as the official fine-tuning code.
Everything is a pure function of the position (the step, or where the budget clock has got to), so
resuming is trivial and a time budget can stretch or shrink every schedule alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, TypeVar

ScheduleKind = Literal["cosine", "linear", "constant"]
T = TypeVar("T", int, float)


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


def resolution_at(fraction: float, sizes: tuple[T, ...], until: tuple[float, ...], final: T) -> T:
    """Training side length at `fraction` (0..1) of the schedule: sizes[i] before until[i], then `final`
    (the same stepping reads the PatchDropout phases).

    Progressive resolution as the paper's own practice of training low and fine-tuning high
    (Sec. 3.2), applied within one run: the early phases see fewer tokens per image, so each step
    is cheaper; the last phase trains at the resolution the model is evaluated at.
    """
    for size, end in zip(sizes, until):
        if fraction < end:
            return size
    return final


def phase_at(fraction: float, rates: tuple[float, ...], rate_until: tuple[float, ...], sizes: tuple[int, ...],
             size_until: tuple[float, ...], final: int) -> tuple[float, int]:
    """(PatchDropout rate, training side) at `fraction` of the schedule: rates[i] before rate_until[i], then
    all patches; the side as `resolution_at`.  The loop and the compile warm-up both read the phases here."""
    return resolution_at(fraction, rates, rate_until, 0.0), resolution_at(fraction, sizes, size_until, final)


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
    read at position max(step, clock), the clock being total_steps * elapsed / usable budget: on a
    slower machine the decay and the phase marks (PatchDropout, resolution) advance by the clock, so the
    run still ends annealed (a budget that merely cuts a cosine run ends it at a high learning rate),
    and a phase that starts at fraction f of the schedule starts at fraction f of the budget's time,
    however fast the earlier phases ran; on a machine fast enough to run every planned step, the steps
    lead.  The clock keeps no memory of an earlier lead: a slow start followed by fast steps does not
    push the position ahead of the clock (that memory gave the last phase 20% of the time in one run and
    37% in another).  The budget left for the final evaluation is the length of the last periodic one.
    Every process must build it with the same budget (the loop takes the smallest) and `observe` the same
    elapsed time (the loop takes the largest); between observations the clock is extrapolated at its pace
    per step over the last two.
    The position never moves back.  An infinite budget is the plain step schedule: position = step,
    done once step reaches total_steps.
    """

    def __init__(self, total_steps: int, budget_s: float):
        if budget_s <= 0:
            raise ValueError(f"a fitted schedule needs a time budget (run.max_minutes > 0), got {budget_s} s")
        self.total_steps, self.budget_s = total_steps, budget_s
        self.reserve_s = 0.0  # kept back for the final evaluation
        self._seen: tuple[int, float] | None = None  # (step, clock position) at the last observation
        self._pace = 0.0  # clock position gained per step between the last two observations
        self._reached = 0.0  # the furthest position given out

    def observe(self, step: int, elapsed_s: float) -> None:
        usable = max(self.budget_s - self.reserve_s, 1e-9)
        clock = self.total_steps * elapsed_s / usable
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
        return min(max(self._reached, float(step), clock), float(self.total_steps))

    def position(self, step: int) -> float:
        """The position of the update after `step` steps; where the next one would be past the schedule's end
        (a clock that moves more than a step per step, on a slow machine), this one is the last and runs at
        the end value."""
        at = self._at(step)
        if self._at(step + 1) >= self.total_steps:
            at = max(at, self.total_steps - 1.0)
        self._reached = at
        return at

    def done(self, step: int) -> bool:
        """Whether the schedule has reached its end: the next update would be at (or past) the last step."""
        return self._at(step) >= self.total_steps


@dataclass(frozen=True)
class Phase:
    """What the schedule asks for at one position."""

    lr: float  # learning rate of the step (peak x multiplier)
    patch_dropout: float  # PatchDropout rate (0 = every patch)
    side: int  # training resolution in pixels
    ema_decay: float  # Polyak averaging decay of this step (0 = no averaging)


@dataclass(frozen=True)
class Schedule:
    """Every per-step quantity of a run as a function of the schedule position (0 ... total_steps).

    `patch_until` and `resolution_until` are fractions of the schedule; after `patch_until` the rates
    `patch_later` follow, each until its `patch_later_until` mark, then every patch; `ema_warmup` ramps the averaging
    decay as min(decay, (1 + t) / (10 + t)) with t the position, so early weights, far from the final
    ones, fade out quickly (as timm's and big_vision's EMA warm-ups).
    """

    total_steps: int
    peak_lr: float
    warmup_steps: int = 0
    kind: ScheduleKind = "cosine"
    end_fraction: float = 0.0
    patch_dropout: float = 0.0
    patch_until: float = 1.0
    patch_later: tuple[float, ...] = ()
    patch_later_until: tuple[float, ...] = ()
    resolutions: tuple[int, ...] = ()
    resolution_until: tuple[float, ...] = ()
    side: int = 224
    ema_decay: float = 0.0
    ema_warmup: bool = False

    @property
    def rates(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """The PatchDropout phases as (rates, the fraction each ends at)."""
        return (self.patch_dropout, *self.patch_later), (self.patch_until, *self.patch_later_until)

    def _phase(self, fraction: float) -> tuple[float, int]:
        return phase_at(fraction, *self.rates, self.resolutions, self.resolution_until, self.side)

    def _marks(self) -> list[float]:
        inner = (*self.resolution_until, *self.rates[1])
        return sorted({0.0, 1.0, *(f for f in inner if 0.0 < f < 1.0)})

    def at(self, position: float) -> Phase:
        rate, side = self._phase(position / self.total_steps)
        lr = self.peak_lr * lr_multiplier(position, self.total_steps, self.warmup_steps, self.kind, self.end_fraction)
        decay = min(self.ema_decay, (1 + position) / (10 + position)) if self.ema_warmup else self.ema_decay
        return Phase(lr=lr, patch_dropout=rate, side=side, ema_decay=decay)

    def phases(self, start: float = 0.0) -> list[tuple[float, int]]:
        """(PatchDropout rate, side) of each phase not over at fraction `start` (one compiled graph each).

        The schedule changes phase only at the PatchDropout and `resolution_until` marks; each span
        between marks is read with `phase_at`, the rule `at` uses.
        """
        marks = self._marks()
        found: list[tuple[float, int]] = []
        for begin, end in zip(marks, marks[1:]):
            phase = self._phase(begin)
            if end > start and phase not in found:
                found.append(phase)
        return found

    def spans(self) -> list[tuple[float, float, int, float]]:
        """(begin, end, side, PatchDropout rate) fractions of the schedule between phase changes (for the ETA)."""
        marks = self._marks()
        out = []
        for begin, end in zip(marks, marks[1:]):
            rate, side = self._phase(begin)
            out.append((begin, end, side, rate))
        return out
