"""Analytic FLOP counts: 2 FLOPs per multiply-add of every matmul and convolution, forward pass, one image.

Element-wise work (softmax, LayerNorm, GELU, residual adds) is left out, as is usual for MFU.  The
ViT count is closed-form; convolutional families are counted by tracing the model on the meta
device (no memory, no arithmetic).
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

from vitkit.models import build_model
from vitkit.models.configs import ModelConfig, ViTConfig, image_size, in_channels, with_overrides


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
