"""How the ViT's functions are computed: the fastest measured way, never a different function.

vit.py states the paper's equations and calls these with explicit arguments (no global switches, no
environment variables); benchmarks/cpu_kernels.py measures each choice against the plain op.

  attention        softmax(q k^T / sqrt(D_h) + bias) v (App. A, Eq. 5-7): torch's fused SDPA kernel, or
                   matmul + softmax spelt out, the only path that can return A; `impl` picks.
  softmax          the explicit path's softmax; bf16 rows shorter than 32 on the CPU go through fp32.
  gelu             GELU of the MLP; the tanh approximation (Flax's `nn.gelu`) is computed on the CPU as
                   x sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)): eagerly in three light passes with torch's
                   GELU backward, under torch.compile as plain ops that Inductor fuses (forward and backward).
  linear_gelu      GELU(x W^T + b); without autograd on the CPU one oneDNN kernel.
  one_channel_     a one-channel input convolution's weight laid out channels-last, as its gradient is.

No fast path without a guard: a choice that depends on the host (oneDNN's fused dense + GELU, the
softplus-backward form of the eager tanh GELU, the explicit attention for bf16) runs only where a one-time
probe on this host, at this dtype, succeeds and matches the plain ops within tolerance (`probed`); a kernel
that fails later falls back for good.  Either way the fallback is logged once and the plain op runs.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit import host
from vitkit.device import first_is_faster

log = logging.getLogger(__name__)

AttnImpl = Literal["auto", "sdpa", "explicit"]
Approximate = Literal["tanh", "none"]
BF16_SOFTMAX_MIN_TOKENS = 32  # CPU rows shorter than this: softmax in fp32 (see `softmax`)
GELU_CUBIC = 0.044715  # tanh GELU: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
GELU_BETA = 2.0 * math.sqrt(2.0 / math.pi)  # 0.5 (1 + tanh(a)) = sigmoid(2a)


def eager_cpu(x: Tensor) -> bool:
    """Eager execution on the CPU: where the choices below apply (compile, export and ONNX trace torch's plain ops)."""
    return (
        x.device.type == "cpu"
        and not torch.compiler.is_compiling()
        and not torch.jit.is_tracing()
        and not _in_onnx_export()
    )


def _in_onnx_export() -> bool:
    """Whether an ONNX export is tracing, asked only where `torch.onnx` is loaded (an export loads it): loading it
    to ask, as every forward pass did, imports onnxruntime on torch releases before 2.5, where installed."""
    onnx = sys.modules.get("torch.onnx")
    return onnx is not None and onnx.is_in_onnx_export()


# ---------------------------------------------------------------------------------------- guards
_probes: dict[tuple[str, torch.dtype], bool] = {}


def probed(name: str, dtype: torch.dtype, check: Callable[[], bool]) -> bool:
    """Whether kernel `name` may run at `dtype` on this host: `check()` (the kernel against the plain ops on
    a small input) runs once per process; an exception or a mismatch turns the kernel off, logged once."""
    key = (name, dtype)
    if key not in _probes:
        try:
            with torch.inference_mode(False), torch.enable_grad(), torch.autocast("cpu", enabled=False):
                _probes[key] = bool(check())
            why = "its result differs from the plain ops'"
        except Exception as err:  # any failure of a fast path means: use the plain ops
            _probes[key], why = False, f"{type(err).__name__}: {first_sentence(err)}"
        if not _probes[key]:
            log.warning(
                "kernels: %s in %s is off on this host (%s); the plain ops run instead",
                name,
                str(dtype).removeprefix("torch."),
                why,
            )
    return _probes[key]


def first_sentence(err: Exception) -> str:
    """What went wrong, without the advice a library appends ("could not create a primitive descriptor ...",
    not oneDNN's "Run workload with environment variable ONEDNN_VERBOSE=all ..."): its first line's first
    sentence, at most 200 characters."""
    line = (str(err).strip().splitlines() or [""])[0]
    return line.split(". ", 1)[0].removesuffix(".")[:200]


def disable(name: str, dtype: torch.dtype, err: Exception) -> None:
    """Turn kernel `name` off at `dtype` after it failed mid-run (logged once); callers fall back."""
    if _probes.get((name, dtype), True):
        log.warning(
            "kernels: %s in %s failed (%s: %s); the plain ops run from now on",
            name,
            str(dtype).removeprefix("torch."),
            type(err).__name__,
            first_sentence(err),
        )
    _probes[(name, dtype)] = False


# Read once, at import: torch.compile cannot trace the reading (each call inside a traced model broke its graph).
_NATIVE_BF16 = host.cpu_native_bf16()


def cpu_native_bf16() -> bool:
    """Whether oneDNN multiplies bf16 natively on this CPU (AVX512-BF16 / AMX)."""
    return _NATIVE_BF16


# ----------------------------------------------------------------------------------- attention
def explicit_attention(impl: AttnImpl, q: Tensor) -> bool:
    """Whether Eq. 5-7 run as plain matmuls + softmax rather than the fused SDPA kernel.

    "auto" picks the explicit path for bf16/fp16 queries on a CPU with native bf16: there torch's SDPA
    kernel is 2-6x slower than matmul + softmax (forward and, above all, backward; benchmarks/compare.py);
    in fp32, on CUDA (flash / memory-efficient kernels) and on CPUs without native bf16 SDPA runs.
    """
    if impl == "auto":
        return q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16) and cpu_native_bf16()
    return impl == "explicit"


def attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, dropout: float, impl: AttnImpl, need_weights: bool = False
) -> tuple[Tensor, Tensor | None]:
    """softmax(q k^T / sqrt(D_h) + bias) v for (B, k, T, D_h) q, k, v; returns (B, k, T, D_h) and, if
    `need_weights`, A (B, k, T, T).  `dropout` (0 outside training) drops attention weights."""
    if not (need_weights or explicit_attention(impl, q)):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout), None
    logits = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # (B, k, T, T); scaling q is the cheaper side
    weights = softmax(logits if bias is None else logits + bias)
    out = F.dropout(weights, dropout) @ v  # p = 0 returns the weights untouched
    return out, weights if need_weights else None


def softmax(logits: Tensor) -> Tensor:
    """Softmax over the last axis, in the logits' dtype.

    On the CPU, torch's bf16 softmax kernel processes rows shorter than one 512-bit vector (32 bf16
    values) element by element: there, as for the 17-25 tokens of small-28px under PatchDropout,
    computing in fp32 and rounding back is 2-2.5x faster forward + backward; from 32 tokens up the
    bf16 kernel is faster (3x at 197 tokens).  benchmarks/cpu_kernels.py measures both sides.
    """
    if logits.dtype == torch.bfloat16 and logits.device.type == "cpu" and logits.shape[-1] < BF16_SOFTMAX_MIN_TOKENS:
        return logits.softmax(dim=-1, dtype=torch.float32).to(logits.dtype)
    return logits.softmax(dim=-1)


