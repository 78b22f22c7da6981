"""Optimisers of the paper with their parameter groups (Sec. 4.1, App. B.1, B.1.1).

Pre-training uses Adam (beta1 0.9, beta2 0.999) with "weight decay 0.1".  In the code the paper
used (flax.optim.Adam, `weight_decay` documented as "AdamW style weight decay rate (relative to
learning rate)") the update is  theta <- theta - lr_t * (adam_step + wd * theta),  i.e. decoupled
decay multiplied by the *scheduled* learning rate.  That is exactly torch.optim.AdamW, which we use
with weight_decay = 0.1.  big_vision writes the same thing with an absolute wd (1e-4 = 0.1 x lr
1e-3) multiplied by the schedule, and decays only `kernel`s (dense and conv weights): biases,
LayerNorm scales, position embeddings and the [class] token are not decayed.  `decay_on="kernels"`
(our default) follows big_vision; `decay_on="all"` decays everything like flax.optim did.
Fine-tuning uses SGD with momentum 0.9 and no weight decay (Table 4).
"""

from __future__ import annotations

import torch
from torch import nn

from vitkit.train.config import OptimConfig


def is_kernel(name: str, param: torch.Tensor) -> bool:
    """Dense/conv weights (the tensors big_vision matches with `.*/kernel$`): ndim >= 2, not embeddings."""
    leaf = name.rsplit(".", 1)[-1]
    return param.ndim >= 2 and leaf == "weight"


def param_groups(model: nn.Module, weight_decay: float, decay_on: str) -> list[dict]:
    """Two groups: decayed and not decayed (empty groups are dropped)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (decay if decay_on == "all" or is_kernel(name, param) else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay, "name": "decay"},
              {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"}]
    return [g for g in groups if g["params"]]


def build_optimizer(model: nn.Module, config: OptimConfig, lr: float, fused: bool = False) -> torch.optim.Optimizer:
    """AdamW or SGD-momentum over `model`'s trainable parameters with peak learning rate `lr`.

    `fused=True` uses the fused kernels, which can skip a step on the device (`found_inf`).
    """
    groups = param_groups(model, config.weight_decay, config.decay_on)
    extra = {"fused": True} if fused else {}
    if config.name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=config.betas, eps=config.eps, weight_decay=config.weight_decay,
                                 **extra)
    if config.name == "sgd":
        # torch SGD's weight_decay is an L2 term added to the gradient (the fine-tuning recipe uses 0).
        return torch.optim.SGD(groups, lr=lr, momentum=config.momentum, weight_decay=config.weight_decay, **extra)
    raise ValueError(f"unknown optimizer {config.name!r}; expected adamw or sgd")


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
