"""Tiny checkpoints for the eval and inspect tests (D=32, L=2, k=2, P=8)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import vitkit

TINY = dict(hidden_size=32, depth=2, num_heads=2, mlp_dim=64, patch_size=8)


def tiny_checkpoint(
    directory: Path, *, in_chans: int = 3, img_size: int = 32, num_classes: int = 10, **overrides
) -> Path:
    """Save a tiny ViT with a random (not zero) head, so its predictions differ between images."""
    model = vitkit.create_model(
        "vit_ti16", num_classes=num_classes, img_size=img_size, in_chans=in_chans, **{**TINY, **overrides}
    )
    with torch.no_grad():
        model.head.weight.normal_(0, 1.0)
        model.head.bias.normal_(0, 0.1)
    names = [f"class_{i}" for i in range(num_classes)]
    return vitkit.save(model, directory, class_names=names, mean=(0.5,) * in_chans, std=(0.5,) * in_chans)


@pytest.fixture
def make_checkpoint():
    """The `tiny_checkpoint` factory, for tests that need several."""
    return tiny_checkpoint


@pytest.fixture
def rgb_checkpoint(tmp_path: Path) -> Path:
    return tiny_checkpoint(tmp_path / "rgb_ckpt", num_classes=4)


@pytest.fixture
def digits_checkpoint(tmp_path: Path) -> Path:
    return tiny_checkpoint(tmp_path / "digits_ckpt", in_chans=1, img_size=16)
