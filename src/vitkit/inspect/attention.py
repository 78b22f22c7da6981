"""Attention analyses of Sec. 4.5 / App. D.7: mean attention distance (Figure 7, right) and
attention rollout (Figure 6, Abnar & Zuidema 2020).

Both are pure functions of attention weights A (Eq. 6), as returned by
`VisionTransformer.forward_intermediates(x)["attnNN"]`, shape (B, k, T, T) with T = prefix + N tokens
in raster order; rows are queries and sum to 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def patch_centres(grid: tuple[int, int], patch_size: int) -> Tensor:
    """Pixel coordinates (row, col) of every patch centre in raster order, (N, 2) float64."""
    gh, gw = grid
    rows, cols = torch.meshgrid(
        torch.arange(gh, dtype=torch.float64), torch.arange(gw, dtype=torch.float64), indexing="ij"
    )
    centres = torch.stack([rows.reshape(-1), cols.reshape(-1)], dim=1)  # (gh, gw) x 2 -> (N, 2)
    return (centres + 0.5) * patch_size


def patch_distances(grid: tuple[int, int], patch_size: int) -> Tensor:
    """Euclidean distance in pixels between every pair of patch centres, (N, N) float64."""
    centres = patch_centres(grid, patch_size)
    return torch.cdist(centres, centres)


def mean_attention_distance(attn: Tensor, grid: tuple[int, int], patch_size: int, num_prefix: int) -> Tensor:
    """Mean attention distance of every head (App. D.7): the attention-weighted distance in pixels
    between a query patch's centre and the key patches' centres, averaged over query patches and images.

    Only patch tokens are used: the prefix ([class]) rows and columns are dropped and each query's
    weights over the patch keys are renormalised to sum to 1, so the number is a weighted mean of
    pixel distances (a query that attends only to itself gives 0, a uniform one the grid's mean
    pairwise distance).

    Args:
        attn: (B, k, T, T) attention weights with T = num_prefix + gh*gw.
        grid: (gh, gw) patch grid; patch_size: pixels per patch side (P, or the hybrid's total stride).
    Returns:
        (k,) float64 distances in pixels, one per head.
    """
    if attn.ndim != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"attention must be (B, k, T, T), got {tuple(attn.shape)}")
    tokens = num_prefix + grid[0] * grid[1]
    if attn.shape[-1] != tokens:
        raise ValueError(f"attention has {attn.shape[-1]} tokens, expected {num_prefix} + {grid[0]}x{grid[1]}")
    weights = attn[..., num_prefix:, num_prefix:].double()  # (B, k, N, N): patch queries x patch keys
    weights = weights / weights.sum(dim=-1, keepdim=True).clamp_min(1e-12)
    distance = patch_distances(grid, patch_size).to(weights.device)  # (N, N)
    per_query = (weights * distance).sum(dim=-1)  # (B, k, N): expected distance of each query
    return per_query.mean(dim=(0, 2))


def attention_rollout(attns: Sequence[Tensor]) -> Tensor:
    """Attention rollout (Abnar & Zuidema 2020), as used for Figure 6 (App. D.7).

    Per layer, average the heads, add the identity for the residual connection and renormalise the
    rows: A'_l = (mean_h A_l + I) / 2 (rows of A_l sum to 1).  Then multiply through the layers,
    later layers on the left: R = A'_L ... A'_2 A'_1.  Row t of R says how much each input token
    flows into output token t.

    Args:
        attns: L tensors (B, k, T, T) (or (k, T, T)), first layer first.
    Returns:
        (B, T, T) float64 (or (T, T)); every row sums to 1.
    """
    if not attns:
        raise ValueError("attention rollout needs at least one layer of attention weights")
    rollout = None
    for attn in attns:
        mixed = attn.double().mean(dim=-3)  # average the k heads: (..., k, T, T) -> (..., T, T)
        eye = torch.eye(mixed.shape[-1], dtype=mixed.dtype, device=mixed.device)
        mixed = mixed + eye  # the residual path of Eq. 2 carries each token to itself
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        rollout = mixed if rollout is None else mixed @ rollout
    return rollout


def rollout_map(rollout: Tensor, grid: tuple[int, int], num_prefix: int) -> Tensor:
    """The input-patch relevance map of the output representation, (B, gh, gw).

    For a [class]-token model this is the [class] row of the rollout restricted to patch columns; for
    a GAP model (no prefix) the mean of the patch rows, since y averages the patch tokens (Eq. 4).
    """
    patches = rollout[..., num_prefix:]  # (B, T, N): flow into every token from each input patch
    row = patches[..., 0, :] if num_prefix else patches.mean(dim=-2)
    return row.reshape(*row.shape[:-1], grid[0], grid[1])  # (B, N) -> (B, gh, gw)
