"""One optimiser step and one evaluation pass, each small and testable alone (STYLE.md section 5).

`train_step(state, batch, spec)` runs the forward/backward passes of a step's micro-batches,
clips, and updates (or skips a non-finite step); `evaluate(model, data, ...)` returns loss, top-1
and top-5 on a split.  `vitkit.train.loop.train` composes them.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.data import loader as batches
from vitkit.data.sources import ImageSet
from vitkit.data.transforms import eval_transform
from vitkit.train import distributed
from vitkit.train.optim import set_lr
from vitkit.train.state import TrainState


# ----------------------------------------------------------------------------------- one step
@dataclass(frozen=True)
class StepSpec:
    """Per-step constants of `train_step`."""

    lr: float  # learning rate of this step (schedule applied)
    clip_norm: float  # 0 = no clipping (the norm is still computed, for the finiteness check)
    loss: str  # "softmax" | "sigmoid"
    autocast_dtype: torch.dtype | None  # bf16 autocast, or None for full precision
    deferred: bool = False  # skip non-finite steps on the device (fused optimiser's found_inf): no host sync


def loss_fn(logits: Tensor, targets: Tensor, kind: str) -> Tensor:
    """Mean over the batch of softmax cross-entropy with soft targets, or of summed sigmoid CE.

    Sigmoid CE sums the K binary losses per image, as big_vision's `sigmoid_xent` (i21k recipe).
    """
    logits = logits.float()
    if kind == "sigmoid":
        return F.binary_cross_entropy_with_logits(logits, targets, reduction="none").sum(-1).mean()
    return -(targets * F.log_softmax(logits, dim=-1)).sum(-1).mean()


def train_step(state: TrainState, batch: list[tuple[Tensor, Tensor]], spec: StepSpec) -> dict[str, Any]:
    """One optimiser step over `batch`: a list of micro-batches (float images (B, C, H, W), soft targets (B, K)).

    Gradients of the micro-batches are averaged (so 4 x B accumulates to exactly the gradient of
    one 4B batch); DDP reduces only on the last one.  A non-finite loss or gradient norm skips the
    update (the optimiser state is untouched).  Returns 0-d tensors for "loss" and "grad_norm" (no
    host sync; read them at log intervals), "lr", and "skipped": a bool, or with `spec.deferred` a
    0-d bool tensor that the caller reads later (the skip itself happens on the device; the
    caller then also keeps `state.nan_streak` / `skipped_steps`).
    """
    model, optimizer = state.model, state.optimizer
    set_lr(optimizer, spec.lr)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    loss_total = None
    for index, (images, targets) in enumerate(batch):
        last = index == len(batch) - 1
        sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        autocast = (torch.autocast(images.device.type, dtype=spec.autocast_dtype) if spec.autocast_dtype
                    else contextlib.nullcontext())
        with sync:
            with autocast:
                logits = model(images)
            loss = loss_fn(logits, targets, spec.loss)
            (loss / len(batch)).backward()
        loss_total = loss.detach() if loss_total is None else loss_total + loss.detach()
    mean_loss = loss_total / len(batch)
    params = [p for p in model.parameters() if p.grad is not None]
    if spec.clip_norm > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(params, spec.clip_norm)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
        grad_norm = grad_norm.full_tensor()
    # The gradient norm is reduced over processes (DDP/FSDP), so every process takes the same decision.
    bad = ~torch.isfinite(grad_norm + mean_loss.to(grad_norm.device) * 0)
    if spec.deferred:  # the fused kernel skips the update (and undoes its step count) when found_inf is 1
        optimizer.found_inf = bad.float()
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
        if state.ema is not None:
            state.ema.update(state.module, skip=bad)
        state.step += 1
        return {"loss": mean_loss, "grad_norm": grad_norm.detach(), "lr": spec.lr, "skipped": bad}
    finite = not bool(bad)  # a host sync; free on the CPU, where there is no device to wait for
    if finite:
        optimizer.step()
        if state.ema is not None:
            state.ema.update(state.module)
        state.nan_streak = 0
    else:
        optimizer.zero_grad(set_to_none=True)
        state.nan_streak += 1
        state.skipped_steps += 1
    state.step += 1
    return {"loss": mean_loss, "grad_norm": grad_norm.detach(), "lr": spec.lr, "skipped": not finite}


# ---------------------------------------------------------------------------------- evaluation
@torch.no_grad()
def evaluate(model: nn.Module, data: ImageSet, *, size: int, mean: tuple[float, ...], std: tuple[float, ...],
             channels: int, batch_size: int = 512, device: torch.device | str = "cpu", loss: str = "softmax",
             autocast_dtype: torch.dtype | None = None, rank: int = 0, world: int = 1,
             workers: int = 0) -> dict[str, float]:
    """Loss, top-1 and top-5 accuracy of `model` on `data` (uint8 images resized/normalised as in training).

    With several processes each evaluates a strided share and the sums are all-reduced.
    """
    device = torch.device(device)
    was_training = model.training
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=device)  # loss, top-1 hits, top-5 hits, count
    for images, labels in batches.eval_batches(data, batch_size, device, rank=rank, world=world, workers=workers):
        inputs = eval_transform(images, size, mean, std, channels)
        autocast = (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype
                    else contextlib.nullcontext())
        with autocast:
            logits = model(inputs)
        logits = logits.float()
        k = min(5, logits.shape[1])
        targets = F.one_hot(labels, logits.shape[1]).float()
        per_image = (F.binary_cross_entropy_with_logits(logits, targets, reduction="none").sum(-1) if loss == "sigmoid"
                     else F.cross_entropy(logits, labels, reduction="none"))
        top = logits.topk(k, dim=1).indices  # (B, k)
        sums += torch.stack([per_image.sum().double(), (top[:, 0] == labels).sum().double(),
                             (top == labels[:, None]).any(1).sum().double(),
                             torch.tensor(float(len(labels)), dtype=torch.float64, device=device)])
    distributed.all_reduce_sum(sums)
    model.train(was_training)
    loss_sum, top1, top5, count = sums.tolist()
    if count == 0:
        raise ValueError("evaluation split is empty")
    return {"loss": loss_sum / count, "top1": top1 / count, "top5": top5 / count, "count": int(count)}
