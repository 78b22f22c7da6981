"""Embedding analyses of Sec. 4.5: principal components of the patch-embedding filters (Figure 7,
left) and cosine similarity of position embeddings (Figure 7, center).  Pure tensor functions."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class FilterPCA:
    """PCA of the D linear-embedding filters E (Eq. 1), each a C x P x P patch of pixel weights."""

    components: Tensor  # (n, C, P, P): principal axes in pixel space, unit norm, by decreasing variance
    explained_variance_ratio: Tensor  # (n,): share of the filters' variance along each axis
    mean: Tensor  # (C, P, P): the mean filter, removed before the decomposition
    scores: Tensor  # (D, n): each filter's coordinates along the axes

    def reconstruct(self) -> Tensor:
        """mean + scores @ components, (D, C, P, P): the filters themselves when n = rank."""
        flat = self.scores @ self.components.flatten(1)  # (D, n) @ (n, C*P*P)
        return flat.reshape(-1, *self.components.shape[1:]) + self.mean


def filter_pca(weight: Tensor, num_components: int = 28) -> FilterPCA:
    """Top principal components of the patch-embedding filters (Figure 7 left shows 28 of them).

    Args:
        weight: (D, C, P, P), the `patch_embed.proj` convolution kernel (one filter per output channel).
        num_components: how many to keep (capped at min(D, C*P*P)).
    """
    if weight.ndim != 4:
        raise ValueError(f"patch-embedding filters must be (D, C, P, P), got {tuple(weight.shape)}")
    flat = weight.detach().double().flatten(1)  # (D, C*P*P): the filters are the samples
    mean = flat.mean(dim=0)
    centred = flat - mean
    _, singular, axes = torch.linalg.svd(centred, full_matrices=False)  # centred = U S V^T, axes = V^T
    count = min(num_components, axes.shape[0])
    variance = singular**2
    ratio = variance / variance.sum().clamp_min(1e-300)
    components = axes[:count]  # (n, C*P*P)
    return FilterPCA(
        components=components.reshape(count, *weight.shape[1:]),
        explained_variance_ratio=ratio[:count],
        mean=mean.reshape(weight.shape[1:]),
        scores=centred @ components.T,  # (D, n)
    )


def position_similarity(table: Tensor, grid: tuple[int, int]) -> Tensor:
    """Cosine similarity of each patch's position embedding with every other one (Figure 7, center).

    Args:
        table: (gh*gw, D) position embeddings of the patches in raster order (no prefix rows).
    Returns:
        (gh, gw, gh, gw) float64: [r, c] is the tile of patch (r, c), similarities to all patches.
    """
    gh, gw = grid
    if table.ndim != 2 or table.shape[0] != gh * gw:
        raise ValueError(f"position table must be ({gh}*{gw}, D), got {tuple(table.shape)}")
    unit = table.detach().double()
    unit = unit / unit.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return (unit @ unit.T).reshape(gh, gw, gh, gw)  # (N, N) -> (gh, gw, gh, gw)
