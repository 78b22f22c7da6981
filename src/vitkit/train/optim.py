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

Beyond the paper, `name="muon"` trains the encoder blocks' weight matrices with Muon (torch.optim.Muon's
rule, batched: train/muon.py; momentum 0.95, Nesterov, the update orthogonalised; Jordan et al. 2024)
and every other parameter (patch embedding, position embeddings, norms, biases, head) with AdamW.  Muon
scales its update to AdamW's RMS ("match_rms_adamw"), so one learning rate and one weight decay serve both;
`muon_lr_scale` sets the matrices' learning rate apart (a factor on the schedule's lr).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from vitkit.train.config import OptimConfig
from vitkit.train.muon import StackedMuon

# Muon's own momentum (Jordan et al. 2024), Nesterov, and its update scaled to AdamW's RMS (one lr for both)
MUON_OPTIONS = {"momentum": 0.95, "nesterov": True, "adjust_lr_fn": "match_rms_adamw"}


def is_kernel(name: str, param: torch.Tensor) -> bool:
    """Dense/conv weights (the tensors big_vision matches with `.*/kernel$`): ndim >= 2, not embeddings."""
    leaf = name.rsplit(".", 1)[-1]
    return param.ndim >= 2 and leaf == "weight"


def is_hidden_matrix(name: str, param: torch.Tensor) -> bool:
    """A 2-D weight inside a Transformer encoder block (attention qkv/proj, MLP fc1/fc2): what Muon trains."""
    return param.ndim == 2 and ".blocks." in f".{name}" and name.endswith(".weight")


def param_groups(
    model: nn.Module,
    weight_decay: float,
    decay_on: str,
    keep: Callable[[str, torch.Tensor], bool] = lambda name, param: True,
) -> list[dict]:
    """Two groups of the trainable parameters that `keep` accepts: decayed and not decayed (empty groups dropped)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad or not keep(name, param):
            continue
        (decay if decay_on == "all" or is_kernel(name, param) else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "name": "decay"},
        {"params": no_decay, "weight_decay": 0.0, "name": "no_decay"},
    ]
    return [g for g in groups if g["params"]]


class OptimizerSet:
    """Several torch optimisers over disjoint parameters, stepped, zeroed and saved as one."""

    def __init__(self, parts: list[torch.optim.Optimizer]) -> None:
        self.parts = parts

    @property
    def param_groups(self) -> list[dict]:
        return [group for part in self.parts for group in part.param_groups]

    def step(self) -> None:
        for part in self.parts:
            part.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state: dict) -> None:
        parts = state.get("parts") if isinstance(state, dict) else None
        if not isinstance(parts, list) or len(parts) != len(self.parts):
            raise ValueError(
                f"the checkpoint's optimiser state is not that of {len(self.parts)} optimisers "
                "(was it saved with another optim.name?)"
            )
        for part, saved in zip(self.parts, parts):
            part.load_state_dict(saved)


def build_optimizer(
    model: nn.Module, config: OptimConfig, lr: float, fused: bool = False
) -> torch.optim.Optimizer | OptimizerSet:
    """AdamW, SGD-momentum or Muon + AdamW over `model`'s trainable parameters with peak learning rate `lr`.

    `fused=True` uses the fused kernels, which can skip a step on the device (`found_inf`); Muon has none.
    """
    if config.name == "muon":
        return _muon(model, config, lr, fused)
    groups = param_groups(model, config.weight_decay, config.decay_on)
    if config.name == "adamw":
        return _adamw(groups, config, lr, fused)
    if config.name == "sgd":
        # torch SGD's weight_decay is an L2 term added to the gradient (the fine-tuning recipe uses 0).
        return torch.optim.SGD(
            groups,
            lr=lr,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
            **({"fused": True} if fused else {}),
        )
    raise ValueError(f"unknown optimizer {config.name!r}; expected adamw, sgd or muon")


def _muon(model: nn.Module, config: OptimConfig, lr: float, fused: bool) -> OptimizerSet:
    matrices = [
        param for name, param in model.named_parameters() if param.requires_grad and is_hidden_matrix(name, param)
    ]
    if not matrices:
        raise ValueError("optim.name='muon' found no Transformer encoder matrices to train (a ResNet?); use adamw")
    scale = config.muon_lr_scale
    muon = StackedMuon(
        [{"params": matrices, "lr_scale": scale}], lr=lr * scale, weight_decay=config.weight_decay, **MUON_OPTIONS
    )
    rest = param_groups(
        model, config.weight_decay, config.decay_on, keep=lambda name, param: not is_hidden_matrix(name, param)
    )
    return OptimizerSet([muon, _adamw(rest, config, lr, fused)])


def _adamw(groups: list[dict], config: OptimConfig, lr: float, fused: bool) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        groups,
        lr=lr,
        betas=config.betas,
        eps=config.eps,
        weight_decay=config.weight_decay,
        **({"fused": True} if fused else {}),
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every group at `lr`, times the group's own "lr_scale" where it has one (Muon's matrices)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
