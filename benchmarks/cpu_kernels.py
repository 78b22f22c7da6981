"""The CPU kernel choices of models/kernels.py, timed forward + backward in one process.

    .venv/bin/python benchmarks/cpu_kernels.py            # about 10 s on 2 cores
    .venv/bin/python benchmarks/cpu_kernels.py --tokens 49 --threads 1 --json
    .venv/bin/python benchmarks/cpu_kernels.py --gelu --rounds 9   # the tanh-GELU alternatives, ~1 min
    .venv/bin/python benchmarks/cpu_kernels.py --gelu --compiled   # the same under torch.compile, ~1 min
    (--gelu appends its table as a row to benchmarks/results/cpu_kernels.jsonl; --no-record does not)

Three choices, each against the alternative it replaced, at the shapes of a small-28px step (batch
128, D=64, k=4 heads, MLP 256; 24 tokens with PatchDropout 0.5, 49 without):
- the attention softmax of bf16 logits as models/kernels.py picks it (in fp32 and rounded back for rows
  shorter than 32 tokens, torch's bf16 kernel from 32 up) against the other way;
- exact (erf) GELU against the tanh approximation on the bf16 MLP activation;
- a whole training step of the model with PatchDropout 0.5 against one without.
Rounds alternate the two sides of each pair, so machine load falls on both alike; the printed
figure is the median time and the ratio alternative / chosen (> 1: the choice is faster).

`--gelu` times the ways of computing the official tanh-approximated GELU, 0.5 x (1 + tanh(u)) with
u = sqrt(2/pi) (x + 0.044715 x^3), on the (B, T, mlp_dim) MLP activations of benchmarks/compare.py's
"cifar" (64, 65, 768) and "ti224" (32, 197, 768) configs, fp32 and bf16 autocast, forward + backward,
every round rotating the order.  Besides the time of each against torch's F.gelu(approximate="tanh")
it prints the largest deviation from that kernel's values and input gradients, relative to
max(|x|, 1).  Exact-erf GELU is timed as a yardstick only: it is another function.  With `--compiled`
the ways are torch.compile'd functions instead (as a recipe with run.compile trains): torch's F.gelu,
vitkit's kernels.gelu (which Inductor sees as the sigmoid form) and the exact GELU; the small-32px
activation (256, 16, 384) of a PatchDropout step joins the shapes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from vitkit.bench.records import append_row
from vitkit.models import kernels
from vitkit.models.configs import ViTConfig
from vitkit.models.kernels import BF16_SOFTMAX_MIN_TOKENS, GELU_BETA, GELU_CUBIC, softmax
from vitkit.models.vit import VisionTransformer

RESULTS = Path(__file__).resolve().parent / "results" / "cpu_kernels.jsonl"


def _time(fn: Callable[[], None], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def _pair(chosen: Callable[[], None], other: Callable[[], None], rounds: int, repeat: int) -> tuple[float, float]:
    """Median seconds per call of (chosen, other), measured in alternating rounds after a warm-up."""
    for fn in (chosen, other):
        fn()
    times: tuple[list[float], list[float]] = ([], [])
    for index in range(rounds):
        order = (0, 1) if index % 2 == 0 else (1, 0)
        for side in order:
            times[side].append(_time((chosen, other)[side], repeat))
    return statistics.median(times[0]), statistics.median(times[1])


def _backward(make: Callable[[], torch.Tensor], grad: torch.Tensor) -> Callable[[], None]:
    return lambda: make().backward(grad)


def _model_step(patch_dropout: float, batch: int) -> Callable[[], None]:
    config = ViTConfig(
        img_size=28,
        patch_size=4,
        in_chans=1,
        num_classes=10,
        hidden_size=64,
        depth=4,
        num_heads=4,
        mlp_dim=256,
        pool="gap",
        gelu="exact",
        patch_dropout=patch_dropout,
    )
    model = VisionTransformer(config).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images, labels = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images).float(), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


# ------------------------------------------------------------------------------- tanh-GELU alternatives
GELU_SHAPES = {"cifar": (64, 65, 768), "ti224": (32, 197, 768)}  # (B, T, mlp_dim) of compare.py's configs
GELU_K0, GELU_K1 = GELU_BETA, GELU_BETA * GELU_CUBIC  # x sigmoid(2u), 2u = x (K0 + K1 x^2)


def _sigmoid_form(x: Tensor) -> Tensor:
    """x sigmoid(2u) in four in-place passes (2u = x (K0 + K1 x^2))."""
    return torch.addcmul(x.new_full((), GELU_K0), x, x, value=GELU_K1).mul_(x).sigmoid_().mul_(x)


def _hand_grad(x: Tensor, s: Tensor, grad: Tensor) -> Tensor:
    """d/dx [x s] = s + x s (1 - s) d(2u)/dx, in place: grad (x (K0 + 3 K1 x^2) s (1 - s) + s)."""
    d = torch.addcmul(x.new_full((), GELU_K0), x, x, value=3 * GELU_K1).mul_(x).mul_(grad)
    torch.ops.aten.sigmoid_backward.grad_input(d, s, grad_input=d)
    return d.addcmul_(grad, s)


class _FourPasses(torch.autograd.Function):
    """Sigmoid form in four passes (addcmul, mul, sigmoid, mul); torch's gelu_backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return _sigmoid_form(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return torch.ops.aten.gelu_backward(grad, x, approximate="tanh")


