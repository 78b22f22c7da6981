"""The fast attention paths compute what the reference computes, values and gradients.

The reference is fp32 with torch's SDPA kernel.  The explicit path (Eq. 5-7 spelt out) must equal it to
1e-5 in fp32 (logits absolutely, gradients relative to each tensor's largest entry).  Under bf16 autocast
("auto" on CPU picks the explicit path there) the stated tolerances against the fp32 reference are:
logits within 3e-2 of their largest magnitude; each parameter gradient within 6e-2 of its largest entry
and at cosine >= 0.999.  bf16 keeps 8 significand bits (relative step 2^-8 ~ 4e-3 per rounding); measured
on this 2-block model: logits 1.3e-2, gradients 3.4e-2 / cosine 0.9998 -- no worse than torch's own SDPA
kernel under the same autocast (1.0e-2, 4.4e-2 / 0.9997), which the last check asserts.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from vitkit.models import create_model, kernels

TINY = dict(num_classes=5, img_size=32, patch_size=8, hidden_size=32, depth=2, num_heads=2, mlp_dim=64)
BF16_TOL = 3e-2  # logits
BF16_GRAD_TOL = 6e-2  # gradients, relative to each tensor's largest entry


def _pair(**extra):
    """Two models with identical weights (and a non-zero head, so every weight gets a gradient)."""
    fast_impl = extra.pop("fast_impl", "explicit")
    torch.manual_seed(0)
    ref = create_model("vit_ti16", attn_impl="sdpa", **TINY, **extra)
    torch.nn.init.normal_(ref.head.weight, std=0.5)
    torch.nn.init.normal_(ref.head.bias, std=0.5)
    fast = create_model("vit_ti16", attn_impl=fast_impl, **TINY, **extra)
    fast.load_state_dict(ref.state_dict())
    return ref, fast


def _run(model, images, labels, bf16: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(images)
    F.cross_entropy(logits.float(), labels).backward()
    return logits.float().detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _max_rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item()


@pytest.mark.parametrize("posemb", ["learned_1d", "relative"])
def test_explicit_equals_sdpa_fp32_values_and_gradients(posemb: str) -> None:
    ref, fast = _pair(posemb=posemb)
    images, labels = torch.randn(3, 3, 32, 32), torch.tensor([0, 3, 4])
    ref_logits, ref_grads = _run(ref, images, labels, bf16=False)
    fast_logits, fast_grads = _run(fast, images, labels, bf16=False)
    assert (fast_logits - ref_logits).abs().max() <= 1e-5
    for name, grad in ref_grads.items():  # gradients reach ~50 here: 1e-5 of each tensor's scale
        assert _max_rel(fast_grads[name], grad) <= 1e-5, name
    assert ref_grads["blocks.0.attn.qkv.weight"].abs().max() > 1e-3  # gradients reach the attention


def test_auto_bf16_path_matches_fp32_reference_within_tolerance() -> None:
    ref, fast = _pair(fast_impl="auto")
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    ref_logits, ref_grads = _run(ref, images, labels, bf16=False)
    fast_logits, fast_grads = _run(fast, images, labels, bf16=True)
    assert 0 < _max_rel(fast_logits, ref_logits) <= BF16_TOL  # > 0: bf16 was really used
    for name, grad in ref_grads.items():
        assert _max_rel(fast_grads[name], grad) <= BF16_GRAD_TOL, name
        assert F.cosine_similarity(fast_grads[name].flatten(), grad.flatten(), dim=0) >= 0.999, name
    # torch's SDPA kernel under the same autocast is no closer to fp32 than the explicit path (within 2x)
    sdpa_logits, sdpa_grads = _run(ref, images, labels, bf16=True)
    assert _max_rel(fast_logits, ref_logits) <= 2 * _max_rel(sdpa_logits, ref_logits)
    worst_fast = max(_max_rel(fast_grads[n], g) for n, g in ref_grads.items())
    worst_sdpa = max(_max_rel(sdpa_grads[n], g) for n, g in ref_grads.items())
    assert worst_fast <= 2 * worst_sdpa


def test_auto_dispatch_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    model = create_model("vit_ti16", **TINY)
    attn = model.blocks[0].attn
    q32 = torch.zeros(1, 2, 4, 16)
    assert attn.attn_impl == "auto"
    monkeypatch.setattr(kernels, "cpu_native_bf16", lambda: True)
    assert kernels.explicit_attention(attn.attn_impl, q32.bfloat16()) and kernels.explicit_attention("auto", q32.half())
    assert not kernels.explicit_attention("auto", q32)  # fp32 on CPU: SDPA
    monkeypatch.setattr(kernels, "cpu_native_bf16", lambda: False)  # bf16 emulated in software: SDPA
    assert not kernels.explicit_attention("auto", q32.bfloat16()) and not kernels.explicit_attention("auto", q32.half())
    assert not kernels.explicit_attention("sdpa", q32.bfloat16())
    assert kernels.explicit_attention("explicit", q32)


@pytest.mark.parametrize("impl", ["auto", "sdpa", "explicit"])
def test_weights_only_when_asked(impl: str) -> None:
    model = create_model("vit_ti16", attn_impl=impl, **TINY).eval()
    x = torch.randn(2, 17, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, weights = model.blocks[0].attn(x)
        out_w, weights_w = model.blocks[0].attn(x, need_weights=True)
    assert weights is None
    assert weights_w.shape == (2, 2, 17, 17)
    assert torch.allclose(weights_w.float().sum(-1), torch.ones(2, 2, 17), atol=1e-2)
    assert _max_rel(out.float(), out_w.float()) <= BF16_TOL


def test_bad_attn_impl_is_rejected() -> None:
    with pytest.raises(ValueError, match="attn_impl"):
        create_model("vit_ti16", attn_impl="flash", **TINY)


def test_training_in_bf16_does_not_change_stored_weights_dtype() -> None:
    _, fast = _pair(fast_impl="auto")
    before = copy.deepcopy(fast.state_dict())
    _run(fast, torch.randn(2, 3, 32, 32), torch.tensor([0, 1]), bf16=True)
    assert all(p.dtype == torch.float32 for p in fast.parameters())
    assert all(torch.equal(before[k], v) for k, v in fast.state_dict().items())  # backward alone updates nothing


@pytest.mark.parametrize("tokens", [17, 31, 32, 50])
def test_softmax_path_by_row_length(tokens: int) -> None:
    logits = (4 * torch.randn(3, 2, tokens, tokens)).to(torch.bfloat16)
    want = (
        logits.float().softmax(-1).to(torch.bfloat16)
        if tokens < 32  # fp32, rounded once
        else logits.softmax(-1)
    )  # torch's bf16 kernel
    got = kernels.softmax(logits)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    torch.testing.assert_close(got.float(), logits.float().softmax(-1), atol=8e-3, rtol=0)  # bf16 of the truth
    assert torch.equal(kernels.softmax(logits.float()), logits.float().softmax(-1))  # fp32 untouched
