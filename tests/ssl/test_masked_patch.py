"""Masked patch prediction (App. B.1.2): corruption statistics, targets, loss positions."""

from __future__ import annotations

import math

import pytest
import torch

from vitkit.models import create_model
from vitkit.ssl.masked_patch import (
    KEPT,
    MASKED,
    RANDOM,
    UNTOUCHED,
    MaskedPatchPrediction,
    MPPConfig,
    corrupt,
    downsampled_target,
    evaluate_mpp,
    mean_color_target,
    mpp_loss,
    patchify,
    quantize_colors,
    to_pixels,
)


def tiny_vit(**overrides):
    """The standard tiny test config: D=32, L=2, k=2, 32x32, P=8 (16 patches)."""
    fields = dict(hidden_size=32, depth=2, num_heads=2, mlp_dim=64, patch_size=8, num_classes=0)
    return create_model("vit_ti16", img_size=32, **{**fields, **overrides})


def binomial_tolerance(n: int, p: float, sigmas: float = 5.0) -> float:
    """Half-width of a 5-sigma band for a proportion estimated from n Bernoulli(p) draws."""
    return sigmas * math.sqrt(p * (1 - p) / n)


def normalise(pixels_uint8: torch.Tensor) -> torch.Tensor:
    return pixels_uint8.float() / 127.5 - 1.0  # the official [-1, 1] scaling (mean = std = 0.5)


