"""RandAugment ops against Pillow's ImageOps / ImageEnhance, and the batched per-sample op choice."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from vitkit.data import randaugment as ra


def pil_batch(batch: int = 4, side: int = 12, seed: int = 0) -> tuple[torch.Tensor, list[Image.Image]]:
    rng = np.random.default_rng(seed)
    arrays = [
        rng.integers(lo, hi, (side, side, 3), dtype=np.uint8)
        for lo, hi in ((0, 256), (40, 90), (7, 8), (0, 200))[:batch]
    ]
    tensor = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float()  # (B, H, W, C) -> (B, C, H, W)
    return tensor, [Image.fromarray(a) for a in arrays]


def as_tensor(images: list[Image.Image]) -> torch.Tensor:
    return torch.from_numpy(np.stack([np.asarray(i) for i in images])).permute(0, 3, 1, 2).float()


def test_equalize_autocontrast_posterize_solarize_match_pillow():
    x, pil = pil_batch()  # includes a low-contrast image and a constant one
    assert torch.equal(ra.equalize(x), as_tensor([ImageOps.equalize(i) for i in pil]))
    assert torch.equal(ra.autocontrast(x), as_tensor([ImageOps.autocontrast(i) for i in pil]))
    assert torch.equal(ra.posterize(x, 1.0), as_tensor([ImageOps.posterize(i, 4) for i in pil]))
    assert torch.equal(ra.solarize(x, 0.5), as_tensor([ImageOps.solarize(i, 128) for i in pil]))


@pytest.mark.parametrize(
    "name, enhancer",
    [
        ("color", ImageEnhance.Color),
        ("brightness", ImageEnhance.Brightness),
        ("sharpness", ImageEnhance.Sharpness),
        ("contrast", ImageEnhance.Contrast),
    ],
)
def test_enhance_ops_match_pillow(name, enhancer):
    x, pil = pil_batch()
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0])
    out = ra._pixel_op(name, x, signs, 0.5)  # factors 1.45 / 0.55
    expected = as_tensor([enhancer(image).enhance(1 + 0.45 * float(s)) for image, s in zip(pil, signs)])
    # Pillow rounds its integer luma/mean slightly differently; allow 2 levels (of 255).
    assert (out - expected).abs().max() <= 2


def test_translate_moves_by_45_percent_with_grey_fill():
    x = torch.randint(0, 256, (16, 3, 20, 20)).float()
    out = ra.rand_augment(x, 1, 10, torch.Generator().manual_seed(0), ops=("translate_x",))
    shift = 9  # 0.45 * 20 pixels
    moved = {"left": 0, "right": 0}
    for i in range(16):
        if torch.equal(out[i, :, :, : 20 - shift], x[i, :, :, shift:]):
            assert (out[i, :, :, 20 - shift :] == 128).all()
            moved["left"] += 1
        else:
            assert torch.equal(out[i, :, :, shift:], x[i, :, :, : 20 - shift]) and (out[i, :, :, :shift] == 128).all()
            moved["right"] += 1
    assert moved["left"] and moved["right"]  # the sign is drawn per image


def test_zero_magnitude_geometry_is_identity():
    x = torch.randint(0, 256, (6, 3, 10, 10)).float()
    out = ra.rand_augment(x, 2, 0, torch.Generator().manual_seed(0), ops=ra.GEOMETRIC)
    assert torch.equal(out, x)


def test_ops_are_chosen_per_sample():
    x = torch.randint(0, 256, (64, 3, 8, 8)).float()
    out = ra.rand_augment(x, 1, 10, torch.Generator().manual_seed(0), ops=("identity", "solarize"))  # M=10 inverts all
    same = [torch.equal(out[i], x[i]) for i in range(64)]
    inverted = [torch.equal(out[i], 255 - x[i]) for i in range(64)]
    assert all(s or v for s, v in zip(same, inverted))
    assert 16 < sum(same) < 48


def test_rand_augment_all_ops_valid_and_deterministic():
    x = torch.randint(0, 256, (32, 3, 16, 16)).float()
    a = ra.rand_augment(x, 3, 15, torch.Generator().manual_seed(1))
    b = ra.rand_augment(x, 3, 15, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and not torch.equal(a, x)
    assert a.min() >= 0 and a.max() <= 255 and torch.equal(a, a.round())  # still integer-valued pixels
    gray = ra.rand_augment(x[:, :1], 2, 10, torch.Generator().manual_seed(1))  # 1-channel images work too
    assert gray.shape == (32, 1, 16, 16)
    with pytest.raises(ValueError, match="unknown RandAugment ops"):
        ra.rand_augment(x, 1, 5, torch.Generator(), ops=("invert_all",))
