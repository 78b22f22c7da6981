"""Batched preprocessing and augmentation on whatever device the batch lives on.

Images arrive as uint8 (B, C, H, W) and leave as float32 normalised `(x / 255 - mean) / std`
(the official mean = std = 0.5, i.e. x / 127.5 - 1).  Every random number comes from the caller's
`torch.Generator` (on the batch's device), so an augmented batch is a pure function of
(images, labels, generator state): runs are reproducible and resume exactly.

train_transform = crop (inception / pad / none) -> RandAugment -> flip -> normalise -> expand
channels -> random erasing (with the inception crop the flip is folded into the crop's affine map, before
RandAugment: the same distribution, since every RandAugment op is mirror-symmetric in law, and two
passes cheaper), and labels -> one-hot -> label smoothing -> Mixup or CutMix.  The inception crop is the
random resized crop of Szegedy et al. (2015) that the ViT paper's pipeline uses: area fraction
U(crop_scale), aspect ratio log-uniform in [3/4, 4/3], falling back to a centre crop; all crops of a
batch are sampled with one `grid_sample` call (data/inception_crop.py).  Between ops the pixels stay float
in 0..255 and are rounded after each resampling, as a uint8 pipeline would.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from vitkit.data.inception_crop import inception_crop
from vitkit.data.randaugment import rand_augment

__all__ = [
    "AugmentConfig",
    "to_float",
    "resize",
    "eval_transform",
    "train_transform",
    "inception_crop",
    "pad_crop",
    "random_flip",
    "random_erase",
    "one_hot",
    "mixup",
    "cutmix",
    "sample_beta",
    "expand_channels",
    "describe_augment",
]

MEAN = (0.5, 0.5, 0.5)  # official ViT normalisation: x / 127.5 - 1
STD = (0.5, 0.5, 0.5)


@dataclass(frozen=True, kw_only=True)
class AugmentConfig:
    """Training augmentation; the defaults are the paper's (inception crop + flip)."""

    crop: Literal["none", "inception", "pad"] = "inception"  # inception = random resized crop (Szegedy et al. 2015)
    crop_scale: tuple[float, float] = (0.08, 1.0)  # area fraction range of the inception crop
    crop_ratio: tuple[float, float] = (3 / 4, 4 / 3)  # aspect-ratio range (log-uniform) of the inception crop
    pad: int = 4  # for crop="pad" (CIFAR-style random crop of a zero-padded image)
    flip: bool = True  # random horizontal flip, p = 0.5
    randaugment: tuple[int, int] | None = None  # (num_ops N, magnitude M on the 0..10 scale; >10 extrapolates)
    mixup: float = 0.0  # Beta(alpha, alpha) mixing of images and targets (Zhang et al. 2018); 0 = off
    cutmix: float = 0.0  # Beta(alpha, alpha) box pasting (Yun et al. 2019); with mixup, one of them per batch
    erasing: float = 0.0  # probability of random erasing per image (Zhong et al. 2020); 0 = off
    erasing_scale: tuple[float, float] = (0.02, 1 / 3)  # area fraction range of the erased box
    label_smoothing: float = 0.0  # epsilon: targets (1 - eps) * one_hot + eps / K (App. B.1)

    def __post_init__(self) -> None:
        if self.crop not in ("none", "inception", "pad"):
            raise ValueError(f"crop must be 'none', 'inception' or 'pad', got {self.crop!r}")
        low, high = self.crop_scale
        if not 0 < low <= high <= 1:
            raise ValueError(f"crop_scale must satisfy 0 < low <= high <= 1, got {self.crop_scale}")
        if not 0 < self.crop_ratio[0] <= self.crop_ratio[1]:
            raise ValueError(f"crop_ratio must satisfy 0 < low <= high, got {self.crop_ratio}")
        if self.pad < 0:
            raise ValueError(f"pad must be >= 0, got {self.pad}")
        if self.randaugment is not None and (
            len(self.randaugment) != 2 or self.randaugment[0] < 0 or self.randaugment[1] < 0
        ):
            raise ValueError(f"randaugment must be (num_ops >= 0, magnitude >= 0), got {self.randaugment}")
        if self.mixup < 0 or self.cutmix < 0:
            raise ValueError("mixup and cutmix alphas must be >= 0")
        if not 0 <= self.erasing <= 1 or not 0 < self.erasing_scale[0] <= self.erasing_scale[1] <= 1:
            raise ValueError(
                f"erasing must be in [0, 1] and 0 < erasing_scale low <= high <= 1, got "
                f"{self.erasing}, {self.erasing_scale}"
            )
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")