class _HandRecompute(_FourPasses):
    """Sigmoid form (the same forward); hand-written backward that recomputes the sigmoid (saves x, as torch does)."""

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        s = torch.addcmul(x.new_full((), GELU_K0), x, x, value=GELU_K1).mul_(x).sigmoid_()
        return _hand_grad(x, s, grad)


class _HandSaved(torch.autograd.Function):
    """Sigmoid form; hand-written backward from the saved sigmoid (one more saved activation)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        s = torch.addcmul(x.new_full((), GELU_K0), x, x, value=GELU_K1).mul_(x).sigmoid_()
        ctx.save_for_backward(x, s)
        return s * x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        x, s = ctx.saved_tensors
        return _hand_grad(x, s, grad)


def compiled_gelu_ways() -> dict[str, Callable[[Tensor], Tensor]]:
    """The tanh GELU as torch.compile traces it: torch's op (what Inductor made of it before) and vitkit's."""
    torch._dynamo.reset()
    return {
        "torch F.gelu tanh, compiled (replaced)": torch.compile(lambda x: F.gelu(x, approximate="tanh")),
        "vitkit kernels.gelu, compiled": torch.compile(lambda x: kernels.gelu(x, "tanh")),
        "exact erf, compiled (another function)": torch.compile(F.gelu),
    }


GELU_WAYS: dict[str, Callable[[Tensor], Tensor]] = {
    "torch F.gelu tanh (replaced)": lambda x: F.gelu(x, approximate="tanh"),
    "vitkit: 3 passes (softplus_bwd), torch bwd": lambda x: kernels.gelu(x, "tanh"),
    "sigmoid form, 4 passes, torch backward": _FourPasses.apply,
    "sigmoid form, autograd of the ops": lambda x: x * torch.sigmoid(x * (GELU_K0 + GELU_K1 * x * x)),
    "sigmoid form, hand backward (recompute)": _HandRecompute.apply,
    "sigmoid form, hand backward (saved s)": _HandSaved.apply,
    "exact erf (another function)": F.gelu,
}


def _gelu_deviation(way: Callable[[Tensor], Tensor], x: Tensor, grad: Tensor) -> tuple[float, float]:
    """max |way - F.gelu tanh| / max(|x|, 1) for values and for input gradients."""
    results = []
    for fn in (way, lambda x: F.gelu(x, approximate="tanh")):
        leaf = x.detach().clone().requires_grad_()
        out = fn(leaf)
        out.backward(grad)
        results.append((out.detach().float(), leaf.grad.float()))
    scale = x.detach().float().abs().clamp_min(1.0)
    (value, grad_in), (ref_value, ref_grad) = results
    return ((value - ref_value).abs() / scale).max().item(), ((grad_in - ref_grad).abs() / scale).max().item()


def _forward_backward(
    fn: Callable[[Tensor], Tensor], x: Tensor, grad: Tensor, autocast: contextlib.AbstractContextManager
) -> Callable[[], None]:
    """A call that runs `fn` on `x` forward (under `autocast`) and backward with `grad`."""

    def once() -> None:
        x.grad = None
        with autocast:
            out = fn(x)
        out.backward(grad)

    return once


def gelu_table(
    rounds: int, repeat: int, ways: dict[str, Callable[[Tensor], Tensor]], shapes: dict[str, tuple[int, int, int]]
) -> dict[str, Any]:
    """Median forward + backward ms of every way per shape and dtype, order rotated each round.

    The first way is the base that speeds are relative to.
    """
    table: dict[str, Any] = {}
    names = list(ways)
    for shape_name, shape in shapes.items():
        for dtype in (torch.float32, torch.bfloat16):
            x = (2 * torch.randn(shape)).to(dtype).requires_grad_()
            grad = torch.randn(shape).to(dtype)
            autocast = (
                torch.autocast("cpu", dtype=torch.bfloat16) if dtype == torch.bfloat16 else contextlib.nullcontext()
            )
            runs = {name: _forward_backward(ways[name], x, grad, autocast) for name in names}
            for once in runs.values():  # warm-up
                once()
            times: dict[str, list[float]] = {name: [] for name in names}
            for index in range(rounds):
                for name in names[index % len(names) :] + names[: index % len(names)]:
                    times[name].append(_time(runs[name], repeat))
            torch_ms = statistics.median(times[names[0]])
            rows = {}
            for name in names:
                value_dev, grad_dev = _gelu_deviation(ways[name], x, grad)
                median = statistics.median(times[name])
                rows[name] = {
                    "ms": 1e3 * median,
                    "speed_vs_torch": torch_ms / median,
                    "value_dev": value_dev,
                    "grad_dev": grad_dev,
                }
            table[f"{shape_name} {tuple(shape)} {str(dtype).replace('torch.', '')}"] = rows
    return table


def print_gelu_table(result: dict[str, Any]) -> None:
    compiled = ", compiled" if result["compiled"] else ""
    print(
        f"{result['threads']} threads; tanh GELU forward + backward{compiled}, "
        f"median of {result['rounds']} rotated rounds; "
        "deviation from F.gelu(approximate='tanh') relative to max(|x|, 1)"
    )
    for case, rows in result["gelu"].items():
        print(f"  {case}")
        for name, row in rows.items():
            print(
                f"    {name:42s} {row['ms']:8.3f} ms  x{row['speed_vs_torch']:.2f}   "
                f"values {row['value_dev']:.1e}  gradients {row['grad_dev']:.1e}"
            )


def run_gelu(args: argparse.Namespace, argv: list[str]) -> None:
    """--gelu: time the tanh-GELU ways and (unless --no-record) append the row."""
    ways, shapes = (
        (compiled_gelu_ways(), {"small-32px": (256, 16, 384), **GELU_SHAPES})
        if args.compiled
        else (GELU_WAYS, GELU_SHAPES)
    )
    gelu = {
        "threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "compiled": args.compiled,
        "gelu": gelu_table(args.rounds, 3, ways, shapes),
    }
    if not args.no_record:
        append_row(RESULTS, gelu, command=["cpu_kernels.py", *argv])
    print(json.dumps(gelu)) if args.json else print_gelu_table(gelu)


def run_kernels(args: argparse.Namespace) -> None:
    """The default table: vitkit's softmax, GELU and PatchDropout choices beside the alternatives."""
    batch, tokens, bf16 = args.batch, args.tokens, torch.bfloat16
    logits = torch.randn(batch, 4, tokens, tokens, dtype=bf16, requires_grad=True)
    fp32_rows = tokens < BF16_SOFTMAX_MIN_TOKENS  # what vitkit's kernels.softmax does at this length
    softmax_row = f"softmax {'fp32' if fp32_rows else 'bf16'} (vitkit) vs {'bf16' if fp32_rows else 'fp32'}"

    def other_softmax(x: torch.Tensor) -> torch.Tensor:
        return x.softmax(-1) if fp32_rows else x.softmax(-1, dtype=torch.float32).to(bf16)

    hidden = torch.randn(batch, tokens, 256, dtype=bf16, requires_grad=True)
    rows = {
        softmax_row: _pair(
            _backward(lambda: softmax(logits), torch.ones_like(logits)),
            _backward(lambda: other_softmax(logits), torch.ones_like(logits)),
            args.rounds,
            20,
        ),
        "GELU exact vs tanh": _pair(
            _backward(lambda: F.gelu(hidden), torch.ones_like(hidden)),
            _backward(lambda: F.gelu(hidden, approximate="tanh"), torch.ones_like(hidden)),
            args.rounds,
            20,
        ),
        "training step PatchDropout 0.5 vs none": _pair(
            _model_step(0.5, batch), _model_step(0.0, batch), args.rounds, 5
        ),
    }
    result = {
        "threads": torch.get_num_threads(),
        "tokens": tokens,
        "batch": batch,
        "rows": {name: {"chosen_ms": 1e3 * a, "other_ms": 1e3 * b, "ratio": b / a} for name, (a, b) in rows.items()},
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['threads']} threads, batch {batch}, {tokens} tokens (fwd + bwd, median of {args.rounds} rounds)")
    for name, row in result["rows"].items():
        print(f"  {name:42s} {row['chosen_ms']:8.3f} ms vs {row['other_ms']:8.3f} ms   x{row['ratio']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=24, help="tokens per image for the kernel shapes")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0, help="0 = torch's default")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--gelu", action="store_true", help="time the tanh-GELU alternatives instead")
    parser.add_argument("--compiled", action="store_true", help="with --gelu: the ways under torch.compile")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-record", action="store_true", help="with --gelu: append no row to results/")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.gelu:
        run_gelu(args, argv if argv is not None else sys.argv[1:])
    else:
        run_kernels(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
