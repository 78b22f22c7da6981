"""The random resized ("inception") crop of Szegedy et al. (2015) that the ViT paper's pipeline uses.

A box per image with area fraction U(scale) and aspect ratio log-uniform in `ratio`, falling back to a
centre crop; all boxes of a batch become affine maps resampled by one `grid_sample` per pyramid level
(data/transforms.py's `train_transform` calls it).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

_ATTEMPTS = 10  # inception-crop candidates per image before the centre-crop fallback (as torchvision)


def _uniform(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> Tensor:
    return torch.rand(shape, generator=generator, device=device)


def inception_crop(
    images: Tensor,
    size: int,
    generator: torch.Generator,
    *,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
    flip: float = 0.0,
) -> Tensor:
    """Random resized ("inception") crop of every image to (size, size), float 0..255 out.

    For each image, up to 10 candidate boxes with area fraction ~ U(scale) and aspect ratio w/h ~
    log-U(ratio) are drawn at once; the first that fits inside the image is used.  If none fits, the
    centre crop with the aspect ratio clamped to `ratio` is used (torchvision's rule).  The boxes are
    turned into per-image affine maps and all crops are resampled by one bilinear `grid_sample`.

    Bilinear sampling aliases when a box is shrunk by more than 2x (e.g. 224-px images trained at 32 px),
    so such boxes are sampled from an antialiased 2x / 4x / ... pyramid of the batch instead: one
    `grid_sample` per pyramid level in use.  The affine maps are in normalised coordinates, so they
    apply unchanged to every level.  With `flip` > 0 each crop is mirrored with that probability by
    negating its map's x scale (no extra pass over the pixels).
    """
    batch, _, height, width = images.shape
    x0, y0, crop_w, crop_h = _boxes(batch, height, width, generator, images.device, scale, ratio)
    theta = _affine_maps(x0, y0, crop_w, crop_h, height, width, generator, flip)
    grid = F.affine_grid(theta, [batch, images.shape[1], size, size], align_corners=False)
    return _resample(images, grid, torch.minimum(crop_w, crop_h) / size, size)


def _boxes(
    batch: int,
    height: int,
    width: int,
    generator: torch.Generator,
    device: torch.device,
    scale: tuple[float, float],
    ratio: tuple[float, float],
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(x0, y0, width, height) of each image's box, each (B,): the first of the candidates that fits, else the
    centre crop with the image's aspect ratio clamped into `ratio`."""
    draws = _uniform((batch, _ATTEMPTS, 2), generator, device)
    area = (scale[0] + (scale[1] - scale[0]) * draws[..., 0]) * (height * width)
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(log_low + (log_high - log_low) * draws[..., 1])
    crop_w, crop_h = torch.sqrt(area * aspect), torch.sqrt(area / aspect)  # (B, attempts)
    fits = (crop_w <= width) & (crop_h <= height)
    first = fits.to(torch.uint8).argmax(dim=1, keepdim=True)  # index of the first candidate that fits
    any_fit = fits.any(dim=1)
    crop_w, crop_h = crop_w.gather(1, first)[:, 0], crop_h.gather(1, first)[:, 0]
    # Fallback: centre crop of the whole image with its aspect ratio clamped into `ratio`.
    image_ratio = width / height
    fallback_w = (
        width if ratio[0] <= image_ratio <= ratio[1] else (height * ratio[1] if image_ratio > ratio[1] else width)
    )
    fallback_h = (
        height if ratio[0] <= image_ratio <= ratio[1] else (height if image_ratio > ratio[1] else width / ratio[0])
    )
    crop_w = torch.where(any_fit, crop_w, torch.full_like(crop_w, fallback_w))
    crop_h = torch.where(any_fit, crop_h, torch.full_like(crop_h, fallback_h))
    offsets = _uniform((batch, 2), generator, device)
    x0 = torch.where(any_fit, offsets[:, 0] * (width - crop_w), (width - crop_w) / 2)
    y0 = torch.where(any_fit, offsets[:, 1] * (height - crop_h), (height - crop_h) / 2)
    return x0, y0, crop_w, crop_h


def _affine_maps(
    x0: Tensor,
    y0: Tensor,
    crop_w: Tensor,
    crop_h: Tensor,
    height: int,
    width: int,
    generator: torch.Generator,
    flip: float,
) -> Tensor:
    """The (B, 2, 3) maps from output to normalised source coordinates, mirrored with probability `flip`."""
    batch, device = x0.shape[0], x0.device
    # Output coordinate u in (-1, 1) (align_corners=False) maps to source x = x0 + (u + 1) / 2 * crop_w,
    # i.e. normalised source coordinate (crop_w / W) * u + (2 x0 + crop_w) / W - 1.
    theta = torch.zeros(batch, 2, 3, device=device)
    mirror = torch.where(_uniform((batch,), generator, device) < flip, -1.0, 1.0) if flip > 0 else 1.0
    theta[:, 0, 0] = mirror * crop_w / width
    theta[:, 0, 2] = (2 * x0 + crop_w) / width - 1
    theta[:, 1, 1] = crop_h / height
    theta[:, 1, 2] = (2 * y0 + crop_h) / height - 1
    return theta


def _resample(images: Tensor, grid: Tensor, shrink: Tensor, size: int) -> Tensor:
    """Every crop sampled at `grid` (B, size, size, 2) from the pyramid level where its box, shrunk by
    `shrink` (B,), shrinks by less than 2x; float 0..255 out."""
    batch, channels, height, width = images.shape
    # Pyramid level k halves the image k times; pick the level where the box shrinks by less than 2x.
    levels = torch.floor(torch.log2(shrink.clamp_min(1.0))).long().clamp_(0, _max_level(height, width, size))
    source = images.float()
    if int(levels.max()) == 0:
        # A bilinear blend of pixels in 0..255 stays in 0..255: rounding is all a uint8 pipeline would add.
        return F.grid_sample(source, grid, mode="bilinear", padding_mode="border", align_corners=False).round_()
    out = torch.empty(batch, channels, size, size, device=images.device)
    for level in range(int(levels.max()) + 1):
        index = torch.nonzero(levels == level).flatten()
        if index.numel():
            scaled = (
                source[index]
                if level == 0
                else F.interpolate(
                    source[index],
                    size=(height >> level, width >> level),
                    mode="bilinear",
                    align_corners=False,
                    antialias=True,
                )
            )
            out[index] = F.grid_sample(scaled, grid[index], mode="bilinear", padding_mode="border", align_corners=False)
    return out.round_()


def _max_level(height: int, width: int, size: int) -> int:
    """Deepest pyramid level that still keeps the shorter side >= size (never below 1/8)."""
    level = 0
    while level < 3 and min(height, width) >> (level + 1) >= size:
        level += 1
    return level
