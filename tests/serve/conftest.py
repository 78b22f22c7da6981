"""Fixtures of the `vitkit serve` tests: a tiny ViT checkpoint and image files of several formats."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from serve_helpers import save_tiny_vit


@pytest.fixture(scope="session")
def vit_checkpoint(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    return save_tiny_vit(tmp_path_factory.mktemp("serve") / "vit")


@pytest.fixture(scope="session")
def images(tmp_path_factory) -> list[Path]:
    """Five image files of different formats, modes and sizes (each is resized and centre-cropped)."""
    folder = tmp_path_factory.mktemp("serve_images")
    rng = np.random.default_rng(0)
    shapes = [
        ("a.png", (40, 56, 3), "RGB"),
        ("b.jpg", (32, 32, 3), "RGB"),
        ("c.png", (90, 45), "L"),
        ("d.png", (33, 33, 4), "RGBA"),
        ("e.bmp", (64, 48, 3), "RGB"),
    ]
    paths = []
    for name, shape, mode in shapes:
        pixels = rng.integers(0, 256, shape, dtype=np.uint8)
        Image.fromarray(pixels, mode).save(folder / name)
        paths.append(folder / name)
    return paths
