"""Tiny models for the checkpoint tests (D=32, L=2, k=2, 32x32, P=8), with non-trivial weights."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from vitkit.models import build_model
from vitkit.models.configs import ViTConfig

TINY = ViTConfig(img_size=32, patch_size=8, hidden_size=32, depth=2, num_heads=2, mlp_dim=64, num_classes=5)


def randomise(model: nn.Module, seed: int = 0) -> nn.Module:
    """Every parameter random (the official init leaves heads, biases and [class] at zero, hiding mix-ups)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
            if "norm" in name and name.endswith("weight"):  # LayerNorm / GroupNorm scales near 1
                param.add_(1.0)
    return model.eval()


@pytest.fixture(name="randomise")
def randomise_fixture():
    return randomise


@pytest.fixture
def make_vit():
    """make_vit(**overrides) -> a randomised tiny VisionTransformer."""

    def _make(seed: int = 0, **overrides) -> nn.Module:
        return randomise(build_model(dataclasses.replace(TINY, **overrides)), seed)

    return _make


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
