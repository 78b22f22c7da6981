"""Mimetic initialisation: the products it sets equal an independent computation of their targets."""

from __future__ import annotations

import math

import torch

from vitkit.models import create_model
from vitkit.models.mimetic import QK, VO, mimetic_init_


def test_products_are_the_targets_and_have_the_trained_sign() -> None:
    model = create_model(
        "vit_ti16", img_size=16, patch_size=4, num_classes=3, hidden_size=16, depth=2, num_heads=2, mlp_dim=32
    )
    mimetic_init_(model.blocks, torch.Generator().manual_seed(7))
    replay = torch.Generator().manual_seed(7)  # the same draws, in the same order
    dim, head_dim = 16, 8
    for block in model.blocks:
        q, k, v = block.attn.qkv.weight.detach().split(dim)
        for head in range(2):
            z = torch.randn(dim, dim, generator=replay) / math.sqrt(dim)
            target = QK[0] * z + QK[1] * torch.eye(dim)
            u, s, vt = torch.linalg.svd(target)
            best = (u[:, :head_dim] * s[:head_dim]) @ vt[:head_dim]  # the best rank-D_h approximation
            rows = slice(head * head_dim, (head + 1) * head_dim)
            torch.testing.assert_close(q[rows].T @ k[rows], best, atol=1e-5, rtol=1e-5)
            assert torch.trace(q[rows].T @ k[rows]) > 0  # query-key: attend to similar tokens
        z = torch.randn(dim, dim, generator=replay) / math.sqrt(dim)
        value_out = v.T @ block.attn.proj.weight.detach().T
        torch.testing.assert_close(value_out, VO[0] * z - VO[1] * torch.eye(dim), atol=1e-5, rtol=1e-5)
        assert torch.trace(value_out) < 0


def test_config_option_initialises_mimetically_and_round_trips(tmp_path) -> None:
    """`--set model.init=mimetic` reaches the model: W_v W_proj has the trained (negative) trace, and the
    official init's does not on average; the field survives a save/load round trip."""
    import vitkit

    def value_out_traces(init: str) -> list[float]:
        torch.manual_seed(0)
        model = create_model(
            "vit_ti16",
            img_size=16,
            patch_size=4,
            num_classes=3,
            hidden_size=32,
            depth=3,
            num_heads=2,
            mlp_dim=32,
            init=init,
        )
        dim = 32
        with torch.no_grad():
            return [float(torch.trace(b.attn.qkv.weight[2 * dim :].T @ b.attn.proj.weight.T)) for b in model.blocks]

    mimetic, official = value_out_traces("mimetic"), value_out_traces("official")
    assert all(t < -0.2 * 32 for t in mimetic)  # ~ -beta2 D = -12.8 (plus alpha2 tr(Z), sd ~0.4)
    assert abs(sum(official) / len(official)) < 0.2 * 32
    model = create_model(
        "vit_ti16",
        img_size=16,
        patch_size=4,
        num_classes=3,
        hidden_size=32,
        depth=1,
        num_heads=2,
        mlp_dim=32,
        init="mimetic",
    )
    vitkit.save(model, tmp_path / "m")
    assert vitkit.load(tmp_path / "m").config.init == "mimetic"
