"""The CPU inference fast path of the MLP block (oneDNN dense + GELU in one kernel) computes the same function."""

from __future__ import annotations

import platform

import pytest
import torch
import torch.nn.functional as F

from vitkit import device
from vitkit.models import create_model, kernels

TINY = dict(num_classes=5, img_size=32, patch_size=8, hidden_size=32, depth=2, num_heads=2, mlp_dim=64)


REAL_FUSED_IS_FASTER = kernels._fused_is_faster


@pytest.fixture(autouse=True)
def fresh_probes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test probes the kernels afresh (the probes are once per process), and the fused kernel counts as the
    faster one unless a test times it."""
    monkeypatch.setattr(kernels, "_probes", {})
    monkeypatch.setattr(kernels, "_faster", {})
    monkeypatch.setattr(kernels, "_fused_is_faster", lambda *args: True)


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
    """Where oneDNN has a bf16 dense + GELU (native bf16) it runs; elsewhere the probe turns it off and the
    plain ops give the same function: either way the model's bf16 output matches fp32's."""
    model, images = _model("tanh"), torch.randn(2, 3, 32, 32)
    reference = model(images).detach()  # fp32, plain ops
    tokens, fc1 = torch.randn(2, 17, 32), model.blocks[0].mlp.fc1
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(images)
        hidden = kernels.fused_linear_gelu(tokens, fc1, "tanh")
        plain = F.gelu(fc1(tokens), approximate="tanh")
    if kernels.cpu_native_bf16():
        assert hidden is not None and hidden.dtype == torch.bfloat16  # cast as autocast would cast a dense layer
    elif platform.machine().lower() in ("x86_64", "amd64"):  # oneDNN has no such bf16 primitive there
        assert hidden is None and kernels._probes[(kernels.FUSED_LINEAR_GELU, torch.bfloat16)] is False
    elif hidden is not None:  # elsewhere (ARM without native bf16) it may run, where its probe matched the plain ops
        assert (hidden.float() - plain.float()).abs().max() <= 3e-2 * plain.float().abs().max()
    assert out.dtype == torch.bfloat16
    assert (out.float() - reference).abs().max() <= 3e-2 * reference.abs().max()  # bf16 tolerance


def _plain_inference(model, images):
    """The model's inference output with the fused kernel switched off by hand."""
    with torch.inference_mode():
        kernels._probes[(kernels.FUSED_LINEAR_GELU, torch.float32)] = False
        out = model(images)
        del kernels._probes[(kernels.FUSED_LINEAR_GELU, torch.float32)]
    return out


