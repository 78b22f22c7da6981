"""Batched transforms: crops, flip, mixing, targets, normalisation, and the whole train/eval pipelines."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from vitkit.data.transforms import (
    AugmentConfig,
    cutmix,
    eval_transform,
    inception_crop,
    mixup,
    one_hot,
    pad_crop,
    random_erase,
    random_flip,
    resize,
    sample_beta,
    to_float,
    train_transform,
)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def column_ramp(batch: int, side: int, step: int = 4) -> torch.Tensor:
    """uint8 (B, 3, side, side) whose value is step * column index."""
    ramp = (torch.arange(side) * step).clamp(max=255).to(torch.uint8)
    return ramp.expand(batch, 3, side, side).contiguous()


# ------------------------------------------------------------------------------ normalisation
def test_to_float_endpoints_and_channels():
    x = torch.tensor([0, 255, 51], dtype=torch.uint8).view(1, 1, 1, 3)
    out = to_float(x, channels=3)
    assert out.shape == (1, 3, 1, 3) and out.dtype == torch.float32
    assert out[0, :, 0, 0].tolist() == [-1.0] * 3 and out[0, :, 0, 1].tolist() == [1.0] * 3
    assert torch.allclose(out[0, 0, 0, 2], torch.tensor(51 / 127.5 - 1))
    custom = to_float(torch.full((1, 3, 1, 1), 255, dtype=torch.uint8), mean=(0.5, 0.0, 1.0), std=(0.5, 2.0, 0.25))
    assert custom.flatten().tolist() == [1.0, 0.5, 0.0]
    gray = torch.full((2, 1, 3, 3), 255, dtype=torch.uint8)
    assert (to_float(gray) == 1).all() and to_float(gray).shape == (2, 1, 3, 3)  # default 3-value mean, 1 channel
    per_channel = to_float(gray, mean=(0.0, 0.5, 1.0), std=(1.0, 1.0, 1.0), channels=3)
    assert per_channel[0, :, 0, 0].tolist() == [1.0, 0.5, 0.0]
    with pytest.raises(ValueError, match="mean has 2 values for 3 channels"):
        to_float(gray, mean=(0.1, 0.2), channels=3)
    with pytest.raises(ValueError, match="RGB converts to grayscale; nothing else"):
        to_float(torch.zeros(1, 3, 2, 2, dtype=torch.uint8), channels=2)


def test_colour_images_for_a_grayscale_model_are_pillows_grayscale():
    """RGB read for a 1-channel model (a grayscale checkpoint fine-tuned on photos) is Image.convert("L") of the
    same pixels, bit for bit: the images `vitkit predict` would decode from the files."""
    rgb = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    rgb[0, :3] = [[255, 255, 255], [0, 0, 0], [255, 0, 0]]
    pillow = np.asarray(Image.fromarray(rgb, "RGB").convert("L"))
    batch = torch.from_numpy(rgb).permute(2, 0, 1).unsqueeze(0)
    out = to_float(batch, mean=(0.0,), std=(1 / 255,), channels=1)  # x * 255: the uint8 values as floats
    assert out.shape == (1, 1, 5, 7) and out[0, 0].round().to(torch.uint8).numpy().tolist() == pillow.tolist()
    as_float = to_float(batch.float(), mean=(0.0,), std=(1 / 255,), channels=1)  # the training path's pixels
    assert torch.equal(as_float, out)


def test_resize_uint8_and_identity():
    x = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    assert resize(x, 16) is x
    small = resize(x, 8)
    assert small.dtype == torch.uint8 and small.shape == (2, 3, 8, 8)
    # Antialiased bilinear downscaling agrees with Pillow's (the reference antialiasing filter) within 1 level.
    image = torch.randint(0, 256, (1, 3, 32, 32), dtype=torch.uint8)
    pil = Image.fromarray(image[0].permute(1, 2, 0).numpy()).resize((13, 13), Image.Resampling.BILINEAR)
    reference = torch.from_numpy(np.asarray(pil).copy()).permute(2, 0, 1)
    assert (resize(image, 13)[0].int() - reference.int()).abs().max() <= 1


def test_eval_transform_center_crop_of_wide_images():
    x = column_ramp(2, 32)[:, :, :8]  # (2, 3, 8, 32): columns 0..31
    out = eval_transform(x, 8, channels=3)
    assert out.shape == (2, 3, 8, 8)
    # Shorter side is already 8: the centre crop keeps columns 12..19, values 48..76.
    assert torch.allclose((out[0, 0, 0] + 1) * 127.5, torch.arange(12, 20).float() * 4, atol=1e-4)
    gray = eval_transform(torch.zeros(1, 1, 8, 8, dtype=torch.uint8), 16, channels=3)
    assert gray.shape == (1, 3, 16, 16) and (gray == -1).all()


# ---------------------------------------------------------------------------------------- crops
def test_inception_crop_full_scale_equals_resize():
    x = torch.randint(0, 256, (3, 3, 16, 16), dtype=torch.uint8)
    out = inception_crop(x, 32, gen(), scale=(1.0, 1.0), ratio=(1.0, 1.0))
    reference = F.interpolate(x.float(), size=(32, 32), mode="bilinear", align_corners=False).round()
    assert out.shape == (3, 3, 32, 32)
    assert (out - reference).abs().max() <= 1 and (out != reference).float().mean() < 0.01  # float ties only
    assert (out - resize(x, 32).float()).abs().max() <= 1


def test_inception_crop_box_size_and_position():
    x = column_ramp(64, 64)  # value = 4 * column
    out = inception_crop(x, 16, gen(), scale=(0.25, 0.25), ratio=(1.0, 1.0))
    span = out[:, 0, 0, -1] - out[:, 0, 0, 0]  # a 32-pixel-wide box: 4 * (32 - 32/16) = 120 between first/last centres
    assert out.shape == (64, 3, 16, 16) and ((span - 120).abs() <= 1).all()
    left = out[:, 0, 0, 0]
    assert left.min() < 20 and left.max() > 100  # boxes are placed all over the image


def test_inception_crop_fallback_is_clamped_center_crop():
    x = column_ramp(4, 64).transpose(2, 3).contiguous()  # value = 4 * row
    out = inception_crop(x, 8, gen(), scale=(1.0, 1.0), ratio=(2.0, 2.0))  # w = sqrt(2) W never fits
    # Fallback: full width, height W / 2 = 32 rows centred (rows 16..47); output row centres 18, 22, ..., 46.
    expected = (torch.arange(8) * 4 + 18).float() * 4 - 2  # bilinear at half-pixel centres: 4 * (row - 0.5)
    assert torch.allclose(out[0, 0, :, 0], expected, atol=1)
    assert all(torch.equal(out[i], out[0]) for i in range(4))


def test_pad_crop_windows_match_a_loop():
    x = torch.randint(0, 256, (8, 3, 6, 6), dtype=torch.uint8)
    out = pad_crop(x, 2, gen(3))
    padded = F.pad(x, (2, 2, 2, 2))
    for i in range(8):
        windows = [padded[i, :, r : r + 6, c : c + 6] for r in range(5) for c in range(5)]
        assert any(torch.equal(out[i], w) for w in windows)
    assert torch.equal(pad_crop(x, 0, gen()), x)


def test_flip_is_exact_mirror():
    x = torch.randint(0, 256, (32, 3, 5, 7), dtype=torch.uint8)
    out, flipped = random_flip(x, gen())
    assert 0 < int(flipped.sum()) < 32
    for i in range(32):
        assert torch.equal(out[i], x[i].flip(-1) if flipped[i] else x[i])


# ----------------------------------------------------------------------------- targets, mixing
def test_label_smoothing_values():
    targets = one_hot(torch.tensor([2, 0]), 5, smoothing=0.1)
    assert torch.allclose(targets[0], torch.tensor([0.02, 0.02, 0.92, 0.02, 0.02]))
    assert torch.allclose(targets.sum(1), torch.ones(2))
    assert torch.equal(one_hot(torch.tensor([1]), 3), torch.tensor([[0.0, 1.0, 0.0]]))


def test_mixup_targets_and_images():
    images = torch.randn(6, 3, 4, 4)
    targets = one_hot(torch.tensor([0, 1, 2, 3, 4, 0]), 5, 0.1)
    mixed, mixed_targets, lam = mixup(images, targets, 0.8, gen())
    assert 0 < lam < 1
    assert torch.allclose(mixed_targets, lam * targets + (1 - lam) * targets.flip(0))
    assert torch.allclose(mixed, lam * images + (1 - lam) * images.flip(0))
    assert torch.allclose(mixed_targets.sum(1), torch.ones(6))


def test_cutmix_lambda_is_the_unpasted_area():
    images = torch.arange(8.0).view(8, 1, 1, 1).expand(8, 3, 20, 20).contiguous()  # image i is constant i
    targets = one_hot(torch.arange(8), 8)
    for seed in range(5):
        mixed, mixed_targets, lam = cutmix(images, targets, 1.0, gen(seed))
        pasted = (mixed[0, 0] == 7).float().mean().item()  # image 0 receives pixels of image 7 (= flip(0))
        assert math.isclose(1 - lam, pasted, abs_tol=1e-6)
        assert torch.allclose(mixed_targets, lam * targets + (1 - lam) * targets.flip(0))
        assert torch.allclose(mixed_targets.sum(1), torch.ones(8))


@pytest.mark.parametrize("alpha", [0.2, 0.5, 1.0, 4.0])
def test_sample_beta_moments_and_determinism(alpha):
    g = gen(5)
    draws = torch.tensor([sample_beta(alpha, g, torch.device("cpu")) for _ in range(800)])
    assert ((draws >= 0) & (draws <= 1)).all()
    variance = 1 / (4 * (2 * alpha + 1))  # Var Beta(a, a)
    assert abs(draws.mean() - 0.5) < 4 * math.sqrt(variance / 800)
    assert abs(draws.var() / variance - 1) < 0.15
    assert sample_beta(alpha, gen(1), torch.device("cpu")) == sample_beta(alpha, gen(1), torch.device("cpu"))


# ------------------------------------------------------------------------------------ pipeline
FULL = AugmentConfig(randaugment=(2, 10), mixup=0.8, cutmix=1.0, label_smoothing=0.1)


@pytest.mark.parametrize(
    "config", [AugmentConfig(), AugmentConfig(crop="pad", flip=False), FULL, AugmentConfig(crop="none", flip=False)]
)
def test_train_transform_shapes_and_determinism(config):
    images = torch.randint(0, 256, (16, 1, 12, 12), dtype=torch.uint8)
    labels = torch.arange(16) % 10
    a = train_transform(images, labels, 10, 16, channels=3, config=config, generator=gen(7))
    b = train_transform(images, labels, 10, 16, channels=3, config=config, generator=gen(7))
    assert a[0].shape == (16, 3, 16, 16) and a[1].shape == (16, 10)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])  # same seed => identical batch
    assert a[0].min() >= -1 and a[0].max() <= 1
    assert torch.allclose(a[1].sum(1), torch.ones(16))
    if config.crop != "none":
        c = train_transform(images, labels, 10, 16, channels=3, config=config, generator=gen(8))
        assert not torch.equal(a[0], c[0])


def test_train_transform_without_augmentation_is_eval():
    images = torch.randint(0, 256, (4, 3, 16, 16), dtype=torch.uint8)
    plain = AugmentConfig(crop="none", flip=False)
    out, targets = train_transform(images, torch.tensor([0, 1, 2, 0]), 3, 16, config=plain, generator=gen())
    assert torch.equal(out, eval_transform(images, 16))
    assert torch.equal(targets, one_hot(torch.tensor([0, 1, 2, 0]), 3))


def test_random_erase_replaces_one_clipped_box_per_chosen_image():
    images = torch.full((400, 2, 10, 12), 7.0)  # no pixel of N(0, 1) noise equals 7
    out = random_erase(images, 0.5, gen(3), scale=(0.1, 0.3))
    erased = out != 7.0
    assert torch.equal(erased[:, 0], erased[:, 1])  # the same box in every channel
    chosen = erased.flatten(1).any(1)
    assert 160 < int(chosen.sum()) < 240  # p = 0.5 of 400 images
    for mask in erased[chosen, 0]:  # each box is one rectangle of 10% .. 30% of the image (up to rounding)
        rows, cols = mask.any(1).nonzero().flatten(), mask.any(0).nonzero().flatten()
        assert int(mask.sum()) == len(rows) * len(cols)
        assert len(rows) == int(rows[-1] - rows[0]) + 1 and len(cols) == int(cols[-1] - cols[0]) + 1
        assert 0.1 * 120 - 12 <= int(mask.sum()) <= 0.3 * 120 + 12
    assert torch.equal(out, random_erase(images, 0.5, gen(3), scale=(0.1, 0.3)))  # a pure function of the generator
    assert torch.equal(random_erase(images, 0.0, gen(3)), images)
    config = AugmentConfig(crop="none", flip=False, erasing=1.0)
    batch, _ = train_transform(
        torch.zeros(8, 1, 12, 12, dtype=torch.uint8),
        torch.zeros(8, dtype=torch.long),
        2,
        12,
        config=config,
        generator=gen(),
    )
    assert bool(((batch != -1).flatten(1).any(1)).all())  # every image got its box (zeros map to -1)
    with pytest.raises(ValueError, match="erasing"):
        AugmentConfig(erasing=1.5)


def test_generator_is_required_and_config_validated():
    with pytest.raises(ValueError, match="Generator"):
        train_transform(torch.zeros(1, 3, 4, 4, dtype=torch.uint8), torch.zeros(1, dtype=torch.long), 2, 4)
    with pytest.raises(ValueError, match="crop_scale"):
        AugmentConfig(crop_scale=(0.0, 1.0))
    with pytest.raises(ValueError, match="crop must be"):
        AugmentConfig(crop="random")


def test_inception_crop_antialiases_strong_downscaling():
    # A 1-pixel checkerboard averages to 127.5 grey; shrunk 8x, bilinear point sampling would alias it
    # into stripes, the pyramid keeps it near grey.
    board = ((torch.arange(128)[:, None] + torch.arange(128)) % 2 * 255).to(torch.uint8).expand(4, 1, 128, 128)
    out = inception_crop(board, 16, gen(), scale=(1.0, 1.0), ratio=(1.0, 1.0))
    assert (out - 127.5).abs().max() <= 1
    small = inception_crop(board, 16, gen(), scale=(0.02, 0.02), ratio=(1.0, 1.0))  # 18-px boxes: level 0
    assert small.std() > 30


def test_inception_flip_mirrors_the_same_crop():
    x = torch.randint(0, 256, (8, 3, 24, 24), dtype=torch.uint8)
    plain = inception_crop(x, 16, gen(4))
    mirrored = inception_crop(x, 16, gen(4), flip=1.0)  # the same boxes: the flip draw comes after them
    assert (mirrored - plain.flip(-1)).abs().max() <= 1  # equal up to rounding ties of the sample positions
    assert (mirrored != plain.flip(-1)).float().mean() < 0.01