def describe_augment(config: AugmentConfig) -> list[str]:
    """The augmentations a config runs, in words (the plan printed before training lists them)."""
    crop = {
        "inception": f"inception crop (area {config.crop_scale[0]:g}-{config.crop_scale[1]:g})",
        "pad": f"pad-and-crop ({config.pad} px)",
        "none": "",
    }[config.crop]
    parts = [
        crop,
        "horizontal flip" if config.flip else "no flip",
        f"RandAugment {config.randaugment[0]} ops at magnitude {config.randaugment[1]}" if config.randaugment else "",
        f"Mixup {config.mixup:g}" if config.mixup else "",
        f"CutMix {config.cutmix:g}" if config.cutmix else "",
        f"random erasing p={config.erasing:g}" if config.erasing else "",
        f"label smoothing {config.label_smoothing:g}" if config.label_smoothing else "",
    ]
    return [part for part in parts if part]


# ------------------------------------------------------------------------------- normalisation
# ITU-R 601-2 luma in Pillow's fixed point (Image.convert("L")): colour images read for a grayscale model become
# the grayscale images `vitkit predict` decodes from the same files.
LUMA_WEIGHTS = (19595, 38470, 7471)  # / 2**16


def expand_channels(images: Tensor, channels: int | None) -> Tensor:
    """(B, 1, H, W) grayscale -> (B, channels, H, W) by repetition; RGB pixels (0-255, uint8 or float) ->
    grayscale as Pillow converts them (a grayscale model fine-tuned on colour images); other mismatches are
    errors."""
    if channels is None or images.shape[1] == channels:
        return images
    if images.shape[1] == 1:
        return images.expand(-1, channels, -1, -1)
    if images.shape[1] == 3 and channels == 1:
        pixels = images.to(torch.int64) if images.dtype == torch.uint8 else images.round().to(torch.int64)
        weights = torch.tensor(LUMA_WEIGHTS, dtype=torch.int64, device=images.device).view(1, 3, 1, 1)
        return (((pixels * weights).sum(1, keepdim=True) + (1 << 15)) >> 16).to(images.dtype)
    raise ValueError(
        f"images have {images.shape[1]} channels but the model takes {channels}: grayscale expands to any number "
        "and RGB converts to grayscale; nothing else does"
    )


def _per_channel(values: Sequence[float], channels: int, what: str) -> list[float]:
    """`values` for `channels` channels: given per channel, or one value (or all equal) for every channel."""
    values = [float(v) for v in values]
    if len(values) == channels:
        return values
    if len(values) == 1 or len(set(values)) == 1:
        return values[:1] * channels
    raise ValueError(f"{what} has {len(values)} values for {channels} channels")


