"""Analytic FLOP counts: 2 FLOPs per multiply-add of every matmul and convolution, forward pass, one image.

Element-wise work (softmax, LayerNorm, GELU, residual adds) is left out, as is usual for MFU.  The
ViT count is closed-form; convolutional families are counted by tracing the model on the meta
device (no memory, no arithmetic).
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from vitkit.models import build_model
from vitkit.models.configs import (
    ModelConfig,
    ViTConfig,
    image_size,
    in_channels,
    with_overrides,
)


def vit_flops(config: ViTConfig, img_size: int | None = None) -> int:
    """Forward FLOPs of one image through a plain ViT at `img_size` (default: the config's)."""
    size = img_size or config.img_size
    d, m, p = config.hidden_size, config.mlp_dim, config.patch_size
    patches = (size // p) ** 2  # N
    tokens = patches + (1 if config.pool == "token" else 0)  # T
    embed = 2 * patches * (p * p * config.in_chans) * d  # Eq. 1: x_p E
    attention = 2 * tokens * d * 3 * d + 2 * 2 * tokens * tokens * d + 2 * tokens * d * d  # qkv, QK^T and AV, out
    if config.posemb == "relative":
        attention += 2 * tokens * (2 * tokens - 1) * d  # q . r for every offset, all heads
    mlp = 2 * 2 * tokens * d * m
    head_in = config.representation_size or d
    head = (2 * d * config.representation_size if config.representation_size else 0) + 2 * head_in * config.num_classes
    return embed + config.depth * (attention + mlp) + head


def counted_flops(config: ModelConfig, img_size: int | None = None) -> int:
    """FLOPs counted by torch's FlopCounterMode on the meta device (explicit attention path for ViTs)."""
    config = with_overrides(config, img_size=img_size) if img_size else config
    with torch.device("meta"):
        model = build_model(config).eval()
        x = torch.empty(1, in_channels(config), image_size(config), image_size(config))
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        if hasattr(model, "forward_intermediates"):
            model.forward_intermediates(x)  # attention as plain matmuls, which the counter sees
        else:
            model(x)
    return int(counter.get_total_flops())


def model_flops(config: ModelConfig, img_size: int | None = None) -> int:
    """Forward FLOPs per image: closed form for ViT, traced for ResNet and hybrid models."""
    if isinstance(config, ViTConfig):
        return vit_flops(config, img_size)
    return counted_flops(config, img_size)


def backbone_bound(layers: tuple[int, ...], width_factor: int, in_chans: int, side: int) -> tuple[int, int]:
    """Upper bounds of a BiT backbone's forward FLOPs and its largest activation (float32 bytes) at `side` px,
    without tracing it: every convolution of a stage is counted at the stage's input resolution (at most 4x
    over for the strided ones).  For screening absurd configs; model_flops counts exactly."""
    width = 64 * width_factor
    pixels = (-(-side // 2)) ** 2  # the root convolution's output
    flops, biggest = 2 * in_chans * 49 * width * pixels, width * pixels * 4
    channels = width
    for index, depth in enumerate(layers):
        pixels = (-(-side // (4 * 2 ** max(index - 1, 0)))) ** 2  # this stage's input resolution
        out = 256 * width_factor * 2**index
        mid = out // 4
        unit = channels * mid + 9 * mid * mid + mid * out  # conv1, conv2 (3x3), conv3 multiply-adds per pixel
        flops += 2 * pixels * (unit + channels * out + (depth - 1) * (out * mid + 9 * mid * mid + mid * out))
        biggest, channels = max(biggest, out * pixels * 4), out
    return flops, biggest
