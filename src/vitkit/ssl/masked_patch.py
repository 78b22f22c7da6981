"""Masked patch prediction, the self-supervised objective of Sec. 4.6 and Appendix B.1.2.

    "we corrupt 50% of patch embeddings by either replacing their embeddings with a learnable [mask]
    embedding (80%), a random other patch embedding (10%) or just keeping them as is (10%) ...
    we predict the 3-bit, mean color (i.e., 512 colors in total) of every corrupted patch using
    their respective patch representations."                                        (App. B.1.2)

The corruption acts on the patch embeddings x_p^i E of Eq. 1, *before* E_pos is added, so a [mask]
token or a transplanted patch still carries the position of the slot it fills.  The encoder is used
only through its public methods and attributes (`patch_embed`, then `encode_patches` on the corrupted
embeddings, `num_prefix_tokens`), so models/vit.py knows nothing about this objective and the saved
encoder is a plain ViT.

Choices the paper leaves open, fixed here:
  * Selection: exactly round(rate * N) patches of every image (a random permutation, as MAE's
    `random_masking`), so every image gets the same number of predictions.  Each selected patch then
    independently becomes [mask] / random / kept with probabilities `replace` (as BERT does per token).
  * "A random other patch": uniform over all B*N patch embeddings of the batch except the patch
    itself (so mostly from other images, like BERT's random vocabulary word), taken before corruption.
  * Colour quantisation: pixels are recovered in 0..255 units from the normalised input
    (p = 255 * (x * std + mean)), averaged over the patch per channel, and cut into 2**bits equal bins of
    [0, 256): level = floor(mean * 2**bits / 256), i.e. the top `bits` bits of the 8-bit mean.
    The class index is big-endian over channels: index = r * 64 + g * 8 + b for 3 bits and RGB.
    Grayscale (C = 1) therefore has 8 classes (replicating the channel would only reach the 8 grey
    entries of the 512 anyway).  In general there are 2**(bits * C) classes.
  * "downsampled": each patch is average-pooled to `downsample` x `downsample` cells
    (adaptive pooling, exact block means when P is divisible), each cell quantised as above:
    (B, N, 16) indices for the default 4 x 4.
  * "pixels": L2 regression on the patch of the normalised model input, flattened in
    (row, column, channel) order: (B, N, P*P*C).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.data.transforms import eval_transform
from vitkit.eval.evaluator import agreed_batches

Target = Literal["mean_color", "downsampled", "pixels"]

# Values of the `kind` tensor returned by `corrupt`.
UNTOUCHED, MASKED, RANDOM, KEPT = 0, 1, 2, 3


@dataclass(frozen=True, kw_only=True)
class MPPConfig:
    """Masked patch prediction (App. B.1.2)."""

    target: Target = "mean_color"  # App. B.1.2 option 1) (reported), 2) "downsampled", 3) "pixels" (L2)
    corrupt_rate: float = 0.5  # fraction of patch embeddings corrupted; 0.15 is the BERT rate also tried
    replace: tuple[float, float, float] = (0.8, 0.1, 0.1)  # of the corrupted: [mask] / random other patch / kept
    color_bits: int = 3  # bits per channel of the colour targets: 3 -> 8 levels, 512 RGB classes
    downsample: int = 4  # "downsampled" target: cells per side of the downsized patch (4 x 4 of a 16 x 16 patch)
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)  # input normalisation x = (p/255 - mean) / std, undone for colour targets
    std: tuple[float, ...] = (0.5, 0.5, 0.5)  # (0.5, 0.5): the official [-1, 1] scaling
    eval_images: int = 1024  # held-out (test split) images of the final MPP evaluation; 0 = none

    def __post_init__(self) -> None:
        if self.target not in ("mean_color", "downsampled", "pixels"):
            raise ValueError(f"unknown MPP target {self.target!r}; choose mean_color, downsampled or pixels")
        if not 0.0 < self.corrupt_rate <= 1.0:
            raise ValueError(f"corrupt_rate must be in (0, 1], got {self.corrupt_rate}")
        if len(self.replace) != 3 or min(self.replace) < 0 or abs(sum(self.replace) - 1.0) > 1e-6:
            raise ValueError(f"replace must be three non-negative probabilities summing to 1, got {self.replace}")
        if not 1 <= self.color_bits <= 8:
            raise ValueError(f"color_bits must be in 1..8, got {self.color_bits}")
        if self.downsample < 1:
            raise ValueError(f"downsample must be >= 1, got {self.downsample}")
        if self.eval_images < 0:
            raise ValueError(f"eval_images must be >= 0, got {self.eval_images}")
        if len(self.mean) != len(self.std) or min(self.std) <= 0:
            raise ValueError(f"mean {self.mean} and std {self.std} must have the same length and std > 0")


def corrupt(
    tokens: Tensor,
    mask_token: Tensor,
    generator: torch.Generator,
    rate: float = 0.5,
    replace: tuple[float, float, float] = (0.8, 0.1, 0.1),
) -> tuple[Tensor, Tensor, Tensor]:
    """BERT-style corruption of patch embeddings (App. B.1.2).

    Args:
        tokens: (B, N, D) patch embeddings x_p^i E, before E_pos.
        mask_token: (D,) (or any shape broadcasting to (B, N, D)) the learnable [mask] embedding.
        generator: all randomness; it must live on `tokens.device`.
        rate: fraction selected per image: exactly round(rate * N) (at least 1).
        replace: probabilities of [mask] / random other patch of the batch / unchanged, per selected patch.
    Returns:
        corrupted (B, N, D); mask (B, N) bool, True where selected (the loss positions);
        kind (B, N) int64: UNTOUCHED, MASKED, RANDOM or KEPT.
    """
    batch, num, dim = tokens.shape
    count = min(num, max(1, round(rate * num)))
    noise = torch.rand(batch, num, generator=generator, device=tokens.device)
    rank = noise.argsort(dim=1).argsort(dim=1)  # rank of each patch in a random permutation, (B, N)
    mask = rank < count  # exactly `count` per image, every position equally likely
    draw = torch.rand(batch, num, generator=generator, device=tokens.device)
    p_mask, p_random = replace[0], replace[0] + replace[1]
    kind = torch.where(draw < p_mask, MASKED, torch.where(draw < p_random, RANDOM, KEPT))
    kind = torch.where(mask, kind, UNTOUCHED)
    # A random *other* patch of the batch: draw from B*N - 1 slots and skip the patch's own slot.
    flat = tokens.reshape(batch * num, dim)  # (B, N, D) -> (B*N, D)
    own = torch.arange(batch * num, device=tokens.device)
    other = (torch.rand(batch * num, generator=generator, device=tokens.device) * (batch * num - 1)).long()
    other = other + (other >= own).long() if batch * num > 1 else own
    donors = flat[other].reshape(batch, num, dim)  # (B*N, D) -> (B, N, D)
    fill = mask_token.to(tokens.dtype).expand(batch, num, dim)
    out = torch.where((kind == MASKED).unsqueeze(-1), fill, tokens)
    out = torch.where((kind == RANDOM).unsqueeze(-1), donors, out)
    return out, mask, kind


def _pixel_patches(images: Tensor, patch: int) -> Tensor:
    """(B, C, H, W) -> (B, N, C, P, P) patches in raster order (the order of Eq. 1's tokens)."""
    batch, chans, height, width = images.shape
    if height % patch or width % patch:
        raise ValueError(f"image {height}x{width} is not divisible by the patch size {patch}")
    x = images.reshape(batch, chans, height // patch, patch, width // patch, patch)  # (B, C, gh, P, gw, P)
    return x.permute(0, 2, 4, 1, 3, 5).reshape(batch, -1, chans, patch, patch)  # -> (B, gh*gw, C, P, P)


def patchify(images: Tensor, patch: int) -> Tensor:
    """(B, C, H, W) -> (B, N, P*P*C), each patch flattened in (row, column, channel) order."""
    patches = _pixel_patches(images, patch)
    return patches.permute(0, 1, 3, 4, 2).flatten(2)  # (B, N, C, P, P) -> (B, N, P, P, C) -> (B, N, P*P*C)


def to_pixels(images: Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> Tensor:
    """Undo the input normalisation: (B, C, H, W) float -> pixel values in 0..255 units."""
    chans = images.shape[1]
    if len(mean) < chans:
        raise ValueError(f"normalisation has {len(mean)} channel(s), images have {chans}")
    m = images.new_tensor(mean[:chans]).view(1, chans, 1, 1)
    s = images.new_tensor(std[:chans]).view(1, chans, 1, 1)
    return (images * s + m) * 255.0


def quantize_colors(pixels: Tensor, bits: int = 3) -> Tensor:
    """(..., C) mean pixel values in 0..255 -> (...) class index in [0, 2**(bits*C)), big-endian over channels.

    level = floor(value * 2**bits / 256) keeps the top `bits` bits of an 8-bit value; the 1e-4 absorbs the
    float error of un-normalising, so a patch of exact value 32 lands in level 1, not 0.
    """
    levels = 2**bits
    pixels = torch.nan_to_num(pixels.float(), nan=0.0)  # a NaN input must surface as a NaN loss, not a bad index
    level = torch.floor(pixels * (levels / 256.0) + 1e-4).clamp(0, levels - 1).long()
    index = torch.zeros(level.shape[:-1], dtype=torch.long, device=level.device)
    for channel in range(level.shape[-1]):  # index = r * levels^2 + g * levels + b for RGB
        index = index * levels + level[..., channel]
    return index


def mean_color_target(pixels: Tensor, patch: int, bits: int = 3) -> Tensor:
    """Option 1): (B, C, H, W) pixels in 0..255 -> (B, N) index of the patch's quantised mean colour."""
    means = _pixel_patches(pixels, patch).mean(dim=(-2, -1))  # (B, N, C)
    return quantize_colors(means, bits)


def downsampled_target(pixels: Tensor, patch: int, cells: int = 4, bits: int = 3) -> Tensor:
    """Option 2): (B, C, H, W) pixels in 0..255 -> (B, N, cells**2) quantised colours of the downsized patch."""
    if patch < cells:
        raise ValueError(f"cannot downsize a {patch}x{patch} patch to {cells}x{cells}")
    patches = _pixel_patches(pixels, patch)  # (B, N, C, P, P)
    batch, num, chans = patches.shape[:3]
    small = F.adaptive_avg_pool2d(patches.reshape(batch * num, chans, patch, patch), cells)  # (B*N, C, s, s)
    small = small.reshape(batch, num, chans, cells * cells).transpose(2, 3)  # -> (B, N, s*s, C)
    return quantize_colors(small, bits)


class MaskedPatchPrediction(nn.Module):
    """A ViT encoder, a learnable [mask] embedding and a linear prediction head on corrupted patches.

    `forward(images, generator)` returns a dict with "loss" (mean over corrupted patches only),
    "accuracy" (classification targets; NaN for "pixels"), "predictions", "targets", "mask" and "kind".
    Checkpoints hold `encoder` alone (see ssl/pretrain.py); the [mask] embedding and head stay in the train state.
    """

    def __init__(self, encoder: nn.Module, config: MPPConfig):
        super().__init__()
        self.encoder = encoder
        self.config = config
        width = encoder.encoder_config.hidden_size
        self.patch_pixels = encoder.patch_embed.stride  # P in pixels (a hybrid's total stride)
        self.in_chans = encoder.encoder_config.in_chans
        if self.in_chans > len(config.mean):
            raise ValueError(f"MPPConfig normalisation has {len(config.mean)} channels, the model {self.in_chans}")
        if config.target == "downsampled" and self.patch_pixels < config.downsample:
            raise ValueError(
                f"patch size {self.patch_pixels} is smaller than the {config.downsample}x{config.downsample} target"
            )
        self.num_colors = 2 ** (config.color_bits * self.in_chans)  # 512 for RGB at 3 bits, 8 for grayscale
        self.slots = config.downsample**2 if config.target == "downsampled" else 1  # predictions per patch
        outputs = self.patch_pixels**2 * self.in_chans if config.target == "pixels" else self.slots * self.num_colors
        self.mask_token = nn.Parameter(torch.zeros(width))
        self.head = nn.Linear(width, outputs)
        nn.init.normal_(self.mask_token, std=0.02)  # as the position embeddings (BERT initialises tokens alike)
        nn.init.zeros_(self.head.weight)  # zero head: the first loss is exactly log(classes)
        nn.init.zeros_(self.head.bias)

    def encode_corrupted(self, images: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """Eq. 1-3 + final LN with corrupted patch embeddings: (B, N, D) patch outputs, mask and kind (B, N)."""
        enc = self.encoder
        tokens, grid = enc.patch_embed(images)  # Eq. 1: x_p^i E, (B, N, D)
        z, mask, kind = corrupt(tokens, self.mask_token, generator, self.config.corrupt_rate, self.config.replace)
        z, _ = enc.encode_patches(z, grid, patch_dropout=0.0)  # Eq. 1-3 + LN: E_pos added after the corruption
        return z[:, enc.num_prefix_tokens :], mask, kind  # the patch representations z_L^1 ... z_L^N

    def targets(self, images: Tensor) -> Tensor:
        """(B, N) class indices, (B, N, s*s) indices, or (B, N, P*P*C) normalised pixels."""
        cfg = self.config
        if cfg.target == "pixels":
            return patchify(images, self.patch_pixels)
        pixels = to_pixels(images, cfg.mean, cfg.std)
        if cfg.target == "mean_color":
            return mean_color_target(pixels, self.patch_pixels, cfg.color_bits)
        return downsampled_target(pixels, self.patch_pixels, cfg.downsample, cfg.color_bits)

    def forward(self, images: Tensor, generator: torch.Generator) -> dict[str, Tensor]:
        z, mask, kind = self.encode_corrupted(images, generator)
        predictions = self.head(z)  # (B, N, outputs)
        if self.config.target != "pixels":
            predictions = predictions.unflatten(-1, (self.slots, self.num_colors))  # (B, N, s*s, colours)
            if self.config.target == "mean_color":
                predictions = predictions.squeeze(2)  # (B, N, 512)
        targets = self.targets(images)
        loss, accuracy = mpp_loss(predictions, targets, mask)
        return {
            "loss": loss,
            "accuracy": accuracy,
            "predictions": predictions,
            "targets": targets,
            "mask": mask,
            "kind": kind,
        }


def mpp_loss(predictions: Tensor, targets: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Loss on the corrupted patches only, and the accuracy there (NaN for regression).

    Classification: predictions (B, N, [S,] K) logits, targets (B, N, [S]) int -> mean cross-entropy.
    Regression: predictions and targets (B, N, F) float -> mean squared error per element.
    """
    picked_pred, picked_target = predictions[mask], targets[mask]  # (M, ...) with M corrupted patches
    if targets.dtype.is_floating_point:
        loss = F.mse_loss(picked_pred, picked_target)
        return loss, torch.full((), math.nan, device=loss.device)
    logits = picked_pred.reshape(-1, picked_pred.shape[-1])  # (M*S, K)
    labels = picked_target.reshape(-1)
    loss = F.cross_entropy(logits, labels)
    accuracy = (logits.argmax(-1) == labels).float().mean().detach()
    return loss, accuracy


@torch.no_grad()
def evaluate_mpp(
    model: MaskedPatchPrediction,
    images: Tensor,
    size: int,
    mean: tuple[float, ...],
    std: tuple[float, ...],
    device: torch.device,
    batch_size: int = 256,
    seed: int = 12345,
    progress: Callable[[], None] | None = None,
    interrupted: Callable[[], int] | None = None,
    world: int = 1,
) -> dict[str, float | None]:
    """MPP loss and top-1 / top-5 accuracy over the corrupted patches of held-out uint8 images (the corruption
    is drawn from a fixed seed, so every evaluation of a run corrupts the same patches); `progress` is called
    before each batch (a training run's stall watch).  `interrupted`: this process's pending signal, read before
    each batch; any of the `world` processes' (each evaluates every image) ends every one's evaluation with
    `EvaluationInterrupted`, as a classifier's does."""
    was_training = model.training
    model.eval()
    generator = torch.Generator(device=device).manual_seed(seed)
    loss_sum, hits1, hits5, count = 0.0, 0.0, 0.0, 0
    classify = model.config.target != "pixels"
    try:
        starts = range(0, len(images), batch_size)
        for start in agreed_batches(starts, device, world, False, interrupted, progress):
            batch = eval_transform(images[start : start + batch_size].to(device), size, mean, std, model.in_chans)
            out = model(batch, generator)
            weight = int(out["mask"].sum())
            loss_sum += float(out["loss"]) * weight
            count += weight
            if classify:
                logits = out["predictions"][out["mask"]].reshape(-1, model.num_colors)  # (M*S, colours)
                labels = out["targets"][out["mask"]].reshape(-1, 1)
                best = logits.topk(min(5, model.num_colors), dim=-1).indices
                hits1 += float((best[:, :1] == labels).any(-1).float().mean()) * weight
                hits5 += float((best == labels).any(-1).float().mean()) * weight
    finally:
        model.train(was_training)
    return {
        "loss": loss_sum / count,
        "top1": hits1 / count if classify else None,
        "top5": hits5 / count if classify else None,
    }