def _normalise(pixels: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """Pixels 0..255 (B, C, H, W), uint8 or float -> float32 (x - 255 mean) / (255 std).

    Two passes, and exact at the ends for the official mean = std = 0.5: (0 - 127.5) / 127.5 = -1 and
    (255 - 127.5) / 127.5 = 1, where a fused multiply-add would give 1.0000001.
    """
    channels = pixels.shape[1]
    mean_t = torch.tensor([255.0 * m for m in _per_channel(mean, channels, "mean")], device=pixels.device)
    std_t = torch.tensor([255.0 * s for s in _per_channel(std, channels, "std")], device=pixels.device)
    return (pixels - mean_t.view(1, -1, 1, 1)).div_(std_t.view(1, -1, 1, 1))  # uint8 - float32 -> float32


def to_float(
    images_uint8: Tensor, mean: Sequence[float] = MEAN, std: Sequence[float] = STD, channels: int | None = None
) -> Tensor:
    """uint8 (B, C, H, W) -> float32 (B, channels or C, H, W) = (x / 255 - mean) / std.

    mean and std are in [0, 1] pixel units: one value, one per output channel, or (all equal) any count.
    Grayscale expanded to `channels` is normalised once and then broadcast (a view, no copy).
    """
    expanded = expand_channels(images_uint8, channels)
    out_channels = expanded.shape[1]
    mean, std = _per_channel(mean, out_channels, "mean"), _per_channel(std, out_channels, "std")
    if images_uint8.shape[1] == 1 and out_channels > 1 and len(set(mean)) == 1 and len(set(std)) == 1:
        return expand_channels(_normalise(images_uint8, mean[:1], std[:1]), out_channels)
    return _normalise(expanded, mean, std)


# --------------------------------------------------------------------------------- resampling
def resize(images: Tensor, size: int) -> Tensor:
    """Batched antialiased bilinear resize to (size, size); uint8 in -> uint8 out (rounded), float -> float."""
    if images.shape[-2:] == (size, size):
        return images
    out = F.interpolate(images.float(), size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return out.round_().clamp_(0, 255).to(torch.uint8) if images.dtype == torch.uint8 else out


def _center_square(images: Tensor, size: int) -> Tensor:
    """Shorter side -> size (antialiased), then the central size x size window."""
    height, width = images.shape[-2:]
    if height == width:
        return resize(images, size)
    scale = size / min(height, width)
    new_h, new_w = max(size, round(height * scale)), max(size, round(width * scale))
    out = F.interpolate(images.float(), size=(new_h, new_w), mode="bilinear", align_corners=False, antialias=True)
    top, left = (new_h - size) // 2, (new_w - size) // 2
    return out[..., top : top + size, left : left + size]


def eval_transform(
    images_uint8: Tensor,
    size: int,
    mean: Sequence[float] = MEAN,
    std: Sequence[float] = STD,
    channels: int | None = None,
) -> Tensor:
    """Deterministic evaluation input: resize (shorter side + centre crop if not square) and normalise."""
    pixels = _center_square(images_uint8, size)
    if pixels.dtype != torch.uint8:
        pixels = pixels.round().clamp(0, 255)
    return to_float(pixels, mean, std, channels)


def _uniform(shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> Tensor:
    return torch.rand(shape, generator=generator, device=device)


def pad_crop(images: Tensor, pad: int, generator: torch.Generator) -> Tensor:
    """CIFAR-style augmentation: zero-pad each side by `pad`, then take a random H x W window per image."""
    batch, channels, height, width = images.shape
    padded = F.pad(images, (pad, pad, pad, pad))
    shifts = torch.randint(0, 2 * pad + 1, (batch, 2), generator=generator, device=images.device)
    rows = shifts[:, 0, None] + torch.arange(height, device=images.device)  # (B, H)
    cols = shifts[:, 1, None] + torch.arange(width, device=images.device)  # (B, W)
    index = torch.arange(batch, device=images.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[index, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2)  # (B, H, W, C) -> (B, C, H, W)


def random_flip(images: Tensor, generator: torch.Generator, p: float = 0.5) -> tuple[Tensor, Tensor]:
    """Mirror each image left-right with probability p; returns (images, flipped mask (B,))."""
    flipped = _uniform((images.shape[0],), generator, images.device) < p
    index = torch.nonzero(flipped).flatten()
    out = images.clone()
    out[index] = images[index].flip(-1)
    return out, flipped


def random_erase(
    images: Tensor,
    p: float,
    generator: torch.Generator,
    *,
    scale: tuple[float, float] = (0.02, 1 / 3),
    ratio: tuple[float, float] = (0.3, 1 / 0.3),
) -> Tensor:
    """Random erasing (Zhong et al. 2020) of normalised images: with probability p per image, one box
    of area fraction U(scale) and aspect ratio log-uniform in `ratio` (clipped to the image) is
    replaced by N(0, 1) noise, per pixel and channel."""
    batch, _, height, width = images.shape
    device = images.device
    draws = _uniform((batch, 5), generator, device)  # apply?, area, log-ratio, top, left
    area = height * width * (scale[0] + (scale[1] - scale[0]) * draws[:, 1])
    aspect = torch.exp(math.log(ratio[0]) + (math.log(ratio[1]) - math.log(ratio[0])) * draws[:, 2])
    box_h = torch.sqrt(area * aspect).round().clamp(1, height)
    box_w = torch.sqrt(area / aspect).round().clamp(1, width)
    top = (draws[:, 3] * (height - box_h + 1)).floor()
    left = (draws[:, 4] * (width - box_w + 1)).floor()
    rows = torch.arange(height, device=device, dtype=images.dtype)[None, :]  # (1, H)
    cols = torch.arange(width, device=device, dtype=images.dtype)[None, :]
    in_rows = (rows >= top[:, None]) & (rows < (top + box_h)[:, None])  # (B, H)
    in_cols = (cols >= left[:, None]) & (cols < (left + box_w)[:, None])  # (B, W)
    mask = in_rows[:, :, None] & in_cols[:, None, :] & (draws[:, 0] < p)[:, None, None]  # (B, H, W)
    noise = torch.randn(images.shape, generator=generator, device=device, dtype=images.dtype)
    return torch.where(mask[:, None], noise, images)


# ---------------------------------------------------------------------------- targets, mixing
def one_hot(labels: Tensor, num_classes: int, smoothing: float = 0.0) -> Tensor:
    """Soft targets (B, K): (1 - eps) * one_hot + eps / K (label smoothing, Szegedy et al. 2016)."""
    targets = F.one_hot(labels.long(), num_classes).float()
    return targets * (1.0 - smoothing) + smoothing / num_classes


def _gamma(shape: float, generator: torch.Generator, device: torch.device) -> float:
    """One Gamma(shape, 1) draw, shape >= 1, by Marsaglia and Tsang's squeeze method (uniforms and normals only)."""
    d = shape - 1.0 / 3.0
    c = 1.0 / math.sqrt(9.0 * d)
    while True:
        x = torch.randn(64, generator=generator, device=device, dtype=torch.float64)
        u = torch.rand(64, generator=generator, device=device, dtype=torch.float64)
        v = (1.0 + c * x) ** 3
        ok = (v > 0) & (torch.log(u) < 0.5 * x**2 + d - d * v + d * torch.log(v.clamp_min(1e-300)))
        accepted = torch.nonzero(ok).flatten()
        if accepted.numel():
            return float(d * v[accepted[0]])


def sample_beta(alpha: float, generator: torch.Generator, device: torch.device) -> float:
    """One draw from Beta(alpha, alpha) using only `generator` (torch.distributions cannot take one).

    alpha < 1 (the usual mixup values): Johnk's rejection method in log space, X = U^(1/a),
    Y = V^(1/a), accepted when X + Y <= 1, returns X / (X + Y); it accepts often for small alpha.
    alpha >= 1: G1 / (G1 + G2) with Gamma(alpha) draws (Marsaglia-Tsang), which stays efficient
    where Johnk's acceptance rate collapses.
    """
    if alpha <= 0:
        raise ValueError(f"Beta alpha must be > 0, got {alpha}")
    if alpha >= 1.0:
        first = _gamma(alpha, generator, device)
        return first / (first + _gamma(alpha, generator, device))
    while True:
        logs = torch.log(_uniform((64, 2), generator, device).double().clamp_min(1e-300)) / alpha
        log_total = torch.logsumexp(logs, dim=1)
        accepted = torch.nonzero(log_total <= 0).flatten()
        if accepted.numel():
            i = accepted[0]
            return float(torch.exp(logs[i, 0] - log_total[i]))


def mixup(images: Tensor, targets: Tensor, alpha: float, generator: torch.Generator) -> tuple[Tensor, Tensor, float]:
    """Mixup with one lambda ~ Beta(alpha, alpha) per batch; image i is mixed with image B-1-i (the batch flipped)."""
    lam = sample_beta(alpha, generator, images.device)
    mixed = images * lam + images.flip(0) * (1.0 - lam)
    return mixed, targets * lam + targets.flip(0) * (1.0 - lam), lam


def cutmix(images: Tensor, targets: Tensor, alpha: float, generator: torch.Generator) -> tuple[Tensor, Tensor, float]:
    """CutMix: paste one box of image B-1-i into image i; lambda = the kept (unpasted) area fraction.

    The box has area (1 - lam) H W for lam ~ Beta(alpha, alpha) and a uniform centre; after clipping
    it to the image, lambda is recomputed from the real box so the targets match the pixels.
    """
    height, width = images.shape[-2:]
    lam = sample_beta(alpha, generator, images.device)
    cut = math.sqrt(1.0 - lam)
    centre = _uniform((2,), generator, images.device).tolist()
    cy, cx = int(centre[0] * height), int(centre[1] * width)
    half_h, half_w = int(height * cut) // 2, int(width * cut) // 2
    top, bottom = max(cy - half_h, 0), min(cy + half_h, height)
    left, right = max(cx - half_w, 0), min(cx + half_w, width)
    mixed = images.clone()
    mixed[..., top:bottom, left:right] = images.flip(0)[..., top:bottom, left:right]
    lam = 1.0 - (bottom - top) * (right - left) / (height * width)
    return mixed, targets * lam + targets.flip(0) * (1.0 - lam), lam


# ---------------------------------------------------------------------------------- pipeline
def train_transform(
    images_uint8: Tensor,
    labels: Tensor,
    num_classes: int,
    size: int,
    mean: Sequence[float] = MEAN,
    std: Sequence[float] = STD,
    channels: int | None = None,
    config: AugmentConfig = AugmentConfig(),
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Augmented training batch: (float images (B, channels or C, size, size), soft targets (B, K)).

    All randomness comes from `generator`, which must live on the images' device.
    """
    if generator is None:
        raise ValueError("train_transform needs a torch.Generator on the batch's device (reproducibility)")
    flip_later = config.flip and config.crop != "inception"
    if config.crop == "inception":
        pixels = inception_crop(
            images_uint8,
            size,
            generator,
            scale=config.crop_scale,
            ratio=config.crop_ratio,
            flip=0.5 if config.flip else 0.0,
        )
    elif config.crop == "pad":
        pixels = resize(pad_crop(images_uint8, config.pad, generator).float(), size).round_().clamp_(0, 255)
    else:
        pixels = _center_square(images_uint8, size).round().clamp(0, 255)
    if config.randaugment is not None and config.randaugment[0] > 0:
        pixels = rand_augment(pixels, config.randaugment[0], config.randaugment[1], generator)
    if flip_later:
        pixels, _ = random_flip(pixels, generator)
    images = to_float(pixels, mean, std, channels)
    if config.erasing > 0:
        images = random_erase(images, config.erasing, generator, scale=config.erasing_scale)
    targets = one_hot(labels.to(images.device), num_classes, config.label_smoothing)
    use_mixup, use_cutmix = config.mixup > 0, config.cutmix > 0
    if use_mixup and use_cutmix:  # one of the two per batch, with equal odds (as timm's switch_prob 0.5)
        use_cutmix = bool(_uniform((1,), generator, images.device).item() < 0.5)
        use_mixup = not use_cutmix
    if use_mixup:
        images, targets, _ = mixup(images, targets, config.mixup, generator)
    elif use_cutmix:
        images, targets, _ = cutmix(images, targets, config.cutmix, generator)
    return images, targets
