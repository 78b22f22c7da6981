"""Sec. 3.2 surgery: position embeddings interpolated in 2D, new zero-initialised head, pre-logits kept/dropped."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import vitkit
from vitkit.checkpoints import read, surgery


def _linear_posemb(grid: int, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """E_pos[r, c] = a + r·b + c·d for random a, b, d, with a random [class] row in front."""
    g = torch.Generator().manual_seed(0)
    a, b, d, cls = (torch.randn(dim, generator=g) for _ in range(4))
    rows, cols = torch.meshgrid(
        torch.arange(grid, dtype=torch.float32), torch.arange(grid, dtype=torch.float32), indexing="ij"
    )
    table = a + rows[..., None] * b + cols[..., None] * d  # (g, g, D)
    return torch.cat([cls[None], table.reshape(-1, dim)])[None], a, b, d


def test_same_grid_is_identity(tmp_path, make_vit, images):
    posemb = torch.randn(1, 17, 32)
    assert torch.equal(surgery.resize_pos_embed(posemb, (4, 4), (4, 4), 1), posemb)
    model = make_vit()
    vitkit.save(model, tmp_path / "c")
    same = read(tmp_path / "c", img_size=32).model
    with torch.no_grad():
        assert torch.equal(same(images), model(images))


def test_linear_posemb_stays_linear_on_a_larger_grid():
    posemb, a, b, d = _linear_posemb(4, 8)
    new = surgery.resize_pos_embed(posemb, (7, 7), (4, 4), 1, "bilinear")
    assert new.shape == (1, 1 + 49, 8)
    assert torch.equal(new[:, 0], posemb[:, 0])  # [class] row kept aside
    scale = (4 - 1) / (7 - 1)  # corners map onto corners
    rows, cols = torch.meshgrid(torch.arange(7.0), torch.arange(7.0), indexing="ij")
    expected = a + (rows * scale)[..., None] * b + (cols * scale)[..., None] * d
    assert (new[0, 1:].reshape(7, 7, 8) - expected).abs().max() <= 1e-5


def test_bilinear_matches_official_scipy_zoom():
    scipy_ndimage = pytest.importorskip("scipy.ndimage")
    posemb = torch.randn(1, 1 + 16, 6, generator=torch.Generator().manual_seed(2))
    ours = surgery.resize_pos_embed(posemb, (6, 6), (4, 4), 1, "bilinear")[0, 1:].reshape(6, 6, 6)
    grid = posemb[0, 1:].reshape(4, 4, 6).numpy().astype(np.float64)
    official = scipy_ndimage.zoom(grid, (6 / 4, 6 / 4, 1), order=1)  # vit_jax checkpoint.interpolate_posembed
    assert np.abs(ours.numpy() - official).max() <= 1e-5


def test_read_at_a_new_resolution(tmp_path, make_vit):
    model = make_vit()
    vitkit.save(model, tmp_path / "c")
    bilinear = read(tmp_path / "c", img_size=48).model
    bicubic = read(tmp_path / "c", img_size=48, resample="bicubic").model
    assert bilinear.config.img_size == 48 and bilinear.pos_embed.shape == (1, 1 + 36, 32)
    assert torch.equal(bilinear.pos_embed[:, 0], model.pos_embed[:, 0])
    corners = [1, 6, 31, 36]  # bilinear keeps the corner embeddings (align_corners=True)
    assert torch.equal(bilinear.pos_embed[0, corners], model.pos_embed[0, [1, 4, 13, 16]])
    assert not torch.allclose(bilinear.pos_embed, bicubic.pos_embed)
    with torch.no_grad():
        assert bilinear(torch.randn(1, 3, 48, 48)).shape == (1, 5)
    for key in ("blocks.0.attn.qkv.weight", "head.weight"):
        assert torch.equal(bilinear.state_dict()[key], model.state_dict()[key])


def test_new_head_is_zero_and_replaces_pre_logits(tmp_path, make_vit, images):
    vitkit.save(make_vit(representation_size=16), tmp_path / "c")
    model = read(tmp_path / "c", num_classes=7).model
    assert isinstance(model.pre_logits, nn.Identity) and model.head.weight.shape == (7, 32)
    assert model.config.num_classes == 7 and model.config.representation_size is None
    with torch.no_grad():
        assert torch.equal(model(images), torch.zeros(2, 7))
    kept = read(tmp_path / "c", num_classes=7, pre_logits="keep").model
    assert not isinstance(kept.pre_logits, nn.Identity) and kept.head.weight.shape == (7, 16)
    assert kept.config.representation_size == 16 and not kept.head.weight.detach().any()
    half = surgery.replace_head(make_vit(representation_size=16).to(torch.bfloat16), 3, "keep")
    assert half.head.weight.dtype == torch.bfloat16  # in the model's dtype (and device): it had been fp32 on the CPU
    with torch.no_grad():
        assert half(images.to(torch.bfloat16)).shape == (2, 3)


def test_pre_logits_drop(tmp_path, make_vit):
    vitkit.save(make_vit(representation_size=16), tmp_path / "head")
    with pytest.raises(ValueError, match="trained head"):
        read(tmp_path / "head", pre_logits="drop")
    vitkit.save(make_vit(representation_size=16, num_classes=0), tmp_path / "features")
    model = read(tmp_path / "features", pre_logits="drop").model
    assert isinstance(model.pre_logits, nn.Identity) and model.config.representation_size is None
    with pytest.raises(ValueError, match="pre_logits must be"):
        read(tmp_path / "features", pre_logits="maybe")
