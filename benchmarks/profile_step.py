"""Where a training step's time goes: torch.profiler over a few steps of `vitkit bench`'s training step.

    python3 benchmarks/profile_step.py --model vit_b16 --batch-size 128 --precision bf16 --compile   # a GPU
    .venv/bin/python benchmarks/profile_step.py --model vit_ti16 --img-size 32 --set patch_size=4 --batch-size 8

It times the same step `vitkit bench` does (bench/throughput.py: forward, fp32 cross-entropy, backward,
AdamW), warmed up first (compiled, when asked, before profiling), then prints the kernels by total device
time and the share of the step's device time in each kind: matrix products (GEMM), attention, optimiser and
the rest (elementwise, normalisation, copies).  On the CPU the "device" time is CPU time.  Each run appends
a row to benchmarks/results/profile_step.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from vitkit.bench.records import append_row
from vitkit.bench.throughput import BenchConfig, bench_model, make_optimizer, synchronize, training_step
from vitkit.device import pick_device, resolve_precision
from vitkit.models import preset_config
from vitkit.overrides import parse_fields, split_item

RESULTS = Path(__file__).resolve().parent / "results" / "profile_step.jsonl"
KINDS = (  # (kind, substrings of a kernel's name), first match wins
    ("attention", ("flash", "fmha", "attention", "sdpa", "efficient_attention")),
    ("gemm", ("gemm", "matmul", "mm", "cutlass", "sm90_xmma", "nvjet", "addmm", "linear")),
    ("optimizer", ("adam", "foreach", "multi_tensor")),
)


def kind_of(name: str) -> str:
    lowered = name.lower()
    for kind, keys in KINDS:
        if any(key in lowered for key in keys):
            return kind
    return "other"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vit_b16")
    parser.add_argument("--img-size", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--steps", type=int, default=5, help="profiled steps (after 3 warm-up steps)")
    parser.add_argument("--top", type=int, default=20, help="kernels listed")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="model field=value")
    parser.add_argument("--no-record", action="store_true", help="do not append a row to results/profile_step.jsonl")
    return parser.parse_args(argv)


def profiled_kernels(args: argparse.Namespace, device: torch.device, precision: str) -> tuple[list, str]:
    """The kernels (CUDA) or aten ops (CPU) of `args.steps` warmed-up training steps, and the time field to read."""
    items = dict(split_item(pair, "field=value", "patch_size=4") for pair in args.overrides)
    overrides = parse_fields(preset_config(args.model), items, "model")  # type-checked, as `vitkit bench --set`
    config = BenchConfig(
        model=args.model, img_size=args.img_size, batch_size=args.batch_size, device=args.device, overrides=overrides
    )
    model, model_config = bench_model(config)
    model = model.to(device).train()
    runner = torch.compile(model) if args.compile else model
    size = model_config.img_size
    images = torch.randn(args.batch_size, 3, size, size, device=device)
    labels = torch.randint(0, max(model_config.num_classes, 1), (args.batch_size,), device=device)
    step = training_step(runner, make_optimizer(model, device), images, labels, device, precision)
    for _ in range(3):
        step()
    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            step()
        synchronize(device)
    timed = "device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    on_device = device.type == "cuda"
    kernels = [e for e in prof.key_averages() if (e.device_type.name == "CUDA") == on_device and getattr(e, timed) > 0]
    if not on_device:  # CPU: the aten ops' own time
        kernels = [e for e in kernels if e.key.startswith("aten::")]
    return sorted(kernels, key=lambda e: -getattr(e, timed)), timed


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    device = pick_device(args.device)
    precision = resolve_precision(args.precision, device)
    ranked, timed = profiled_kernels(args, device, precision)
    total = sum(getattr(e, timed) for e in ranked) or 1.0
    shares: dict[str, float] = defaultdict(float)
    for event in ranked:
        shares[kind_of(event.key)] += getattr(event, timed) / total
    per_step_ms = total / 1000 / args.steps
    print(
        f"{args.model} batch {args.batch_size} {precision} compile {args.compile} on {device}: "
        f"{per_step_ms:.2f} ms of {'device' if device.type == 'cuda' else 'CPU'} time a step"
    )
    for event in ranked[: args.top]:
        print(f"{getattr(event, timed) / total:7.1%} {event.count // args.steps:4d}x  {event.key[:110]}")
    summary = {k: round(v, 4) for k, v in sorted(shares.items(), key=lambda kv: -kv[1])}
    print("shares:", ", ".join(f"{k} {v:.1%}" for k, v in summary.items()))
    figures = {
        "model": args.model,
        "batch_size": args.batch_size,
        "precision": precision,
        "compile": args.compile,
        "device_ms_per_step": round(per_step_ms, 3),
        "shares": summary,
        "top": [[event.key[:80], round(getattr(event, timed) / total, 4)] for event in ranked[:10]],
    }
    if not args.no_record:
        append_row(RESULTS, figures, device=str(device))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