# ----------------------------------------------------------------------------------------- GELU
class _TanhGelu(torch.autograd.Function):
    """0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), in three passes over x.

    torch's CPU tanh-GELU kernel spends its time in a vectorised tanh (2-3x its exact-erf kernel);
    here the cubic takes two light passes and the third is aten's softplus_backward(grad=x, input=w,
    beta=2 sqrt(2/pi)) = x sigmoid(beta w), one exp per element (threshold 20: above it sigmoid = 1
    to within 2e-9, and the kernel returns x).  The backward is torch's own gelu_backward kernel, so
    gradients equal F.gelu's for the same input (and stay differentiable); only x is saved, as there.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        cubic = torch.addcmul(x.new_ones(()), x, x, value=GELU_CUBIC).mul_(x)  # x + 0.044715 x^3, (B, T, mlp_dim)
        return torch.ops.aten.softplus_backward.grad_input(x, cubic, GELU_BETA, 20.0, grad_input=cubic)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return torch.ops.aten.gelu_backward(grad, x, approximate="tanh")


def compiled_cpu(x: Tensor) -> bool:
    """Traced by torch.compile for the CPU (not by torch.export, whose graphs keep torch's plain ops)."""
    return x.device.type == "cpu" and torch.compiler.is_compiling() and not _exporting()


def _exporting() -> bool:
    """Traced by torch.export.  The flag export sets is read itself: inside a torch.compile trace some torch
    releases (2.11 among them) answer `torch.compiler.is_exporting()` with True, export or not."""
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    if flag is not None:
        return bool(flag)
    is_exporting = getattr(torch.compiler, "is_exporting", None)  # absent before torch 2.6
    return bool(is_exporting()) if is_exporting is not None else False


def gelu(x: Tensor, approximate: Approximate) -> Tensor:
    """GELU, exact (erf) or the tanh approximation; equal to `F.gelu(x, approximate=...)` within
    1e-6 max(|x|, 1) in fp32 and 2^-7 max(|x|, 1) (one bf16 step) in bf16 (tests/models/test_kernels.py).

    Under torch.compile on the CPU, Inductor turns torch's tanh GELU into a vectorised tanh forward and
    backward; the sigmoid form, written as ops, fuses into one exp-based kernel each way: 2.25x faster
    forward + backward in bf16 and 2.3x in fp32 on small-32px's (256, 16, 384) MLP activation
    (benchmarks/cpu_kernels.py --gelu --compiled), and a small-32px training step 11-12% shorter
    (benchmarks/step_phases.py folder:../shared/data/cifar10-jpg: 127.1 -> 113.4 ms with PatchDropout,
    464 -> 410 ms without, on a 2-core AMX Xeon).
    """
    if approximate == "tanh" and x.dtype in (torch.float32, torch.bfloat16):
        if compiled_cpu(x):
            return x * torch.sigmoid(x * (GELU_BETA + GELU_BETA * GELU_CUBIC * x * x))
        if (
            type(x) is Tensor
            and eager_cpu(x)
            and probed("tanh GELU (softplus form)", x.dtype, _check_tanh_gelu(x.dtype))
        ):
            return _TanhGelu.apply(x)  # plain tensors only: subclasses (DTensor, ...) keep torch's op
    return F.gelu(x, approximate=approximate)


def _check_tanh_gelu(dtype: torch.dtype) -> Callable[[], bool]:
    def check() -> bool:
        x = torch.linspace(-8, 8, 257).to(dtype).requires_grad_()
        out = _TanhGelu.apply(x)
        (grad,) = torch.autograd.grad(out.sum(), x)
        ref = x.detach().requires_grad_()
        want = F.gelu(ref, approximate="tanh")
        (want_grad,) = torch.autograd.grad(want.sum(), ref)
        tol = 1e-5 if dtype == torch.float32 else 2**-6
        return bool(
            torch.allclose(out.float(), want.float(), atol=tol * 8, rtol=tol)
            and torch.allclose(grad.float(), want_grad.float(), atol=tol * 8, rtol=tol)
        )

    return check


# ------------------------------------------------------------------------------- dense + GELU
def cpu_inference(x: Tensor) -> bool:
    """No autograd, eager, on the CPU: where oneDNN's fused dense + GELU can replace the two ops."""
    return not torch.is_grad_enabled() and eager_cpu(x)


def linear_gelu(x: Tensor, fc: nn.Linear, approximate: Approximate) -> Tensor:
    """GELU(x W^T + b): in one oneDNN kernel where it can (`cpu_inference`), else the dense layer, then `gelu`."""
    if cpu_inference(x):
        fused = fused_linear_gelu(x, fc, approximate)
        if fused is not None:
            return fused
    return gelu(fc(x), approximate)


def fused_linear_gelu(x: Tensor, fc: nn.Linear, approximate: Approximate) -> Tensor | None:
    """GELU(x W^T + b) in one oneDNN kernel (the GELU applied to the matmul's fp32 accumulator).

    Same function as `gelu(fc(x))`: fp32 results agree to ~5e-7, and with bf16 autocast the output is
    rounded to bf16 once instead of twice.  It removes the separate pass over the (B, T, mlp_dim)
    activation, the largest tensor of the block.  Returns None where the fused kernel is unavailable,
    so the caller falls back to the two ops.
    """
    weight, bias = fc.weight, fc.bias
    if torch.is_autocast_enabled("cpu"):  # the fused op is not on autocast's list: cast as autocast would
        dtype = torch.get_autocast_dtype("cpu")
        x, weight = x.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    if x.dtype != weight.dtype or x.dtype not in (torch.float32, torch.bfloat16):
        return None
    if not probed(FUSED_LINEAR_GELU, x.dtype, lambda: _check_linear_gelu(x.dtype)):
        return None
    try:
        if not _fused_is_faster(x, weight, bias, approximate):
            return None
        return _linear_pointwise(x, weight, bias, approximate)
    except RuntimeError as err:  # e.g. oneDNN has no primitive for this dtype on this CPU
        disable(FUSED_LINEAR_GELU, x.dtype, err)
        return None


FUSED_LINEAR_GELU = "oneDNN fused dense + GELU"
_faster: dict[tuple, bool] = {}  # (dtype, approximate, rows class, in, out) -> the fused kernel measured faster
# How much faster the fused kernel must be: where the two paths run about as fast, every process keeps the
# plain ops, so two processes on one host (a server and `vitkit predict`) give the same numbers.
FUSED_MARGIN = 1.05


def _fused_is_faster(x: Tensor, weight: Tensor, bias: Tensor | None, approximate: Approximate) -> bool:
    """Whether the fused kernel beats the dense layer + GELU by FUSED_MARGIN at this shape class on this host:
    timed once per (dtype, rows rounded up to a power of two, in, out) by `first_is_faster`.  oneDNN's AVX2
    dense layer can be slower than the BLAS one the plain path calls, by more than the pass it saves: on a
    2-core AVX2 EPYC, 4,160 x 192 -> 768 in fp32, 22 ms fused against 16 ms plain."""
    rows = x.numel() // x.shape[-1]
    key = (x.dtype, approximate, 1 << max(rows - 1, 0).bit_length(), *weight.shape)
    if key not in _faster:
        _faster[key] = first_is_faster(
            lambda: _linear_pointwise(x, weight, bias, approximate),
            lambda: gelu(F.linear(x, weight, bias), approximate),
            margin=FUSED_MARGIN,
        )
    return _faster[key]


def _linear_pointwise(x: Tensor, weight: Tensor, bias: Tensor | None, approximate: Approximate) -> Tensor:
    """oneDNN's dense layer with the GELU applied to its accumulator (a non-public torch op)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "gelu", [], approximate)


def _check_linear_gelu(dtype: torch.dtype) -> bool:
    """oneDNN's fused dense + GELU against F.linear then F.gelu, both approximations, on a small input."""
    if not (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return False
    generator = torch.Generator().manual_seed(0)
    x, weight, bias = (torch.randn(shape, generator=generator).to(dtype) for shape in ((2, 9, 24), (40, 24), (40,)))
    tol = 1e-4 if dtype == torch.float32 else 2**-5
    for approximate in ("tanh", "none"):
        fused = _linear_pointwise(x, weight, bias, approximate).float()
        plain = F.gelu(F.linear(x.float(), weight.float(), bias.float()), approximate=approximate)
        if not torch.allclose(fused, plain, atol=tol * 4, rtol=tol):
            return False
    return True


def one_channel_(conv: nn.Conv2d) -> None:
    """Give a one-channel convolution's weight the channels-last strides (the same memory: its channel dimension
    has size 1).  vitkit's batches are decoded H x W x C and permuted, the layout in which a one-channel
    convolution runs fastest (fp32 forward and backward 2-4x faster than the standard one, AVX2 and AVX-512
    alike); its weight gradient comes out channels-last, and DDP copies every step (with a warning) a gradient
    laid out otherwise than its parameter."""
    weight = conv.weight
    if weight.shape[1] != 1:
        return
    kh, kw = weight.shape[2:]
    strides = (kh * kw, 1, kw, 1)
    conv.weight = nn.Parameter(weight.detach().as_strided(weight.shape, strides), requires_grad=weight.requires_grad)
