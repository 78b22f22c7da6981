"""One optimiser step, small and testable alone (STYLE.md section 5).

`train_step(state, batch, spec, loss_of)` runs the forward/backward passes of a step's micro-batches
(the objective's `loss_of(model, micro_batch)` gives each loss), clips, and updates, or skips a
non-finite step without touching the optimiser state.  The non-finite guard (train/guard.py) then
accounts for the skip; the trainer (train/trainer.py) composes the two.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.device import autocast
from vitkit.train.optim import set_lr
from vitkit.train.state import TrainState

LossOf = Callable[[nn.Module, Any], tuple[Tensor, dict[str, Tensor]]]


@dataclass(frozen=True)
class StepSpec:
    """Per-step constants of `train_step`."""

    lr: float  # learning rate of this step (schedule applied)
    clip_norm: float  # 0 = no clipping (the norm is still computed, for the finiteness check)
    loss: str = "softmax"  # "softmax" | "sigmoid" (the classification objective's loss)
    autocast_dtype: torch.dtype | None = None  # bf16 autocast, or None for full precision
    deferred: bool = False  # skip non-finite steps on the device (fused optimiser's found_inf): no host sync
    patch_dropout: float | None = None  # PatchDropout rate of this step (None: the model's own)
    ema_decay: float | None = None  # Polyak decay of this step (None: the EMA's own)


def loss_fn(logits: Tensor, targets: Tensor, kind: str) -> Tensor:
    """Mean over the batch of softmax cross-entropy with soft targets, or of summed sigmoid CE.

    Sigmoid CE sums the K binary losses per image, as big_vision's `sigmoid_xent` (i21k recipe).
    """
    logits = logits.float()
    if kind == "sigmoid":
        return F.binary_cross_entropy_with_logits(logits, targets, reduction="none").sum(-1).mean()
    return -(targets * F.log_softmax(logits, dim=-1)).sum(-1).mean()


def classification_loss(spec: StepSpec) -> LossOf:
    """Cross-entropy of `model(images)` against soft targets, for a (images, targets) micro-batch."""

    def loss_of(model: nn.Module, micro: tuple[Tensor, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        images, targets = micro
        logits = model(images) if spec.patch_dropout is None else model(images, patch_dropout=spec.patch_dropout)
        return loss_fn(logits, targets, spec.loss), {}

    return loss_of


def train_step(state: TrainState, batch: list[Any], spec: StepSpec, loss_of: LossOf | None = None) -> dict[str, Any]:
    """One optimiser step over `batch`, a list of micro-batches (by default (images, soft targets) pairs).

    Gradients of the micro-batches are averaged (so 4 x B accumulates to exactly the gradient of one 4B
    batch); DDP reduces only on the last one.  A non-finite loss or gradient norm skips the update (the
    optimiser state is untouched).  Returns 0-d tensors "loss", "grad_norm" and the objective's metrics
    (no host sync), "lr", and "skipped": a bool, or with `spec.deferred` a 0-d bool tensor (the skip
    itself happened on the device).  The caller accounts for skips (train/guard.py).  A micro-batch left empty
    by unreadable samples adds zero gradients and no loss, where its mean over no sample was NaN on every
    process.
    """
    model, optimizer = state.model, state.optimizer
    loss_of = loss_of or classification_loss(spec)
    set_lr(optimizer, spec.lr)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    total, extras, full = None, {}, 0
    for index, micro in enumerate(batch):
        last = index == len(batch) - 1
        sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        images = micro[0] if isinstance(micro, (tuple, list)) else micro
        with sync:
            if len(images):
                with autocast(images.device, spec.autocast_dtype):
                    loss, metrics = loss_of(model, micro)
                full += 1
            else:  # every sample of it was unreadable: no loss (a mean over none is NaN), zero gradients
                loss, metrics = sum(p.sum() for p in model.parameters()) * 0.0, {}
            (loss / len(batch)).backward()
        total = loss.detach().float() if total is None else total + loss.detach().float()
        for key, value in metrics.items():  # means over the micro-batches
            extras[key] = extras.get(key, 0) + value.detach().float() / len(batch)
    grad_norm = _clip(model, spec.clip_norm)
    mean_loss, bad = _over_processes(total / max(full, 1), grad_norm)
    skipped = _update(state, bad, spec)
    state.step += 1
    return {"loss": mean_loss, "grad_norm": grad_norm.detach(), "lr": spec.lr, "skipped": skipped, **extras}


def _clip(model: nn.Module, clip_norm: float) -> Tensor:
    params = [p for p in model.parameters() if p.grad is not None]
    norm = (
        torch.nn.utils.clip_grad_norm_(params, clip_norm)
        if clip_norm > 0
        else torch.nn.utils.get_total_norm([p.grad for p in params])
    )
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a DTensor


def _over_processes(loss: Tensor, grad_norm: Tensor) -> tuple[Tensor, Tensor]:
    """(the loss averaged over the processes, whether the step is skipped), the same on every process: the
    gradient norm is reduced over them (DDP/FSDP), but a loss is each one's own, and an infinite loss can come
    with finite gradients (cross-entropy of a class whose probability underflowed): one process alone had skipped
    the update and its replica drifted from the others'.  One small collective, on the device, with no host sync."""
    both = torch.stack([(~torch.isfinite(grad_norm)).float(), loss.to(grad_norm.device).float()])
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world > 1:  # a sum: one process's infinite or NaN loss makes it non-finite on every process
        dist.all_reduce(both, op=dist.ReduceOp.SUM)
    return both[1] / world, (both[0] > 0) | ~torch.isfinite(both[1])


def _update(state: TrainState, bad: Tensor, spec: StepSpec) -> bool | Tensor:
    """The optimiser (and EMA) update unless `bad`; returns the skipped flag."""
    optimizer = state.optimizer
    if spec.deferred:  # the fused kernel skips the update (and undoes its step count) when found_inf is 1
        optimizer.found_inf = bad.float()
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
        if state.ema is not None:
            state.ema.update(state.module, skip=bad, decay=spec.ema_decay)
        return bad
    if bool(bad):  # a host sync; free on the CPU, where there is no device to wait for
        optimizer.zero_grad(set_to_none=True)
        return True
    optimizer.step()
    if state.ema is not None:
        state.ema.update(state.module, decay=spec.ema_decay)
    return False
