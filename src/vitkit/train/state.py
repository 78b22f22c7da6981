"""Everything a run needs to continue bit-exactly (DESIGN.md "A run"): `TrainState`.

It holds only tensors and plain Python containers in its `state_dict()`, so that `train_state.pt` is
read with `torch.load(..., weights_only=True)`.  Where the state is written (the run directory's
layout) is `vitkit.runs`' business; when, `train/checkpointer.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from vitkit.train.ema import ModelEMA


@dataclass
class TrainState:
    """The model being trained (possibly wrapped by DDP/FSDP/compile) and its optimiser state."""

    model: nn.Module  # what forward runs through (the wrapped model; for MPP the wrapper around the encoder)
    module: nn.Module  # the bare model that checkpoints store (a ViT, hybrid or ResNet)
    optimizer: torch.optim.Optimizer
    generator: torch.Generator  # augmentation (and MPP corruption) randomness, on the training device
    ema: ModelEMA | None = None
    step: int = 0  # optimiser steps taken (skipped non-finite steps count: the data moved on)
    skipped_steps: int = 0  # non-finite steps skipped in total
    nan_streak: int = 0  # consecutive non-finite steps
    elapsed: float = 0.0  # seconds in the training loop, over all invocations
    startup: float = 0.0  # seconds of the first invocation's start-up (data, model, compilation)
    ended: bool = False  # the schedule's last step, at its end value, has run: a re-run takes no more

    def state_dict(self, *, optimizer: bool = True) -> dict[str, Any]:
        rng: dict[str, Any] = {"torch": torch.get_rng_state(), "augment": self.generator.get_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {
            "step": self.step,
            "skipped_steps": self.skipped_steps,
            "nan_streak": self.nan_streak,
            "elapsed": self.elapsed,
            "startup": self.startup,
            "ended": self.ended,
            "optimizer": self.optimizer.state_dict() if optimizer else None,
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "rng": rng,
        }

    def load_state_dict(self, state: dict[str, Any], *, optimizer: bool = True) -> None:
        self.step = int(state["step"])
        self.skipped_steps = int(state["skipped_steps"])
        self.nan_streak = int(state["nan_streak"])
        self.elapsed = float(state["elapsed"])
        self.startup = float(state.get("startup", 0.0))  # absent in checkpoints of earlier versions
        self.ended = bool(state.get("ended", False))
        if optimizer:
            self.optimizer.load_state_dict(state["optimizer"])
        if (state["ema"] is None) != (self.ema is None):
            raise ValueError("the checkpoint's EMA setting differs from the config's optim.ema_decay")
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        torch.set_rng_state(state["rng"]["torch"])
        self.generator.set_state(state["rng"]["augment"].to(torch.uint8))
        if "cuda" in state["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])