def test_corruption_rate_is_exact_per_image_and_uniform_over_positions():
    batch, num, dim = 2000, 16, 4
    tokens = torch.randn(batch, num, dim)
    _, mask, kind = corrupt(tokens, torch.zeros(dim), torch.Generator().manual_seed(1))
    assert torch.equal(mask.sum(1), torch.full((batch,), num // 2))  # exactly 50% of each image
    assert torch.equal(mask, kind != UNTOUCHED)
    per_position = mask.float().mean(0)  # each slot selected with probability 1/2
    tol = binomial_tolerance(batch, 0.5)
    assert (per_position - 0.5).abs().max() < tol


def test_corruption_split_is_80_10_10_within_sampling_error():
    batch, num, dim = 4000, 16, 4
    _, mask, kind = corrupt(torch.randn(batch, num, dim), torch.zeros(dim), torch.Generator().manual_seed(2))
    selected = int(mask.sum())
    for value, p in ((MASKED, 0.8), (RANDOM, 0.1), (KEPT, 0.1)):
        share = float((kind == value).sum()) / selected
        assert abs(share - p) < binomial_tolerance(selected, p), (value, share)


def test_bert_rate_and_custom_split():
    batch, num, dim = 1000, 20, 4
    _, mask, kind = corrupt(
        torch.randn(batch, num, dim),
        torch.zeros(dim),
        torch.Generator().manual_seed(3),
        rate=0.15,
        replace=(1.0, 0.0, 0.0),
    )
    assert torch.equal(mask.sum(1), torch.full((batch,), 3))  # round(0.15 * 20)
    assert torch.equal(kind[mask], torch.full((batch * 3,), MASKED))


def test_corrupted_values_are_mask_token_donor_or_original():
    batch, num, dim = 64, 16, 8
    tokens = torch.randn(batch, num, dim)
    mask_token = torch.randn(dim)
    out, _, kind = corrupt(tokens, mask_token, torch.Generator().manual_seed(4))
    keep = (kind == UNTOUCHED) | (kind == KEPT)
    assert torch.equal(out[keep], tokens[keep])
    assert torch.equal(out[kind == MASKED], mask_token.expand(int((kind == MASKED).sum()), dim))
    flat = tokens.reshape(-1, dim)
    positions = torch.nonzero((kind == RANDOM).reshape(-1)).squeeze(1)
    assert len(positions) > 0
    for position in positions.tolist():  # a donor is another patch of the batch, never the patch itself
        row = out.reshape(-1, dim)[position]
        matches = torch.nonzero((flat == row).all(1)).squeeze(1).tolist()
        assert matches and position not in matches


def test_same_generator_seed_same_corruption():
    tokens = torch.randn(8, 16, 4)
    a = corrupt(tokens, torch.zeros(4), torch.Generator().manual_seed(7))
    b = corrupt(tokens, torch.zeros(4), torch.Generator().manual_seed(7))
    c = corrupt(tokens, torch.zeros(4), torch.Generator().manual_seed(8))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[1], c[1])


@pytest.mark.parametrize(
    ("rgb", "index"),
    [
        ((255, 0, 0), 7 * 64),
        ((0, 0, 0), 0),
        ((255, 255, 255), 511),
        ((128, 128, 128), 4 * 73),
        ((127, 127, 127), 3 * 73),
        ((0, 255, 0), 7 * 8),
        ((0, 0, 255), 7),
        ((32, 64, 96), 1 * 64 + 2 * 8 + 3),
        ((31, 63, 95), 0 * 64 + 1 * 8 + 2),
    ],
)
def test_mean_color_of_constant_patches(rgb, index):
    image = torch.tensor(rgb, dtype=torch.uint8).view(1, 3, 1, 1).expand(1, 3, 16, 16)
    pixels = to_pixels(normalise(image), (0.5,) * 3, (0.5,) * 3)
    assert torch.equal(mean_color_target(pixels, 8), torch.full((1, 4), index))


def test_mean_color_averages_over_the_patch_and_follows_raster_order():
    image = torch.zeros(1, 3, 16, 16, dtype=torch.uint8)
    image[0, 0, :8, 8:] = 255  # top-right patch: red
    image[0, 1, 8:, :8] = 255  # bottom-left patch: green
    image[0, 2, 8:, 8:12] = 255  # bottom-right patch: half blue -> mean 127.5 -> level 3
    pixels = to_pixels(normalise(image), (0.5,) * 3, (0.5,) * 3)
    assert mean_color_target(pixels, 8).tolist() == [[0, 448, 56, 3]]


def test_grayscale_has_eight_classes_and_other_normalisations_are_undone():
    gray = (
        torch.tensor([0, 40, 128, 255], dtype=torch.uint8).view(1, 1, 1, 4).repeat_interleave(4, 3).expand(1, 1, 4, 16)
    )
    mean, std = (0.2860,), (0.3530,)
    x = (gray.float() / 255 - mean[0]) / std[0]
    assert mean_color_target(to_pixels(x, mean, std), 4).tolist() == [[0, 1, 4, 7]]
    assert quantize_colors(torch.tensor([[255.0, 255.0]]), bits=1).tolist() == [3]


def test_downsampled_target_shape_and_values():
    image = torch.zeros(2, 3, 16, 16, dtype=torch.uint8)
    image[:, 0, 0:2, 0:2] = 255  # first 2x2 cell of patch 0 red
    image[:, 2, 6:8, 6:8] = 255  # last cell of patch 0 blue
    image[:, 1, 8:16, 8:16] = 160  # patch 3 green level 5 everywhere
    image[1, :, 0, 10] = 255  # one white pixel in a cell of patch 1: cell mean 63.75 -> level 1 everywhere
    pixels = to_pixels(normalise(image), (0.5,) * 3, (0.5,) * 3)
    target = downsampled_target(pixels, 8)
    assert target.shape == (2, 4, 16)
    expected0 = torch.zeros(16, dtype=torch.long)
    expected0[0], expected0[15] = 448, 7
    assert torch.equal(target[0, 0], expected0) and torch.equal(target[1, 0], expected0)
    assert torch.equal(target[:, 3], torch.full((2, 16), 5 * 8))
    assert target[0, 1].sum() == 0
    expected1 = torch.zeros(16, dtype=torch.long)
    expected1[1] = 73  # cell (row 0, col 1) of patch 1 holds pixel column 10
    assert torch.equal(target[1, 1], expected1)


def test_pixel_target_equals_patchify_by_slicing():
    images = torch.randn(2, 3, 32, 32)
    flat = patchify(images, 8)
    assert flat.shape == (2, 16, 8 * 8 * 3)
    for index in (0, 5, 15):
        row, col = divmod(index, 4)
        patch = images[1, :, row * 8 : row * 8 + 8, col * 8 : col * 8 + 8].permute(1, 2, 0).reshape(-1)
        assert torch.equal(flat[1, index], patch)
    model = MaskedPatchPrediction(tiny_vit(), MPPConfig(target="pixels"))
    assert torch.equal(model.targets(images), flat)


@pytest.mark.parametrize("target", ["mean_color", "downsampled", "pixels"])
def test_loss_ignores_uncorrupted_positions(target):
    model = MaskedPatchPrediction(tiny_vit(), MPPConfig(target=target))
    images = torch.rand(3, 3, 32, 32) * 2 - 1
    out = model(images, torch.Generator().manual_seed(0))
    mask, preds = out["mask"], out["predictions"].detach().clone().requires_grad_(True)
    loss = mpp_loss(preds, out["targets"], mask)[0]
    loss.backward()
    assert preds.grad[~mask].abs().max() == 0 and preds.grad[mask].abs().max() > 0
    changed = preds.detach().clone()
    changed[~mask] = torch.randn_like(changed[~mask]) * 100
    assert torch.equal(mpp_loss(changed, out["targets"], mask)[0], loss.detach())
    if target != "pixels":  # the zero-initialised head predicts uniformly: loss = log(512) exactly
        assert abs(float(out["loss"].detach()) - math.log(512)) < 1e-5


def test_forward_gradients_reach_encoder_mask_token_and_head():
    model = MaskedPatchPrediction(tiny_vit(), MPPConfig())
    nn_init = torch.nn.init
    nn_init.normal_(model.head.weight, std=0.02)  # a non-zero head, as after a few steps
    images = torch.rand(4, 3, 32, 32) * 2 - 1
    out = model(images, torch.Generator().manual_seed(0))
    out["loss"].backward()
    assert out["predictions"].shape == (4, 16, 512)
    assert model.mask_token.grad.abs().sum() > 0
    assert model.encoder.patch_embed.proj.weight.grad.abs().sum() > 0
    assert 0.0 <= float(out["accuracy"]) <= 1.0


def test_corruption_happens_before_position_embeddings():
    """A [mask] token at two different slots gives different outputs: E_pos is added after corruption."""
    model = MaskedPatchPrediction(tiny_vit(), MPPConfig(replace=(1.0, 0.0, 0.0), corrupt_rate=1.0)).eval()
    images = torch.rand(1, 3, 32, 32) * 2 - 1
    z, mask, kind = model.encode_corrupted(images, torch.Generator().manual_seed(0))
    assert bool(mask.all()) and bool((kind == MASKED).all())
    assert not torch.allclose(z[0, 0], z[0, 1])
    # every patch is the same [mask] token, so the output depends on the image not at all
    z2, _, _ = model.encode_corrupted(torch.rand(1, 3, 32, 32), torch.Generator().manual_seed(0))
    assert torch.allclose(z, z2)


def test_uncorrupted_path_matches_the_encoder():
    """With nothing replaced (rate 1, all kept) the wrapped forward equals the ViT's own encode()."""
    vit = tiny_vit().eval()
    model = MaskedPatchPrediction(vit, MPPConfig(replace=(0.0, 0.0, 1.0), corrupt_rate=1.0))
    images = torch.rand(2, 3, 32, 32) * 2 - 1
    z, _, _ = model.encode_corrupted(images, torch.Generator().manual_seed(0))
    reference, _ = vit.encode(images)
    assert torch.allclose(z, reference[:, 1:], atol=1e-6)


def test_grayscale_model_predicts_eight_classes():
    model = MaskedPatchPrediction(tiny_vit(in_chans=1), MPPConfig())
    out = model(torch.rand(2, 1, 32, 32) * 2 - 1, torch.Generator().manual_seed(0))
    assert model.num_colors == 8 and out["predictions"].shape == (2, 16, 8)
    assert int(out["targets"].max()) < 8


def test_bad_configs_are_refused():
    with pytest.raises(ValueError, match="replace"):
        MPPConfig(replace=(0.5, 0.1, 0.1))
    with pytest.raises(ValueError, match="target"):
        MPPConfig(target="colour")
    with pytest.raises(ValueError, match="corrupt_rate"):
        MPPConfig(corrupt_rate=0.0)
    with pytest.raises(ValueError, match="smaller"):
        MaskedPatchPrediction(tiny_vit(patch_size=2), MPPConfig(target="downsampled"))


def test_hybrid_encoder_predicts_per_backbone_cell():
    """A hybrid's token covers stride x stride pixels (Sec. 3.1); targets use that patch size."""
    from vitkit.models import build_model
    from vitkit.models.configs import HybridConfig, ViTConfig

    vit = ViTConfig(img_size=32, patch_size=1, hidden_size=32, depth=1, num_heads=2, mlp_dim=64, num_classes=0)
    model = MaskedPatchPrediction(build_model(HybridConfig(vit=vit, resnet_layers=(1, 1))), MPPConfig())
    assert model.patch_pixels == 8
    images = torch.rand(2, 3, 32, 32) * 2 - 1
    out = model(images, torch.Generator().manual_seed(0))
    assert out["predictions"].shape == (2, 16, 512)
    assert torch.equal(out["targets"], mean_color_target(to_pixels(images, (0.5,) * 3, (0.5,) * 3), 8))


def test_evaluation_tells_progress_before_each_batch():
    """A run's stall watch hears of each batch of MPP's final evaluation, as of a classifier's."""
    model = MaskedPatchPrediction(tiny_vit(), MPPConfig())
    images = torch.randint(0, 256, (10, 3, 32, 32), dtype=torch.uint8)
    told = []
    result = evaluate_mpp(
        model, images, 32, (0.5,) * 3, (0.5,) * 3, torch.device("cpu"), batch_size=4, progress=lambda: told.append(1)
    )
    assert len(told) == 3 and math.isfinite(result["loss"])  # batches of 4, 4 and 2


def test_a_signal_ends_the_evaluation_before_its_next_batch_and_leaves_the_mode_as_it_was():
    """MPP's periodic evaluation read no signal: a SIGTERM waited for every batch, past a scheduler's SIGKILL."""
    import signal

    from vitkit.eval.evaluator import EvaluationInterrupted

    model = MaskedPatchPrediction(tiny_vit(), MPPConfig()).train()
    images = torch.randint(0, 256, (10, 3, 32, 32), dtype=torch.uint8)
    reads, forwards = [], []
    model.register_forward_hook(lambda *_: forwards.append(1))

    def interrupted() -> int:
        reads.append(1)
        return int(signal.SIGTERM) if len(reads) == 2 else 0

    with pytest.raises(EvaluationInterrupted) as stopped:
        evaluate_mpp(model, images, 32, (0.5,) * 3, (0.5,) * 3, torch.device("cpu"), 4, interrupted=interrupted)
    assert stopped.value.signum == signal.SIGTERM and len(reads) == 2 and len(forwards) == 1 and model.training
