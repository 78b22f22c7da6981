"""vitkit beside timm and Hugging Face: training and inference images/s of the same ViT, in one process.

    .venv/bin/python benchmarks/compare.py                          # both configs (cifar, ti224), ~10 min on 2 cores
    .venv/bin/python benchmarks/compare.py --configs cifar --rounds 5 --steps 3 --threads 2 --json

Each configuration is built three times with the same shape and parameter count (asserted): vitkit's
VisionTransformer, timm's `timm.models.vision_transformer.VisionTransformer` and transformers'
`ViTForImageClassification` (ViTModel without pooler, plus the linear head), each with its library
defaults (timm and HF: SDPA attention, exact GELU).  Every step is timed as `vitkit bench` times it
(bench/throughput.py: same batch, AdamW, cross-entropy in fp32).  Rounds alternate the libraries and
rotate their order, so load from other processes on a shared machine falls on all of them alike;
figures are medians over rounds.  Two clocks are reported: wall-clock images/s, and images per
CPU-second of this process (`time.process_time`), which a loaded machine disturbs far less
(with --threads 1 it is the single-core speed; with more threads it also counts idle-spinning).

"default" is what each library does with no precision flag: timm and HF train and infer in fp32 on
the CPU; vitkit resolves precision "auto" (bf16 autocast where the CPU multiplies bf16 natively) and
attention "auto" (explicit softmax under bf16 on CPU).  The same-precision rows show vitkit is not
slower when both use fp32, or both bf16.

timm imports torchvision at import time, and there is no CPU torchvision here: inside this script
only, `torchvision` and its submodules are stubbed in `sys.modules` so that the ViT module imports
(timm's ViT itself uses no torchvision code; compare_models.py builds the three models).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from compare_models import SPECS, Spec, build
from vitkit.bench.records import append_row
from vitkit.bench.throughput import (
    device_name,
    inference_step,
    make_optimizer,
    num_threads,
    time_steps,
    training_step,
)
from vitkit.device import pick_device, resolve_precision

LIBRARIES = ("vitkit", "timm", "hf")
RESULTS = Path(__file__).resolve().parent / "results" / "compare.jsonl"


# ---------------------------------------------------------------------------------------------
# Interleaved measurement


def compare(
    spec: Spec,
    rounds: int,
    steps: int,
    warmup: int,
    precisions: tuple[str, ...],
    modes: tuple[str, ...],
    libraries: tuple[str, ...] = LIBRARIES,
    device: torch.device | None = None,
    compile: bool = False,
) -> dict[str, Any]:
    device = device or torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(spec.batch_size, 3, spec.img_size, spec.img_size, generator=gen).to(device)
    labels = torch.randint(0, spec.num_classes, (spec.batch_size,), generator=gen).to(device)
    torch.manual_seed(0)
    models = {lib: build(lib, spec).to(device) for lib in libraries}
    params = {lib: sum(p.numel() for p in m.parameters()) for lib, m in models.items()}
    assert len(set(params.values())) == 1, f"parameter counts differ: {params}"
    optimizers = {lib: make_optimizer(m, device) for lib, m in models.items()}
    runners = {lib: torch.compile(m) if compile else m for lib, m in models.items()}  # compiled in the warm-up
    steps_of: dict[tuple[str, str, str], Callable[[], Tensor]] = {}
    for lib, model in runners.items():
        for precision in precisions:
            steps_of[lib, precision, "inference"] = inference_step(model, images, device, precision)
            steps_of[lib, precision, "training"] = training_step(
                model, optimizers[lib], images, labels, device, precision
            )
    times: dict[tuple[str, str, str], list[float]] = {key: [] for key in steps_of}
    cpu_times: dict[tuple[str, str, str], list[float]] = {key: [] for key in steps_of}  # process CPU seconds
    for round_index in range(-1, rounds):  # round -1 is the warm-up
        for mode in modes:
            for model in models.values():
                model.train(mode == "training")
            for precision in precisions:
                shift = max(round_index, 0) % len(libraries)
                for lib in libraries[shift:] + libraries[:shift]:  # rotate who goes first
                    step = steps_of[lib, precision, mode]
                    if round_index < 0:
                        for _ in range(warmup):
                            step()
                    else:
                        cpu_start = time.process_time()
                        times[lib, precision, mode].append(time_steps(step, device, steps))
                        cpu_times[lib, precision, mode].append((time.process_time() - cpu_start) / steps)
    key = "{}/{}/{}".format
    return {
        "params": params["vitkit"],
        "images_per_s": {key(*k): spec.batch_size / statistics.median(t) for k, t in times.items()},
        "images_per_cpu_s": {key(*k): spec.batch_size / statistics.median(t) for k, t in cpu_times.items()},
        "seconds_per_step": {key(*k): t for k, t in times.items()},
        "cpu_seconds_per_step": {key(*k): t for k, t in cpu_times.items()},
    }


def report(
    name: str, spec: Spec, result: dict[str, Any], default_precision: str, precisions, modes, clock: str
) -> list[str]:
    """Table and ratios by wall-clock ("images_per_s") or per CPU-second ("images_per_cpu_s")."""
    rates = result[clock]
    unit = "images/s" if clock == "images_per_s" else "images per CPU-second"
    peers = [lib for lib in ("timm", "hf") if f"{lib}/{precisions[0]}/{modes[0]}" in rates]
    lines = [
        f"-- {name}, {unit}",
        f"{'mode':<10}{'precision':<10}{'vitkit':>9}"
        + "".join(f"{lib:>9}" for lib in peers)
        + "".join(f"{'vitkit/' + lib:>13}" for lib in peers),
    ]
    ratios: dict[str, float] = {}
    for mode in modes:
        for precision in precisions:
            v = rates[f"vitkit/{precision}/{mode}"]
            others = [rates[f"{lib}/{precision}/{mode}"] for lib in peers]
            for lib, other in zip(peers, others):
                ratios[f"{mode}/{precision}/vs_{lib}"] = v / other
            lines.append(
                f"{mode:<10}{precision:<10}{v:>9.1f}"
                + "".join(f"{o:>9.1f}" for o in others)
                + "".join(f"{v / o:>13.2f}" for o in others)
            )
    for mode in modes:
        ours = rates[f"vitkit/{default_precision}/{mode}"]
        said = [f"{mode}: vitkit default ({default_precision}) {ours:.1f}"]
        if "timm" in peers and "fp32" in precisions:
            ratios[f"{mode}/default_vs_timm_default"] = ours / rates[f"timm/fp32/{mode}"]
            said.append(f"{ours / rates[f'timm/fp32/{mode}']:.2f}x timm default (fp32)")
        for lib in peers:
            best = max(rates[f"{lib}/{p}/{mode}"] for p in precisions)
            ratios[f"{mode}/default_vs_{lib}_best"] = ours / best
            said.append(f"{ours / best:.2f}x {lib}'s best precision")
        lines.append(" = ".join(said[:1]) + (" = " + ", ".join(said[1:]) if said[1:] else ""))
    if "timm" in peers and f"vitkit_erf/{precisions[0]}/{modes[0]}" in rates:  # timm's numerics: the GELU's cost
        lines.append(
            "vitkit with exact GELU (timm's and HF's numerics) / timm: "
            + ", ".join(
                f"{mode} {p} {rates[f'vitkit_erf/{p}/{mode}'] / rates[f'timm/{p}/{mode}']:.2f}"
                for mode in modes
                for p in precisions
            )
        )
        for mode in modes:
            for p in precisions:
                ratios[f"{mode}/{p}/erf_vs_timm"] = rates[f"vitkit_erf/{p}/{mode}"] / rates[f"timm/{p}/{mode}"]
    result[f"ratios_{clock}"] = ratios
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line, checked; `libraries`, `configs`, `precisions` and `modes` become tuples, `device` a
    torch.device, and `default_precision` is what vitkit's "auto" resolves to there."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="cifar,ti224", help=f"comma-separated, from {sorted(SPECS)}")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (medians are reported)")
    parser.add_argument("--steps", type=int, default=3, help="steps per timed block")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per case before round 1")
    parser.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16")
    parser.add_argument("--modes", default="training,inference", help="comma-separated: training, inference")
    parser.add_argument("--batch-size", type=int, default=None, help="override each config's batch")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's, one per core)")
    parser.add_argument(
        "--with-exact-gelu",
        action="store_true",
        help="also time vitkit with gelu=exact (timm's and HF's GELU) to isolate that cost",
    )
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (CUDA when present)")
    parser.add_argument("--compile", action="store_true", help="torch.compile every library's model (in the warm-up)")
    parser.add_argument("--libraries", default=",".join(LIBRARIES), help="comma-separated: vitkit and any of timm, hf")
    parser.add_argument("--json", action="store_true", help="also print one JSON object as the last line")
    parser.add_argument("--no-record", action="store_true", help="do not append rows to results/compare.jsonl")
    args = parser.parse_args(argv)
    libraries = tuple(lib for lib in args.libraries.split(",") if lib)
    if "vitkit" not in libraries or not set(libraries) <= set(LIBRARIES) or len(libraries) < 2:
        parser.error(f"--libraries: vitkit and at least one of timm, hf (got {args.libraries!r})")
    args.libraries = libraries + (("vitkit_erf",) if args.with_exact_gelu else ())
    args.device = pick_device(args.device)
    args.configs = tuple(n for n in args.configs.split(",") if n)
    unknown = sorted(set(args.configs) - set(SPECS))
    if unknown:
        parser.error(f"unknown config(s) {unknown}; choose from {sorted(SPECS)}")
    args.precisions = tuple(p for p in args.precisions.split(",") if p)
    args.modes = tuple(m for m in args.modes.split(",") if m)
    args.default_precision = resolve_precision("auto", args.device)
    if args.default_precision not in args.precisions:
        parser.error(f"vitkit's default precision here is {args.default_precision}; include it in --precisions")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device, precisions, modes, default_precision = args.device, args.precisions, args.modes, args.default_precision
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "device": device_name(device),
        "compile": args.compile,
        "default_precision": default_precision,
        "configs": {},
    }
    with num_threads(args.threads):
        out["threads"] = torch.get_num_threads()
        print(
            f"torch {torch.__version__}, {out['device']}, {out['threads']} CPU threads, compile {args.compile}; "
            f"vitkit default precision here: {default_precision}"
        )
        for name in args.configs:
            spec = SPECS[name]
            if args.batch_size:
                spec = Spec(**{**spec.__dict__, "batch_size": args.batch_size})
            start = time.perf_counter()
            result = compare(
                spec, args.rounds, args.steps, args.warmup, precisions, modes, args.libraries, device, args.compile
            )
            head = (
                f"== {name}: {spec.img_size}px, P={spec.patch_size}, D={spec.hidden_size}, L={spec.depth}, "
                f"k={spec.num_heads}, MLP {spec.mlp_dim}, K={spec.num_classes}, batch {spec.batch_size}; "
                f"{result['params']:,} parameters in each library; medians of {args.rounds} rounds x {args.steps} steps"
            )
            lines = [head]
            for clock in ("images_per_s", "images_per_cpu_s"):
                lines += report(name, spec, result, default_precision, precisions, modes, clock)
            result.update(spec=spec.__dict__, wall_s=time.perf_counter() - start)
            out["configs"][name] = result
            print("\n".join(lines) + f"\n({result['wall_s']:.0f} s)", flush=True)
            if not args.no_record:
                record(name, spec, result, args)
    if args.json:
        print(json.dumps(out))
    return 0


def record(name: str, spec: Spec, result: dict[str, Any], args: argparse.Namespace) -> None:
    """One row per (mode, precision) in results/compare.jsonl: each library's images/s and vitkit's ratios."""
    rates = result["images_per_s"]
    peers = [lib for lib in ("timm", "hf") if lib in args.libraries]
    for mode in args.modes:
        for precision in args.precisions:
            figures = {f"{lib}_img_s": round(rates[f"{lib}/{precision}/{mode}"], 2) for lib in ("vitkit", *peers)}
            append_row(
                RESULTS,
                {
                    "config": name,
                    "spec": spec.__dict__,
                    "mode": mode,
                    "precision": precision,
                    "compile": args.compile,
                    "vitkit_default_precision": args.default_precision,
                    **figures,
                    **{f"vs_{lib}": round(figures["vitkit_img_s"] / figures[f"{lib}_img_s"], 3) for lib in peers},
                    "rounds": args.rounds,
                    "steps": args.steps,
                },
                device=str(args.device),
            )


if __name__ == "__main__":
    sys.exit(main())
