"""The CPU kernel choices behind small-28px's speed, timed forward + backward in one process.

    .venv/bin/python benchmarks/cpu_kernels.py            # about 10 s on 2 cores
    .venv/bin/python benchmarks/cpu_kernels.py --tokens 49 --threads 1 --json

Three choices, each against the alternative it replaced, at the shapes of a small-28px step (batch
128, D=64, k=4 heads, MLP 256; 24 tokens with PatchDropout 0.5, 49 without):
- the attention softmax of bf16 logits as models/kernels.py picks it (in fp32 and rounded back for rows
  shorter than 32 tokens, torch's bf16 kernel from 32 up) against the other way;
- exact (erf) GELU against the tanh approximation on the bf16 MLP activation;
- a whole training step of the model with PatchDropout 0.5 against one without.
Rounds alternate the two sides of each pair, so machine load falls on both alike; the printed
figure is the median time and the ratio alternative / chosen (> 1: the choice is faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F

from vitkit.models.configs import ViTConfig
from vitkit.models.kernels import BF16_SOFTMAX_MIN_TOKENS, softmax
from vitkit.models.vit import VisionTransformer


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
    config = ViTConfig(img_size=28, patch_size=4, in_chans=1, num_classes=10, hidden_size=64, depth=4, num_heads=4,
                       mlp_dim=256, pool="gap", gelu="exact", patch_dropout=patch_dropout)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=24, help="tokens per image for the kernel shapes")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0, help="0 = torch's default")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
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
            _backward(lambda: other_softmax(logits), torch.ones_like(logits)), args.rounds, 20),
        "GELU exact vs tanh": _pair(
            _backward(lambda: F.gelu(hidden), torch.ones_like(hidden)),
            _backward(lambda: F.gelu(hidden, approximate="tanh"), torch.ones_like(hidden)), args.rounds, 20),
        "training step PatchDropout 0.5 vs none": _pair(
            _model_step(0.5, batch), _model_step(0.0, batch), args.rounds, 5),
    }
    result = {"threads": torch.get_num_threads(), "tokens": tokens, "batch": batch,
              "rows": {name: {"chosen_ms": 1e3 * a, "other_ms": 1e3 * b, "ratio": b / a} for name, (a, b) in rows.items()}}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['threads']} threads, batch {batch}, {tokens} tokens (fwd + bwd, median of {args.rounds} rounds)")
    for name, row in result["rows"].items():
        print(f"  {name:42s} {row['chosen_ms']:8.3f} ms vs {row['other_ms']:8.3f} ms   x{row['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
