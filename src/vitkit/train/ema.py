"""Polyak averaging of the weights (Polyak & Juditsky 1992), used in Sec. 4.1 with factor 0.9999.

`ema = decay * ema + (1 - decay) * weights` after every optimiser step, over every floating-point
parameter and buffer.  The average is what gets evaluated and saved when enabled.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn


class ModelEMA:
    """Exponential moving average of a model's floating-point state (parameters and buffers)."""

    def __init__(self, model: nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.shadow = {k: v.detach().clone() for k, v in model.state_dict().items() if v.is_floating_point()}

    @torch.no_grad()
    def update(self, model: nn.Module, skip: Tensor | None = None, decay: float | None = None) -> None:
        """One averaging step with `decay` (default: the EMA's own; the schedule may warm it up);
        `skip` (a 0-d bool tensor) turns it into a no-op without a host sync."""
        decay = self.decay if decay is None else decay
        current = model.state_dict()
        keys = list(self.shadow)
        shadow = [self.shadow[k] for k in keys]
        if skip is None:
            torch._foreach_lerp_(shadow, [current[k].detach() for k in keys], 1.0 - decay)  # one fused pass
            return
        weight = (1.0 - decay) * (~skip).float()
        for average, value in zip(shadow, (current[k].detach() for k in keys)):
            average.lerp_(value, weight.to(average.dtype))

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> None:
        """Load the averaged weights into `model` (non-float buffers are left as they are)."""
        state = model.state_dict()
        for key, value in self.shadow.items():
            state[key].copy_(value)

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self.shadow)

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        missing, extra = sorted(set(self.shadow) - set(state)), sorted(set(state) - set(self.shadow))
        if missing or extra:
            raise ValueError(f"EMA state does not fit the model: missing {missing[:5]}, unexpected {extra[:5]}")
        for key, value in state.items():
            self.shadow[key].copy_(value)


@contextlib.contextmanager
def averaged(ema: ModelEMA | None, module: nn.Module) -> Iterator[nn.Module]:
    """`module` holding the Polyak average while inside (the raw weights come back after); a no-op without EMA."""
    if ema is None:
        yield module
        return
    backup = {k: v.clone() for k, v in module.state_dict().items()}
    ema.copy_to(module)
    try:
        yield module
    finally:
        module.load_state_dict(backup)
