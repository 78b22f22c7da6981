"""Analytic FLOPs against torch's FlopCounterMode (2 FLOPs per multiply-add of matmuls and convolutions).

The counter sees only matmul / convolution kernels, exactly the work `vit_flops` counts; element-wise
work (softmax, LayerNorm, GELU, GroupNorm, adds) is left out of both, so the two agree exactly, not
within a tolerance.
"""

from __future__ import annotations

import dataclasses

import pytest

from vitkit.models.configs import PRESETS, HybridConfig, ResNetConfig, ViTConfig
from vitkit.models.flops import counted_flops, model_flops, vit_flops

TINY = ViTConfig(img_size=32, patch_size=8, hidden_size=32, depth=2, num_heads=2, mlp_dim=64, num_classes=10)
TINY_GAP_RELATIVE = dataclasses.replace(
    TINY, img_size=48, in_chans=1, pool="gap", posemb="relative", representation_size=16, patch_size=16
)


@pytest.mark.parametrize(
    "config", [TINY, TINY_GAP_RELATIVE, PRESETS["vit_b16"]], ids=["tiny", "tiny_gap_relative", "vit_b16"]
)
def test_vit_flops_equal_counted_flops(config):
    assert vit_flops(config) == counted_flops(config)
    other = 2 * config.img_size  # another resolution: more tokens, quadratic attention term
    assert vit_flops(config, other) == counted_flops(config, other)


def test_vit_b16_golden():
    """ViT-B/16 at 224 px: 35.13 GFLOPs (17.56 GMACs, as usually quoted), head included."""
    assert vit_flops(PRESETS["vit_b16"]) == 35_127_656_448
    assert model_flops(PRESETS["vit_b16"]) == vit_flops(PRESETS["vit_b16"])


def test_vit_flops_hand_count_of_the_tiny_model():
    d, m, n, t = 32, 64, 16, 17  # D, MLP, patches, tokens
    embed = 2 * n * (8 * 8 * 3) * d
    per_layer = 2 * t * d * 3 * d + 2 * 2 * t * t * d + 2 * t * d * d + 2 * 2 * t * d * m  # qkv, QK^T + AV, out, MLP
    assert vit_flops(TINY) == embed + 2 * per_layer + 2 * d * 10


def _two_stage_conv_flops() -> int:
    """Convolutions of layers (1, 1), width 64, at 32 px: stem conv to 16x16, pool to 8x8, stage 2 at 4x4."""
    stem = 2 * 16 * 16 * (49 * 3) * 64
    stage1 = 2 * 64 * (64 * 64 + 9 * 64 * 64 + 64 * 256 + 64 * 256)  # conv1, conv2, conv3, projection at 8x8
    stage2 = 2 * 64 * (256 * 128) + 2 * 16 * (9 * 128 * 128 + 128 * 512 + 256 * 512)  # conv1 at 8x8, the rest at 4x4
    return stem + stage1 + stage2


def test_resnet_flops_count_every_convolution():
    config = ResNetConfig(layers=(1, 1), img_size=32, num_classes=10)
    assert model_flops(config) == _two_stage_conv_flops() + 2 * 512 * 10


def test_hybrid_flops_are_backbone_plus_a_vit_on_the_feature_map():
    vit = dataclasses.replace(TINY, patch_size=1)
    config = HybridConfig(vit=vit, resnet_layers=(1, 1))  # stride 8: a 4x4 feature map of 512 channels
    as_vit = dataclasses.replace(vit, img_size=4, in_chans=512)  # its 1x1 "patch embedding" is the hybrid's proj
    assert model_flops(config) == _two_stage_conv_flops() + vit_flops(as_vit)
