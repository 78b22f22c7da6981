"""PNG figures (matplotlib, Agg backend, no display): Figure 6 and Figure 7 left/center/right.
Every figure is written atomically (vitkit.eval.plots.save_figure)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never open a window

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor  # noqa: E402

from vitkit.eval.plots import save_figure  # noqa: E402


def _tile(image: np.ndarray) -> np.ndarray:
    """Scale an (H, W) or (H, W, 3) array to [0, 1] for display (a constant tile becomes grey)."""
    low, high = float(image.min()), float(image.max())
    return np.full_like(image, 0.5) if high - low < 1e-12 else (image - low) / (high - low)


def mosaic(tiles: np.ndarray, columns: int, gap: int = 1, fill: float = np.nan) -> np.ndarray:
    """(n, h, w[, 3]) tiles -> one (rows*(h+gap)-gap, columns*(w+gap)-gap[, 3]) image, row-major."""
    count, height, width = tiles.shape[:3]
    rows = max(1, math.ceil(count / columns))
    canvas = np.full((rows * (height + gap) - gap, columns * (width + gap) - gap, *tiles.shape[3:]), fill)
    for index in range(count):
        top, left = (index // columns) * (height + gap), (index % columns) * (width + gap)
        canvas[top : top + height, left : left + width] = tiles[index]
    return canvas


def plot_filters(components: Tensor, explained: Tensor, path: Path, columns: int = 7) -> Path:
    """Figure 7 left: principal components of the patch-embedding filters as RGB tiles, by
    decreasing variance, row by row (first channel as grayscale when the model does not take RGB)."""
    array = components.float().cpu().numpy()  # (n, C, P, P)
    rgb = array.shape[1] == 3
    tiles = np.stack([_tile(a.transpose(1, 2, 0) if rgb else a[0]) for a in array])  # (n, P, P[, 3])
    columns = min(columns, len(tiles))
    image = mosaic(tiles, columns, fill=1.0)
    rows = math.ceil(len(tiles) / columns)
    figure, ax = plt.subplots(figsize=(1.0 * columns + 0.4, 1.0 * rows + 0.6))
    ax.imshow(image, cmap=None if rgb else "gray", interpolation="nearest", vmin=0, vmax=1)
    ax.axis("off")
    share = 100 * float(explained.sum())
    ax.set_title(f"Embedding filters: top {len(tiles)} principal components ({share:.0f}% of variance)", fontsize=8)
    return save_figure(figure, path)


def plot_position_similarity(similarity: Tensor, path: Path) -> Path:
    """Figure 7 center: tile (r, c) shows the cosine similarity of patch (r, c)'s position embedding
    with every patch's."""
    gh, gw = similarity.shape[:2]
    tiles = similarity.float().cpu().numpy().reshape(gh * gw, gh, gw)
    image = mosaic(tiles, gw)
    figure, ax = plt.subplots(figsize=(0.32 * gw * gw / max(gw, 4) + 2.0, 0.32 * gh * gh / max(gh, 4) + 1.2))
    cmap = plt.get_cmap("viridis").with_extremes(bad="white")  # white gaps between tiles
    shown = ax.imshow(np.ma.masked_invalid(image), cmap=cmap, vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xticks([c * (gw + 1) + (gw - 1) / 2 for c in range(gw)])
    ax.set_xticklabels([str(c + 1) for c in range(gw)], fontsize=6)
    ax.set_yticks([r * (gh + 1) + (gh - 1) / 2 for r in range(gh)])
    ax.set_yticklabels([str(r + 1) for r in range(gh)], fontsize=6)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_xlabel("Input patch column", fontsize=8)
    ax.set_ylabel("Input patch row", fontsize=8)
    figure.colorbar(shown, ax=ax, shrink=0.7, label="Cosine similarity")
    ax.set_title("Position embedding similarity", fontsize=9)
    return save_figure(figure, path)


def plot_attention_distance(distances: Tensor, path: Path, image_size: int) -> Path:
    """Figure 7 right: one dot per head at every layer, mean attention distance in pixels vs depth."""
    layers, heads = distances.shape
    figure, ax = plt.subplots(figsize=(4.2, 3.4))
    colours = plt.cm.tab20(np.linspace(0, 1, max(heads, 2)))
    for head in range(heads):
        ax.scatter(
            np.arange(layers), distances[:, head].cpu().numpy(), s=12, color=colours[head], label=f"Head {head + 1}"
        )
    ax.set_xlabel("Network depth (layer)")
    ax.set_ylabel("Mean attention distance (pixels)")
    ax.set_ylim(0, image_size)
    ax.set_xticks(range(layers))
    ax.set_xticklabels([str(i + 1) for i in range(layers)], fontsize=7)
    if heads <= 16:
        ax.legend(fontsize=5, ncol=2, loc="lower right", markerscale=0.7)
    ax.set_title("Size of attended area by head and depth", fontsize=9)
    return save_figure(figure, path)


def overlay(image: Tensor, relevance: Tensor) -> np.ndarray:
    """Image (C, H, W) uint8 multiplied by the rollout map upsampled to its size and scaled to [0, 1]."""
    height, width = image.shape[-2:]
    heat = F.interpolate(relevance[None, None].float(), size=(height, width), mode="bilinear", align_corners=False)[
        0, 0
    ]
    heat = (heat - heat.min()) / (heat.max() - heat.min()).clamp_min(1e-12)
    picture = image.float() / 255.0
    picture = picture.expand(3, -1, -1) if picture.shape[0] == 1 else picture[:3]
    return (picture * heat).permute(1, 2, 0).cpu().numpy()  # (C, H, W) -> (H, W, C)


def plot_rollout(images: Sequence[Tensor], maps: Tensor, path: Path) -> Path:
    """Figure 6: each input next to the input masked by its attention-rollout relevance."""
    count = len(images)
    figure, axes = plt.subplots(count, 2, figsize=(3.2, 1.6 * count), squeeze=False)
    for index, image in enumerate(images):
        picture = image.float() / 255.0
        picture = picture.expand(3, -1, -1) if picture.shape[0] == 1 else picture[:3]
        axes[index, 0].imshow(picture.permute(1, 2, 0).cpu().numpy())
        axes[index, 1].imshow(overlay(image, maps[index]))
        for ax in axes[index]:
            ax.axis("off")
    axes[0, 0].set_title("Input", fontsize=8)
    axes[0, 1].set_title("Attention", fontsize=8)
    return save_figure(figure, path)


def relevance_maps(maps: Tensor) -> list[list[float]]:
    """Rollout maps as nested lists scaled to sum to 1 each (for the JSON next to the figure)."""
    flat = maps.flatten(1).double()
    flat = flat / flat.sum(dim=1, keepdim=True).clamp_min(1e-300)
    return [row.reshape(maps.shape[1:]).tolist() for row in flat]
