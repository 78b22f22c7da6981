"""Everything a run needs to continue bit-exactly (DESIGN.md "A run"): `TrainState`.

It holds only tensors and plain Python containers in its `state_dict()`, so that `train_state.pt` is
read with `torch.load(..., weights_only=True)`.  Where the state is written (the run directory's
layout) is `vitkit.runs`' business; when, `train/checkpointer.py`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from vitkit.train.ema import ModelEMA

MAX_COUNT = 10**12  # a step or step count above this in a train state is damage (data.steps is at most 1e9)
MAX_RECORDS = 10**6  # pending step outputs (at most run.log_every) above this in a train state are damage


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
    eval_pending: bool = False  # a signal cut this step's periodic evaluation: a re-run evaluates first
    records: list[dict[str, Any]] = field(default_factory=list)  # step outputs since the last train record

    def rng_state(self) -> dict[str, torch.Tensor]:
        """This process's random streams, as uint8 tensors: torch's global CPU one (initialisation, dropout,
        stochastic depth), the augmentation generator's and, training on a GPU, that GPU's (its dropout).
        Only the training device is read: reading every GPU's would start a CUDA context on each."""
        rng = {"torch": torch.get_rng_state(), "augment": self.generator.get_state()}
        if self.generator.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.generator.device)
        return rng

    def set_rng_state(self, rng: dict[str, Any]) -> None:
        """Continue the random streams of `rng_state()` (also the list of every GPU's states that earlier
        checkpoints kept: the training device's is taken)."""
        torch.set_rng_state(rng["torch"])
        self.generator.set_state(rng["augment"].to(torch.uint8))
        device = self.generator.device
        if "cuda" in rng and device.type == "cuda":
            cuda = rng["cuda"]
            index = device.index if device.index is not None else torch.cuda.current_device()
            torch.cuda.set_rng_state(cuda[index] if isinstance(cuda, list) else cuda, device)

    def state_dict(self, *, optimizer: bool = True) -> dict[str, Any]:
        """The state to resume from (the random streams are this process's: `Checkpointer` adds every one's)."""
        return {
            "step": self.step,
            "skipped_steps": self.skipped_steps,
            "nan_streak": self.nan_streak,
            "elapsed": self.elapsed,
            "startup": self.startup,
            "ended": self.ended,
            "eval_pending": self.eval_pending,
            "records": [
                {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
                for out in self.records
            ],
            "optimizer": self.optimizer.state_dict() if optimizer else None,
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "rng": self.rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any], *, optimizer: bool = True) -> None:
        self.step = int(state["step"])
        self.skipped_steps = int(state["skipped_steps"])
        self.nan_streak = int(state["nan_streak"])
        self.elapsed = float(state["elapsed"])
        self.startup = float(state.get("startup", 0.0))  # absent in checkpoints of earlier versions
        self.ended = bool(state.get("ended", False))
        self.eval_pending = bool(state.get("eval_pending", False))
        self.records[:] = _records(state.get("records"))  # absent in earlier versions: the next record starts here
        if optimizer:
            self.optimizer.load_state_dict(state["optimizer"])
        if (state["ema"] is None) != (self.ema is None):
            raise ValueError("the checkpoint's EMA setting differs from the config's optim.ema_decay")
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        self.set_rng_state(state["rng"])

    def check_state_dict(self, state: Any) -> None:
        """A ValueError where `state` (a train_state.pt read from disk) does not fit this run: counts out of
        range, optimiser or EMA tensors of other shapes than the parameters', random streams of another size.
        Loaded unchecked, a wrong optimiser shape crashed torch's fused kernels natively."""
        if not isinstance(state, dict) or not isinstance(state.get("optimizer"), dict):
            raise ValueError(f"the train state is a {type(state).__name__} without an optimizer state")
        for key in ("step", "skipped_steps", "nan_streak"):
            value = state.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
                raise ValueError(f"the train state's {key} is {value!r:.40}, not a count in 0..{MAX_COUNT:.0e}")
        parts = getattr(self.optimizer, "parts", None)  # an OptimizerSet (Muon + AdamW) saves {"parts": [...]}
        if parts is None:
            _check_optimizer(state["optimizer"], _params(self.optimizer))
        else:
            stored = state["optimizer"].get("parts")
            if not isinstance(stored, list) or len(stored) != len(parts):
                raise ValueError(f"the train state's optimizer is not the {len(parts)} optimisers of this run")
            for part, saved in zip(parts, stored, strict=True):
                if not isinstance(saved, dict):
                    raise ValueError("the train state's optimizer holds a part that is no optimiser state")
                _check_optimizer(saved, _params(part))
        if self.ema is not None and isinstance(state.get("ema"), dict):
            for key, value in state["ema"].items():
                shadow = self.ema.shadow.get(key)
                if shadow is not None and (not isinstance(value, torch.Tensor) or value.shape != shadow.shape):
                    raise ValueError(f"the train state's EMA {key} does not have the model's shape")
        rng = state.get("rng")
        ours = self.rng_state()
        for key in ("torch", "augment"):
            value = rng.get(key) if isinstance(rng, dict) else None
            if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8 or value.numel() != ours[key].numel():
                raise ValueError(f"the train state's {key} random stream is not one of this torch")
        data = state.get("data")  # the data position after the last step handed out: the state's step
        if data is not None and (not isinstance(data, dict) or data.get("step") != state["step"]):
            position = data.get("step") if isinstance(data, dict) else data
            raise ValueError(f"the train state's data position {position!r:.40} is not its step {state['step']}")


def _records(stored: Any) -> list[dict[str, Any]]:
    """The pending step outputs of a train state, where they are what `train_step` returns (0-d tensors,
    numbers and bools by name); anything else is dropped, as a record's worth of means is not worth a resume."""
    scalar = lambda v: isinstance(v, (int, float, bool)) or (isinstance(v, torch.Tensor) and v.dim() == 0)  # noqa: E731
    if not isinstance(stored, list) or len(stored) > MAX_RECORDS:
        return []
    good = all(isinstance(out, dict) and {"loss", "grad_norm", "lr", "skipped"} <= out.keys() for out in stored)
    return list(stored) if good and all(scalar(v) for out in stored for v in out.values()) else []


def _params(optimizer: Any) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _check_optimizer(stored: dict[str, Any], params: list[torch.Tensor]) -> None:
    """The optimiser state's per-parameter tensors have their parameters' shapes (scalars, a step count, aside)."""
    groups, per_param = stored.get("param_groups"), stored.get("state")
    if not isinstance(groups, list) or not isinstance(per_param, dict):
        raise ValueError("the train state's optimizer has no param_groups list and state mapping")
    ids = [i for group in groups if isinstance(group, dict) for i in group.get("params", [])]
    if len(ids) != len(params):
        raise ValueError(f"the train state's optimizer holds {len(ids)} parameters, this model {len(params)}")
    shapes = dict(zip(ids, (p.shape for p in params)))
    for index, entry in per_param.items():
        if index not in shapes or not isinstance(entry, dict):
            raise ValueError(f"the train state's optimizer has state for an unknown parameter {index!r:.40}")
        for name, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != shapes[index]:
                raise ValueError(
                    f"the train state's optimizer {name} of parameter {index} has shape {tuple(value.shape)}, "
                    f"the parameter {tuple(shapes[index])}"
                )