def test_a_failing_probe_runs_the_plain_ops(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    model, images = _model("tanh"), torch.randn(2, 3, 32, 32)
    expected = _plain_inference(model, images)

    def broken(*args: object) -> torch.Tensor:
        raise RuntimeError("could not create a primitive descriptor for the inner product")

    monkeypatch.setattr(kernels, "_linear_pointwise", broken)
    with torch.inference_mode():
        first, second = model(images), model(images)
    assert torch.equal(first, expected) and torch.equal(second, expected)  # the plain ops, bit for bit
    assert kernels._probes[(kernels.FUSED_LINEAR_GELU, torch.float32)] is False
    assert sum("is off on this host" in r.message for r in caplog.records) == 1  # logged once


def test_a_kernel_failing_mid_run_falls_back_for_good(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model, images = _model("tanh"), torch.randn(2, 3, 32, 32)
    expected = _plain_inference(model, images)
    calls = []

    def fails_on_big_inputs(x, weight, bias, approximate):  # passes the probe's small input, fails the model's
        calls.append(x.shape)
        if x.shape[0] > 2:
            raise RuntimeError("oneDNN: out of resources")
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "gelu", [], approximate)

    monkeypatch.setattr(kernels, "_linear_pointwise", fails_on_big_inputs)
    big = torch.randn(3, 3, 32, 32)
    with torch.inference_mode():
        out = model(big)
        again = model(big)
    with torch.inference_mode():
        kernels._probes[(kernels.FUSED_LINEAR_GELU, torch.float32)] = False
        plain = model(big)
    assert torch.equal(out, plain) and torch.equal(again, plain)
    assert len(calls) == 3  # two probe calls (tanh, exact), one failed call; none after it
    assert sum("failed" in r.message and "plain ops run from now on" in r.message for r in caplog.records) == 1
    assert expected.shape == (2, 5)


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


def test_the_fused_kernel_runs_only_where_it_measures_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    """Timed once per shape class: where the dense layer + GELU measure faster (oneDNN's AVX2 dense layer can
    lose to BLAS's), the plain ops run, with the plain ops' result bit for bit."""
    monkeypatch.undo()
    monkeypatch.setattr(kernels, "_probes", {})
    monkeypatch.setattr(kernels, "_faster", {})
    ticks = iter(range(1000))
    monkeypatch.setattr(device.time, "perf_counter", lambda: next(ticks))
    calls = []
    real = kernels._linear_pointwise

    def slow_fused(*args):  # each timed call of the fused kernel costs an extra tick: it measures slower
        calls.append(1)
        next(ticks)
        return real(*args)

    monkeypatch.setattr(kernels, "_linear_pointwise", slow_fused)
    fc = torch.nn.Linear(24, 40)
    x = torch.randn(5, 24)
    with torch.inference_mode():
        assert kernels.fused_linear_gelu(x, fc, "tanh") is None and kernels.fused_linear_gelu(x, fc, "tanh") is None
        out = kernels.linear_gelu(x, fc, "tanh")
    assert list(kernels._faster.values()) == [False] and len(kernels._faster) == 1  # timed once: (f32, tanh, 8, 40, 24)
    assert torch.equal(out, kernels.gelu(torch.nn.functional.linear(x, fc.weight, fc.bias), "tanh"))
    assert len(calls) == 2 + device.TIMING_WARMUP + device.TIMING_ROUNDS  # correctness probe, then the timing


def test_a_plain_path_slow_only_while_cold_is_timed_at_its_steady_speed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first calls of a process can be slow (thread pool, allocator); the choice alternates the two paths
    after warming both, so a plain path that is cold for its first three calls still wins where it is faster."""
    now = [0.0]
    monkeypatch.setattr(device.time, "perf_counter", lambda: now[0])

    def costing(costs):
        seq = iter(costs)

        def run():
            now[0] += next(seq)

        return run

    fused = costing([22.0] * 20)  # oneDNN's dense + GELU on an AVX2 host: steady
    plain = costing([250.0, 30.0, 30.0] + [16.0] * 17)  # BLAS dense + GELU: cold for three calls, then faster
    assert not device.first_is_faster(fused, plain)
    assert device.first_is_faster(costing([15.0] * 20), costing([250.0, 30.0, 30.0] + [16.0] * 17))


def test_the_fused_kernel_must_win_by_its_margin_so_processes_agree(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the two paths run about as fast, load could tip two processes different ways and their numbers
    would differ in the last bits: the fused kernel is kept only when it is FUSED_MARGIN faster."""
    now = [0.0]
    monkeypatch.setattr(device.time, "perf_counter", lambda: now[0])

    def costing(cost):
        def run():
            now[0] += cost

        return run

    margin = kernels.FUSED_MARGIN
    assert margin > 1 and device.first_is_faster(costing(10.0), costing(10.1))  # no margin: the faster wins
    assert not device.first_is_faster(costing(10.0), costing(10.0 * margin - 0.01), margin=margin)
    assert device.first_is_faster(costing(10.0), costing(10.0 * margin + 0.01), margin=margin)
    asked: list[float] = []

    def timing(first, second, margin=1.0):
        asked.append(margin)
        return False

    monkeypatch.setattr(kernels, "_fused_is_faster", REAL_FUSED_IS_FASTER)  # the fixture's stand-in out
    monkeypatch.setattr(kernels, "first_is_faster", timing)
    fc, x = torch.nn.Linear(24, 40), torch.randn(5, 24)
    with torch.inference_mode():
        assert kernels.fused_linear_gelu(x, fc, "tanh") is None  # the timing (or the probe) says plain
    runs_here = kernels._probes[(kernels.FUSED_LINEAR_GELU, torch.float32)]  # the correctness probe's verdict
    assert asked == ([margin] if runs_here else [])
