"""RandAugment (Cubuk et al., 2020), batched: N rounds, each image picks one of 14 ops per round.

Images are float (B, C, H, W) holding integer pixel values 0..255 (square, as after the crop).  In a
round every image draws its own op and a random sign for the signed ops; the images that drew the
same op are processed together, and the five geometric ops (rotate, shear x/y, translate x/y) share
one `grid_sample` call.  Magnitude M is on the usual 0..10 scale (level m = M / 10; AugReg's 15 or 20
extrapolate).  Ranges at m = 1 follow the common TF / timm implementations: rotate 30 degrees, shear
0.3, translate 45 % of the side, enhance factors 1 +- 0.9, posterize to 4 bits, solarize all pixels.
Pixels uncovered by geometric ops are filled with grey 128, as in the TF implementation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

OPS = (
    "identity",
    "autocontrast",
    "equalize",
    "rotate",
    "solarize",
    "color",
    "posterize",
    "contrast",
    "brightness",
    "sharpness",
    "shear_x",
    "shear_y",
    "translate_x",
    "translate_y",
)
GEOMETRIC = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")
FILL = 128.0  # grey fill of uncovered pixels (TF autoaugment's `replace` value)


def _gray(x: Tensor) -> Tensor:
    """ITU-R 601-2 luma (Pillow's "L" conversion), (B, 1, H, W); grayscale input is returned as is."""
    if x.shape[1] == 1:
        return x
    r, g, b = x.unbind(1)
    return (0.299 * r + 0.587 * g + 0.114 * b).unsqueeze(1)


def _blend(base: Tensor, x: Tensor, factor: Tensor) -> Tensor:
    """PIL ImageEnhance: base + factor * (x - base), clipped and rounded; factor is per image (B,)."""
    return (base + factor.view(-1, 1, 1, 1) * (x - base)).clamp_(0, 255).round_()


def autocontrast(x: Tensor) -> Tensor:
    """Stretch each channel's min..max onto 0..255 with Pillow's table, int(i * scale + offset).

    Computed in float64 with Pillow's exact expression so results match ImageOps.autocontrast bit for bit;
    channels with min == max are unchanged.
    """
    low, high = x.amin(dim=(2, 3), keepdim=True).double(), x.amax(dim=(2, 3), keepdim=True).double()
    scale = 255.0 / (high - low).clamp_min(1)
    stretched = torch.floor(x.double() * scale + (-low * scale)).clamp_(0, 255).to(x.dtype)
    return torch.where(high > low, stretched, x)


def equalize(x: Tensor) -> Tensor:
    """Histogram equalisation per channel with Pillow's lookup table (ImageOps.equalize)."""
    batch, channels, height, width = x.shape
    values = x.reshape(batch * channels, height * width).long().clamp_(0, 255)
    hist = torch.zeros(batch * channels, 256, device=x.device, dtype=torch.long)
    hist.scatter_add_(1, values, torch.ones_like(values))
    # Pillow: step = (pixels - count of the last non-empty bin) // 255; lut[i] = (step // 2 + sum(hist[:i])) // step.
    last = 255 - (hist.flip(1) > 0).to(torch.uint8).argmax(dim=1, keepdim=True)
    step = (hist.sum(1, keepdim=True) - hist.gather(1, last)) // 255
    before = hist.cumsum(1) - hist
    lut = ((step // 2 + before) // step.clamp_min(1)).clamp_(max=255)
    lut = torch.where(step > 0, lut, torch.arange(256, device=x.device).expand_as(lut))
    return lut.gather(1, values).reshape(x.shape).to(x.dtype)


def solarize(x: Tensor, level: float) -> Tensor:
    """Invert pixels >= threshold, threshold = 256 (1 - m): stronger with magnitude."""
    threshold = 256.0 * (1.0 - level)
    return torch.where(x >= threshold, 255.0 - x, x)


def posterize(x: Tensor, level: float) -> Tensor:
    """Keep the top 8 - round(4 m) bits (at least 1)."""
    bits = min(8, max(1, 8 - round(4 * level)))
    quantum = 2.0 ** (8 - bits)
    return torch.floor(x / quantum) * quantum


def sharpness(x: Tensor, factor: Tensor) -> Tensor:
    """PIL ImageEnhance.Sharpness: blend with the SMOOTH-filtered image (kernel 1 1 1 / 1 5 1 / 1 1 1, / 13).

    As in PIL the one-pixel border keeps its original values in the smoothed image.
    """
    channels = x.shape[1]
    kernel = torch.ones(3, 3, device=x.device, dtype=x.dtype)
    kernel[1, 1] = 5.0
    kernel = (kernel / 13.0).expand(channels, 1, 3, 3)
    smooth = x.clone()
    smooth[..., 1:-1, 1:-1] = F.conv2d(x, kernel, groups=channels).round_()
    return _blend(smooth, x, factor)


def _affine(x: Tensor, theta: Tensor) -> Tensor:
    """Resample with per-image affine maps (normalised coordinates), filling uncovered pixels with FILL."""
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    out = F.grid_sample(x - FILL, grid, mode="bilinear", padding_mode="zeros", align_corners=False) + FILL
    return out.clamp_(0, 255).round_()


def _geometric_theta(ops: list[str], which: Tensor, signs: Tensor, level: float) -> Tensor:
    """Per-image 2x3 maps from output to source coordinates for the geometric op each image drew."""
    count = which.shape[0]
    theta = torch.zeros(count, 2, 3, device=signs.device)
    theta[:, 0, 0] = theta[:, 1, 1] = 1.0
    for k, name in enumerate(ops):
        hit = which == k
        amount = signs * level
        if name == "rotate":
            angle = amount * math.radians(30.0)
            cos, sin = torch.cos(angle), torch.sin(angle)
            theta[:, 0, 0] = torch.where(hit, cos, theta[:, 0, 0])
            theta[:, 0, 1] = torch.where(hit, -sin, theta[:, 0, 1])
            theta[:, 1, 0] = torch.where(hit, sin, theta[:, 1, 0])
            theta[:, 1, 1] = torch.where(hit, cos, theta[:, 1, 1])
        elif name == "shear_x":  # x_src = x + s y
            theta[:, 0, 1] = torch.where(hit, 0.3 * amount, theta[:, 0, 1])
        elif name == "shear_y":
            theta[:, 1, 0] = torch.where(hit, 0.3 * amount, theta[:, 1, 0])
        elif name == "translate_x":  # 45 % of the side = 0.9 in normalised [-1, 1] units
            theta[:, 0, 2] = torch.where(hit, 0.9 * amount, theta[:, 0, 2])
        elif name == "translate_y":
            theta[:, 1, 2] = torch.where(hit, 0.9 * amount, theta[:, 1, 2])
    return theta


def _pixel_op(name: str, x: Tensor, signs: Tensor, level: float) -> Tensor:
    """The non-geometric ops on the images that drew `name`; `signs` (B,) are +-1."""
    factor = (1.0 + 0.9 * level * signs).clamp_min(0.0)  # enhance factor for color/contrast/brightness/sharpness
    if name == "autocontrast":
        return autocontrast(x)
    if name == "equalize":
        return equalize(x)
    if name == "solarize":
        return solarize(x, level)
    if name == "posterize":
        return posterize(x, level)
    if name == "color":
        return _blend(_gray(x), x, factor)
    if name == "contrast":
        return _blend(_gray(x).mean(dim=(1, 2, 3), keepdim=True), x, factor)
    if name == "brightness":
        return _blend(torch.zeros_like(x), x, factor)
    if name == "sharpness":
        return sharpness(x, factor)
    return x  # identity


def rand_augment(
    x: Tensor, num_ops: int, magnitude: float, generator: torch.Generator, ops: tuple[str, ...] = OPS
) -> Tensor:
    """Apply `num_ops` rounds of RandAugment to float pixels (B, C, H, W) in 0..255; returns a new tensor."""
    unknown = set(ops) - set(OPS)
    if unknown:
        raise ValueError(f"unknown RandAugment ops {sorted(unknown)}; known: {OPS}")
    level = magnitude / 10.0
    geometric = [name for name in ops if name in GEOMETRIC]
    x = x.clone()
    for _ in range(num_ops):
        choice = torch.randint(0, len(ops), (x.shape[0],), generator=generator, device=x.device)
        signs = torch.where(torch.rand(x.shape[0], generator=generator, device=x.device) < 0.5, -1.0, 1.0)
        for k, name in enumerate(ops):
            if name in GEOMETRIC or name == "identity":
                continue
            index = torch.nonzero(choice == k).flatten()
            if index.numel():
                x[index] = _pixel_op(name, x[index], signs[index], level)
        if geometric:
            geo_ids = torch.tensor([ops.index(name) for name in geometric], device=x.device)
            index = torch.nonzero(torch.isin(choice, geo_ids)).flatten()
            if index.numel():
                which = torch.searchsorted(geo_ids, choice[index])  # position in `geometric` (ids are ascending)
                x[index] = _affine(x[index], _geometric_theta(geometric, which, signs[index], level))
    return x
