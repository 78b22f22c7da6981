"""models/kernels.py computes the functions it replaces: the tanh GELU against F.gelu(approximate="tanh").

Stated tolerance (kernels.gelu's docstring): values within 1e-6 max(|x|, 1) in fp32 and within one bf16
step at max(|x|, 1), 2^-7 max(|x|, 1), in bf16; input gradients are torch's own gelu_backward kernel,
hence equal to F.gelu's bit for bit.  Measured: 2.2e-7 (fp32) and 6.8e-3 (bf16) relative to max(|x|, 1);
in the far negative tail vitkit's result is the closer one to the float64 truth (torch's 1 + tanh(...)
cancels there).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vitkit.models import create_model, kernels

TINY = dict(num_classes=5, img_size=32, patch_size=8, hidden_size=32, depth=2, num_heads=2, mlp_dim=64)


def _values_and_grads(fn, x: torch.Tensor, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = x.detach().clone().requires_grad_()
    out = fn(leaf)
    out.backward(grad)
    return out.detach(), leaf.grad


def _torch_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _vitkit_tanh(x: torch.Tensor) -> torch.Tensor:
    return kernels.gelu(x, "tanh")


def test_tanh_gelu_fp32_values_and_gradients() -> None:
    x = torch.cat([torch.linspace(-20, 20, 400_001), 3 * torch.randn(100_000)])
    grad = torch.randn_like(x)
    value, x_grad = _values_and_grads(_vitkit_tanh, x, grad)
    ref_value, ref_grad = _values_and_grads(_torch_tanh, x, grad)
    deviation = ((value - ref_value).abs() / x.abs().clamp_min(1.0)).max().item()
    assert 0 < deviation <= 1e-6  # > 0: really another computation
    assert torch.equal(x_grad, ref_grad)  # torch's backward kernel on the same input
    truth = F.gelu(x.double(), approximate="tanh")
    tail = x < -4  # there 1 + tanh(...) cancels in torch's fp32 kernel; x sigmoid(2u) does not
    assert (value.double() - truth)[tail].abs().max() <= (ref_value.double() - truth)[tail].abs().max()


def test_tanh_gelu_bf16_every_value() -> None:
    every = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    x = every[torch.isfinite(every) & (every.float().abs() <= 12)]  # 32,000-odd bf16 numbers
    grad = torch.randn(x.shape).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        value, x_grad = _values_and_grads(_vitkit_tanh, x, grad)
        ref_value, ref_grad = _values_and_grads(_torch_tanh, x, grad)
    assert value.dtype == torch.bfloat16 and x_grad.dtype == torch.bfloat16
    deviation = ((value.float() - ref_value.float()).abs() / x.float().abs().clamp_min(1.0)).max().item()
    assert 0 < deviation <= 2**-7
    assert (value != ref_value).float().mean() < 0.05  # mostly the same bf16 number
    assert torch.equal(x_grad, ref_grad)


def test_tanh_gelu_special_values_and_other_dtypes() -> None:
    special = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e30, -1e30, 0.0, -0.0, 1e-30, 30.0, -30.0])
    torch.testing.assert_close(_vitkit_tanh(special), _torch_tanh(special), equal_nan=True, rtol=1e-6, atol=1e-30)
    double = torch.randn(100, dtype=torch.float64)
    assert torch.equal(_vitkit_tanh(double), _torch_tanh(double))  # float64: torch's kernel itself
    exact = torch.randn(100)
    assert torch.equal(kernels.gelu(exact, "none"), F.gelu(exact))


def _traced(fn, x: torch.Tensor) -> tuple[torch.Tensor, list]:
    """fn compiled by dynamo (no graph break) with a backend that records the traced graph's call targets."""
    torch._dynamo.reset()
    targets: list = []

    def backend(graph: torch.fx.GraphModule, inputs: list) -> object:
        targets.extend(node.target for node in graph.graph.nodes if node.op == "call_function")
        return graph.forward

    return torch.compile(fn, backend=backend, fullgraph=True)(x), targets


def test_tanh_gelu_compiled_for_the_cpu_is_the_sigmoid_form() -> None:
    """Under torch.compile on the CPU the traced graph holds x sigmoid(2u), not torch's gelu, with its values and
    gradients."""
    x = torch.cat([torch.linspace(-20, 20, 40_001), 3 * torch.randn(10_000)]).requires_grad_()
    out, targets = _traced(_vitkit_tanh, x)
    assert torch.sigmoid in targets and F.gelu not in targets
    ref = _torch_tanh(x)
    scale = x.detach().abs().clamp_min(1.0)
    assert ((out - ref).abs() / scale).max().item() <= 1e-6
    grad = torch.randn_like(x)
    (x_grad,) = torch.autograd.grad(out, x, grad)
    (ref_grad,) = torch.autograd.grad(ref, x, grad)
    assert ((x_grad - ref_grad).abs() / scale).max().item() <= 1e-5
    exact, targets = _traced(lambda t: kernels.gelu(t, "none"), x)
    assert F.gelu in targets and torch.sigmoid not in targets  # the exact GELU keeps torch's op
    torch.testing.assert_close(exact, F.gelu(x), rtol=0, atol=0)


