"""Closed-form regularised least squares to {-1, 1}^K targets: the paper's few-shot linear probe
(Sec. 4.1, "Metrics").

Derivation.  Features X (n, d), targets Y (n, K) with Y[i, c] = +1 if image i is of class c, else -1.
We fit an affine map, weights W (d, K) and bias b (K,), minimising

    L(W, b) = || X W + 1 b^T - Y ||_F^2 + lambda || W ||_F^2      (the bias is not penalised).

dL/db = 0 gives b = mean(Y) - mean(X) W, so with centred Xc = X - 1 mean(X), Yc = Y - 1 mean(Y)
the problem is plain ridge regression, whose normal equations are

    (Xc^T Xc + lambda I) W = Xc^T Yc.

With the thin SVD Xc = U S V^T (r = min(n, d) singular values s_i) this is

    W(lambda) = V diag(s_i / (s_i^2 + lambda)) U^T Yc,

the same solution as the normal equations (and as the dual form Xc^T (Xc Xc^T + lambda I)^-1 Yc)
for any lambda > 0, well defined when n < d, which is the few-shot case.  One SVD serves every
lambda of the grid, so choosing lambda is cheap.  The class of a test image x is argmax_c (x W + b)_c.
Everything is computed in float64.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


def pm1_targets(labels: Tensor, num_classes: int) -> Tensor:
    """{-1, 1}^K targets: +1 at the true class, -1 elsewhere, (n, K) float64."""
    targets = torch.full((labels.shape[0], num_classes), -1.0, dtype=torch.float64, device=labels.device)
    targets[torch.arange(labels.shape[0], device=labels.device), labels] = 1.0
    return targets


@dataclass(frozen=True)
class RidgePath:
    """The SVD of the centred features, from which W(lambda) follows for any lambda (module docstring)."""

    x_mean: Tensor  # (d,)
    y_mean: Tensor  # (K,)
    right: Tensor  # V, (d, r)
    singular: Tensor  # s, (r,)
    projected: Tensor  # U^T Yc, (r, K)

    def weights(self, l2: float) -> tuple[Tensor, Tensor]:
        """(W (d, K), b (K,)) for regularisation lambda = l2."""
        shrink = self.singular / (self.singular**2 + l2)  # s_i / (s_i^2 + lambda)
        weight = self.right @ (shrink[:, None] * self.projected)
        return weight, self.y_mean - self.x_mean @ weight

    def predict(self, features: Tensor, l2: float) -> Tensor:
        """Scores x W + b for (m, d) features, (m, K) float64."""
        weight, bias = self.weights(l2)
        return features.double() @ weight + bias


def ridge_path(features: Tensor, targets: Tensor) -> RidgePath:
    """Centre and decompose once; `RidgePath.weights(l2)` then solves for any lambda."""
    x = features.double()
    y = targets.double()
    x_mean, y_mean = x.mean(dim=0), y.mean(dim=0)
    left, singular, right_t = torch.linalg.svd(x - x_mean, full_matrices=False)  # Xc = U S V^T
    keep = singular > singular.max().clamp_min(1e-300) * 1e-12  # drop the null space (zero variance)
    left, singular, right = left[:, keep], singular[keep], right_t[keep].T
    return RidgePath(x_mean=x_mean, y_mean=y_mean, right=right, singular=singular, projected=left.T @ (y - y_mean))


def l2_grid(exponents: Sequence[int]) -> list[float]:
    """The regularisation candidates: powers of two 2^e."""
    return [2.0**e for e in exponents]
