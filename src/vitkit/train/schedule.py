"""The schedule at a position: learning rate, PatchDropout rate, EMA decay (Sec. 4.1, App. B.1, Tables 3-4).

Pre-training: linear warmup (10k steps in Table 3) then linear decay to 0 (or cosine).
Fine-tuning: cosine decay (Table 4), with a short warmup as the official fine-tuning code.
Everything is a pure function of the position (the step, or where a time budget has got to:
train/budget.py), so resuming is trivial and a budget stretches or shrinks every schedule alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

ScheduleKind = Literal["cosine", "linear", "constant"]


def lr_multiplier(
    step: float, total_steps: int, warmup_steps: int = 0, kind: ScheduleKind = "cosine", end_fraction: float = 0.0
) -> float:
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


def resolve_warmup(total_steps: int, warmup_steps: int, warmup_fraction: float) -> int:
    """Warmup length in steps: explicit steps win; else a fraction of the run; never the whole run: the last
    step is always the decay's, at its end value (a run of 2 steps or more)."""
    steps = warmup_steps if warmup_steps > 0 else int(round(warmup_fraction * total_steps))
    return min(steps, max(total_steps - 2, 0))


def scaled_lr(lr: float, batch_size: int, base_batch_size: int, rule: Literal["none", "linear", "sqrt"]) -> float:
    """The learning-rate scaling rule (Goyal et al. 2017 linear; sqrt for Adam) from base to actual batch."""
    if rule == "none" or base_batch_size <= 0 or batch_size == base_batch_size:
        return lr
    ratio = batch_size / base_batch_size
    return lr * (ratio if rule == "linear" else math.sqrt(ratio))


@dataclass(frozen=True)
class Phase:
    """What the schedule asks for at one position."""

    lr: float  # learning rate of the step (peak x multiplier)
    patch_dropout: float  # PatchDropout rate (0 = every patch)
    side: int  # training resolution in pixels (the model's)
    ema_decay: float  # Polyak averaging decay of this step (0 = no averaging)


@dataclass(frozen=True)
class Schedule:
    """Every per-step quantity of a run as a function of the position (0 ... total_steps).

    PatchDropout drops `patch_dropout` of the patches until the fraction `patch_until` of the schedule,
    then keeps every patch.
    """

    total_steps: int
    peak_lr: float
    warmup_steps: int = 0
    kind: ScheduleKind = "cosine"
    end_fraction: float = 0.0
    patch_dropout: float = 0.0
    patch_until: float = 1.0
    side: int = 224
    ema_decay: float = 0.0

    def rate_at(self, fraction: float) -> float:
        """The PatchDropout rate at `fraction` (0..1) of the schedule."""
        return self.patch_dropout if fraction < self.patch_until else 0.0

    def at(self, position: float) -> Phase:
        lr = self.peak_lr * lr_multiplier(position, self.total_steps, self.warmup_steps, self.kind, self.end_fraction)
        return Phase(
            lr=lr, patch_dropout=self.rate_at(position / self.total_steps), side=self.side, ema_decay=self.ema_decay
        )

    def spans(self) -> list[tuple[float, float, float]]:
        """(begin, end, PatchDropout rate) fractions of the schedule between phase changes."""
        if self.patch_dropout > 0 and 0.0 < self.patch_until < 1.0:
            return [(0.0, self.patch_until, self.patch_dropout), (self.patch_until, 1.0, 0.0)]
        return [(0.0, 1.0, self.rate_at(0.0))]

    def phases(self, start: float = 0.0) -> list[tuple[float, int]]:
        """(PatchDropout rate, side) of each phase not over at fraction `start`: one compiled graph each."""
        return [(rate, self.side) for begin, end, rate in self.spans() if end > start]