@pytest.mark.skipif(
    not hasattr(torch.compiler, "_is_exporting_flag") and not hasattr(torch.compiler, "is_exporting"),
    reason="torch before 2.6 says nothing of an export in progress: its exported graphs hold the sigmoid form",
)
@pytest.mark.parametrize("strict", [False, True])
def test_tanh_gelu_exports_as_torch_op(strict: bool) -> None:
    """torch.export keeps torch's gelu: exported graphs (ONNX, other runtimes) see the op they know."""

    class Gelu(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _vitkit_tanh(x)

    exported = torch.export.export(Gelu(), (torch.randn(4, 7),), strict=strict)
    targets = {node.target for node in exported.graph.nodes if node.op == "call_function"}
    assert torch.ops.aten.gelu.default in targets and torch.ops.aten.sigmoid.default not in targets


def test_model_trains_through_the_fast_gelu(monkeypatch) -> None:
    torch.manual_seed(0)
    model = create_model("vit_ti16", **TINY).train()
    torch.nn.init.normal_(model.head.weight, std=0.5)
    images, labels = torch.randn(3, 3, 32, 32), torch.tensor([0, 3, 4])

    def step() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        logits = model(images)
        F.cross_entropy(logits, labels).backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    fc1 = model.blocks[0].mlp.fc1
    assert kernels.linear_gelu(torch.randn(2, 5, 32), fc1, "tanh").grad_fn.name() == "_TanhGeluBackward"
    fast_logits, fast_grads = step()
    monkeypatch.setattr(kernels, "gelu", lambda x, approximate: F.gelu(x, approximate=approximate))
    assert kernels.linear_gelu(torch.randn(2, 5, 32), fc1, "tanh").grad_fn.name() == "GeluBackward0"
    ref_logits, ref_grads = step()
    assert (fast_logits - ref_logits).abs().max() <= 1e-5 * ref_logits.abs().max()
    for name, grad in ref_grads.items():
        assert (fast_grads[name] - grad).abs().max() <= 1e-5 * grad.abs().max().clamp_min(1e-12), name


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_linear_gelu_without_autograd_equals_the_two_ops(approximate: str) -> None:
    fc = torch.nn.Linear(16, 48)
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        fused = kernels.linear_gelu(x, fc, approximate)
        reference = F.gelu(fc(x), approximate=approximate)
    assert (fused - reference).abs().max() <= 1e-5 * reference.abs().max()


def test_tanh_gelu_whose_probe_fails_is_torchs(monkeypatch, caplog) -> None:
    """The softplus form of the eager tanh GELU is guarded: where its probe fails, torch's op runs, bit for bit."""
    monkeypatch.setattr(kernels, "_probes", {})

    def failing(dtype):
        def check() -> bool:
            raise RuntimeError("softplus_backward: not implemented for this CPU")

        return check

    monkeypatch.setattr(kernels, "_check_tanh_gelu", failing)
    x = torch.linspace(-6, 6, 1001, requires_grad=True)
    out = kernels.gelu(x, "tanh")
    reference = F.gelu(x.detach(), approximate="tanh")
    assert torch.equal(out.detach(), reference)
    assert out.grad_fn is not None and "Gelu" in type(out.grad_fn).__name__  # torch's own backward node
    assert kernels._probes == {("tanh GELU (softplus form)", torch.float32): False}
    assert sum("is off on this host" in r.message for r in caplog.records) == 1


def test_tanh_gelu_probe_passes_on_this_host(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "_probes", {})
    for dtype in (torch.float32, torch.bfloat16):
        assert kernels._check_tanh_gelu(dtype)()


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
@pytest.mark.parametrize("rate", [0.0, 0.75])
def test_the_model_traces_as_one_graph(dtype, rate) -> None:
    """torch.compile sees the whole forward as one graph: no host check of a kernel choice breaks it (reading
    oneDNN's bf16 support inside the attention broke a small-28px forward into 10 graphs, 35% slower steps)."""
    torch._dynamo.reset()
    model = create_model(
        "vit_ti16",
        img_size=28,
        patch_size=4,
        in_chans=1,
        num_classes=10,
        hidden_size=64,
        depth=2,
        num_heads=4,
        mlp_dim=128,
        pool="gap",
        gelu="exact",
        patch_dropout=0.75,
        patch_dropout_keep="content",
    )
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):
        explained = torch._dynamo.explain(model)(torch.randn(4, 1, 28, 28), patch_dropout=rate)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons[:1]


def test_a_failed_probe_names_the_error_not_the_library_advice(monkeypatch, caplog) -> None:
    """oneDNN's error ends in advice about ONEDNN_VERBOSE that means nothing to a user: the log gives the error."""
    monkeypatch.setattr(kernels, "_probes", {})
    text = (
        "could not create a primitive descriptor for the inner product forward propagation primitive. "
        "Run workload with environment variable ONEDNN_VERBOSE=all to get additional diagnostic information."
    )

    def check() -> bool:
        raise RuntimeError(text)

    assert not kernels.probed("a fused kernel", torch.bfloat16, check)
    (message,) = [r.getMessage() for r in caplog.records if "is off on this host" in r.getMessage()]
    assert f"(RuntimeError: {text.split('. ')[0]})" in message and "ONEDNN_VERBOSE" not in message


def test_a_forward_pass_does_not_load_torch_onnx() -> None:
    """The fast paths asked `torch.onnx.is_in_onnx_export()` on every forward pass, which loads `torch.onnx`; on
    torch releases before 2.5 that imports onnxruntime where installed: on an emulated ARM host, where onnxruntime
    itself fails to load, the first GELU of torch 2.4.1 crashed the process."""
    import subprocess
    import sys

    script = (
        "import sys, torch, vitkit\n"
        "model = vitkit.create_model('vit_ti16', img_size=16, num_classes=2, patch_size=8, depth=1)\n"
        "model(torch.zeros(2, 3, 16, 16)).sum().backward()\n"
        "print('torch.onnx' in sys.modules)\n"
    )
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "False"
