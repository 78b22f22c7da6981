"""The CPU inference fast path of the MLP block (oneDNN dense + GELU in one kernel) computes the same function."""

from __future__ import annotations

import pytest
import torch

import torch.nn.functional as F

from vitkit.models import create_model, kernels

TINY = dict(num_classes=5, img_size=32, patch_size=8, hidden_size=32, depth=2, num_heads=2, mlp_dim=64)


def _model(gelu: str):
    model = create_model("vit_ti16", gelu=gelu, **TINY).eval()
    torch.nn.init.normal_(model.head.weight, std=0.5)
    return model


@pytest.mark.parametrize("gelu", ["tanh", "exact"])
def test_fused_mlp_equals_two_ops_fp32(gelu: str) -> None:
    model, x = _model(gelu), torch.randn(3, 17, 32)
    mlp = model.blocks[0].mlp
    reference = F.gelu(mlp.fc1(x), approximate=mlp.approximate).detach()
    with torch.no_grad():
        fused = kernels.fused_linear_gelu(x, mlp.fc1, mlp.approximate)
    if fused is None:
        pytest.skip("no oneDNN fused linear in this torch build")
    assert (fused - reference).abs().max() <= 1e-5 * reference.abs().max()
    images = torch.randn(2, 3, 32, 32)
    with_grad = model(images).detach()  # autograd on: the two plain ops
    with torch.inference_mode():
        assert kernels.cpu_inference(torch.zeros(1))
        inference = model(images)  # the fused path
    assert (inference - with_grad).abs().max() <= 1e-5 * with_grad.abs().max()


def test_fused_mlp_under_bf16_autocast() -> None:
    model, images = _model("tanh"), torch.randn(2, 3, 32, 32)
    reference = model(images).detach()  # fp32, plain ops
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(images)
        hidden = kernels.fused_linear_gelu(torch.randn(2, 17, 32), model.blocks[0].mlp.fc1, "tanh")
    if hidden is None:
        pytest.skip("no oneDNN fused linear in this torch build")
    assert hidden.dtype == torch.bfloat16  # cast as autocast would cast a dense layer
    assert out.dtype == torch.bfloat16
    assert (out.float() - reference).abs().max() <= 3e-2 * reference.abs().max()  # bf16 tolerance


def test_fused_path_only_without_autograd_or_tracing() -> None:
    x = torch.zeros(1)
    assert not kernels.cpu_inference(x)  # autograd on: training keeps the differentiable ops
    with torch.no_grad():
        assert kernels.cpu_inference(x)
        assert not kernels.cpu_inference(torch.zeros(1, device="meta"))
    model = _model("tanh")
    images = torch.randn(2, 3, 32, 32, requires_grad=True)
    model(images).sum().backward()  # gradients flow through the plain path
    assert images.grad is not None and model.blocks[0].mlp.fc1.weight.grad.abs().sum() > 0
