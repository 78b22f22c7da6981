"""torch.optim.Muon with its Newton-Schulz iteration batched over the matrices of one shape.

torch.optim.Muon orthogonalises each matrix on its own, in bf16.  A small ViT's encoder is many small
matrices of a few shapes (small-28px: 16 matrices of 4 shapes), and on a 2-core CPU the per-matrix loop is
bound by per-call overhead: 8.5 ms a step for small-28px, against ~18 ms for the whole rest of a step with
dropped patches.  StackedMuon keeps torch's class (its arguments, checks, state and state dict: the same
"momentum_buffer" per parameter) and its update rule (Nesterov momentum, the quintic iteration with torch's
coefficients on the Frobenius-normalised update, the learning-rate adjustment, decoupled weight decay), and
runs one batched iteration per shape.  The iteration's type follows the matrix size (`iteration_dtype`): at
small-28px's 64-wide matrices fp32 is the faster type on this CPU (~3 ms a step, bf16 ~3-4.8 ms); at
small-32px's 192-576-wide ones bf16 is (per shape, 6 matrices: 9.1 against 17.7 ms at 576x192, 5.0 against
8.7 ms at 192x192), so matrices whose smaller side is >= 128 run in bf16, as torch's own loop does, and so does
everything on CUDA -- but only where bf16 is native: a CPU without it (AVX2) emulates bf16 matmuls 10-20x slower
than fp32 (a 2-core AVX2 host spent ~3 s a step in them), so there every iteration runs in fp32.
`benchmarks/muon_step.py` times both optimisers on a recipe's matrices;
`benchmarks/step_phases.py SOURCE --set optim.name=muon` times the whole training step.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from vitkit.device import native_bf16

BF16_FROM = 128  # smaller side from which the iteration runs in bf16 (faster there, slower below, on CPU)


def iteration_dtype(stack: Tensor) -> torch.dtype:
    """bf16 where the device multiplies it natively, on CUDA and, on a CPU, for matrices whose smaller side is
    >= BF16_FROM; fp32 otherwise."""
    if not native_bf16(stack.device):
        return torch.float32
    if stack.is_cuda or min(stack.shape[-2:]) >= BF16_FROM:
        return torch.bfloat16
    return torch.float32


def orthogonalise(stack: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float) -> Tensor:
    """The quintic Newton-Schulz iteration of torch.optim.Muon on a (N, A, B) stack of matrices."""
    a, b, c = coefficients
    wide = stack.size(-2) <= stack.size(-1)
    x = (stack if wide else stack.mT).to(iteration_dtype(stack))
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x if wide else x.mT


def adjusted_lr(lr: float, rule: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's per-matrix learning rate ("original": sqrt(max(1, A/B)); "match_rms_adamw")."""
    rows, cols = shape[:2]
    if rule == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr * math.sqrt(max(1.0, rows / cols))


class StackedMuon(torch.optim.Muon):
    """torch.optim.Muon, one orthogonalisation per matrix shape instead of one per matrix."""

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params: list[Tensor] = []
            grads: list[Tensor] = []
            buffers: list[Tensor] = []
            self._init_group(group, params, grads, buffers)
            by_shape: dict[torch.Size, list[int]] = {}
            for index, param in enumerate(params):
                by_shape.setdefault(param.shape, []).append(index)
            for shape, indices in by_shape.items():
                self._update(
                    group,
                    shape,
                    [params[i] for i in indices],
                    [grads[i] for i in indices],
                    [buffers[i] for i in indices],
                )
        return loss

    def _update(
        self, group: dict, shape: torch.Size, params: list[Tensor], grads: list[Tensor], buffers: list[Tensor]
    ) -> None:
        momentum, lr = group["momentum"], float(group["lr"])
        torch._foreach_lerp_(buffers, grads, 1 - momentum)
        updates = torch._foreach_lerp(grads, buffers, momentum) if group["nesterov"] else buffers
        ortho = orthogonalise(torch.stack(updates), group["ns_coefficients"], group["ns_steps"], group["eps"])
        torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
        torch._foreach_add_(
            params,
            [o.to(p.dtype) for o, p in zip(ortho.unbind(0), params)],
            alpha=-adjusted_lr(lr, group["adjust_lr_fn"], shape),
        )
