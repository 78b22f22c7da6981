"""The non-finite guard: a NaN/Inf loss or gradient skips the update, and too many in a row stop the run.

`train_step` decides the skip itself (on the device with the fused optimiser's `found_inf`, so the step
never waits for the host, or on the host after one sync).  The guard accounts for the flags, possibly
later ("deferred": read at log and checkpoint steps, one sync for many steps): it keeps the counters
of the training state, reports every skipped step, and raises `NonFiniteLossError`, naming the step
and the last good checkpoint, once `patience` steps in a row were skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)


class NonFiniteLossError(ValueError):
    """The loss (or gradient norm) was NaN/Inf for `run.nan_patience` consecutive steps."""


class NonFiniteGuard:
    """Counts skipped (non-finite) steps; `counters` is the training state that keeps them across resumes."""

    def __init__(
        self,
        counters: Any,
        patience: int,
        *,
        report: Callable[[dict[str, Any]], None] = lambda r: None,
        last_good: Callable[[], object] = lambda: None,
    ):
        self.counters, self.patience = counters, patience
        self.report, self.last_good = report, last_good
        self.unchecked: list[tuple[int, bool | torch.Tensor]] = []  # (step, skipped flag) not yet looked at

    def observe(self, step: int, skipped: bool | torch.Tensor) -> None:
        """Record the flag of optimiser step `step` (a bool, or a 0-d tensor to be read at the next `flush`)."""
        self.unchecked.append((step, skipped))

    @property
    def pending(self) -> bool:
        return bool(self.unchecked)

    def flush(self) -> list[int]:
        """Read the pending flags (one host sync), update the counters; returns the skipped steps.

        Raises NonFiniteLossError once `patience` consecutive steps were skipped.
        """
        flags = [bool(flag) for _, flag in self.unchecked]
        skipped_steps = []
        for (step, _), skipped in zip(self.unchecked, flags):
            self.counters.nan_streak = self.counters.nan_streak + 1 if skipped else 0
            self.counters.skipped_steps += int(skipped)
            if not skipped:
                continue
            skipped_steps.append(step)
            log.warning(
                "step %d: non-finite loss or gradient; update skipped (%d in a row)", step, self.counters.nan_streak
            )
            self.report({"step": step, "split": "train", "skipped": True, "nan_streak": self.counters.nan_streak})
            if self.counters.nan_streak >= self.patience:
                self.unchecked.clear()
                last_good = self.last_good()
                raise NonFiniteLossError(
                    f"loss/gradient was NaN or Inf for {self.counters.nan_streak} consecutive steps, the last at step "
                    f"{step}; stopped without saving. Last good checkpoint: {last_good or 'none (no checkpoint yet)'}. "
                    "Lower optim.lr, raise optim.warmup_steps or (where it trains in bf16) use run.precision=fp32, "
                    + (
                        "in a new run (another --out: a re-run of this one resumes its own config)"
                        if last_good
                        else "then re-run: with no checkpoint, the same --out starts over with the new settings"
                    )
                )
        self.unchecked.clear()
        return skipped_steps
