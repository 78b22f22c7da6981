"""`speed` (App. D.5, Figure 12): inference images/s and the largest batch that fits, against input size.

Arms: one per input size and seed, each measuring every model of the study in alternating rounds (model
A, model B, A, B, ...) so that a change of the machine's load hits every model alike; the median round
gives images/s.  Models: the paper's pairs of "comparable computational cost" (Sec. 4.3), ViT-B/32 with
BiT-R50x1 and, from BASE_MINUTES of budget, ViT-L/16 with BiT-R152x2; at the tiny scale (a budget under
2.25 minutes) two toy models.
Largest batch: the peak memory of one inference pass at two batch sizes (bench/throughput.py's
PeakMemory: CUDA's allocator, or the CPU process's peak resident set) fitted as fixed + per-image
bytes, extrapolated to the device's memory (CPU: CPU_MEMORY_GIB, one TPUv3 core's, the paper's device).
Claims: ViT runs at least COMPARABLE times as fast as its ResNet peer; ViT fits at least CLEARLY times
as large a batch (geometric means over pairs and sizes, per seed).
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from vitkit.bench.throughput import PeakMemory, inference_step, time_steps
from vitkit.device import pick_device, resolve_precision
from vitkit.models import build_model, preset_config
from vitkit.models.configs import ResNetConfig, ViTConfig
from vitkit.models.flops import model_flops
from vitkit.reproduce import paper
from vitkit.reproduce.arms import Probes, reuse, write_record
from vitkit.reproduce.figures import Panel, Series, draw, mean_sd
from vitkit.reproduce.spec import Analysis, Arm, Claim, Context, Study, Table
from vitkit.reproduce.verdict import INCONCLUSIVE, Verdict, estimate, exceeds, seed_sd

PAIRS = (("vit_b32", "bit_r50x1"), ("vit_l16", "bit_r152x2"))  # Sec. 4.3's pairs of comparable cost
SIZES = (224, 288, 384)
TINY_SIZES = (16, 32)
BASE_MINUTES = 20.0  # the budget from which the second pair is measured too
UNITS = 6.0  # scale.py's tiny scale (the toy models) below 6 x TINY_UNIT_MINUTES / TRAIN_SHARE = 2.25 min
ROUNDS, STEPS = 3, 2  # alternating rounds of timed steps per model
CPU_MEMORY_GIB = 16.0
COMPARABLE, CLEARLY = 0.8, 1.25


def config_of(name: str, size: int) -> Any:
    """The model `name` at input side `size`: a preset, or one of the tiny scale's toy models."""
    if name == "tiny-vit":
        return ViTConfig(img_size=size, patch_size=4, hidden_size=32, depth=2, num_heads=2, mlp_dim=64, num_classes=10)
    if name == "tiny-resnet":
        return ResNetConfig(layers=(1,), img_size=size, num_classes=10)
    return preset_config(name, img_size=size)


def pairs(context: Context) -> list[tuple[str, str]]:
    """(ViT, ResNet) pairs measured at this budget."""
    if context.scale.name == "tiny":
        return [("tiny-vit", "tiny-resnet")]
    return list(PAIRS if context.request.budget_minutes >= BASE_MINUTES else PAIRS[:1])


def plan(context: Context) -> list:
    sizes = TINY_SIZES if context.scale.name == "tiny" else SIZES
    names = [name for pair in pairs(context) for name in pair]
    return [
        Arm(
            name=f"{size}px",
            seed=seed,
            config=None,
            labels={"size": size, "models": names, "device": context.request.device},
            measure=(),
        )
        for seed in context.seeds
        for size in sizes
    ]


def batch_size(device: torch.device) -> int:
    return 64 if device.type == "cuda" else 8


def memory_limit(device: torch.device) -> float:
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return CPU_MEMORY_GIB * 2**30


# ------------------------------------------------------------------------------------ measuring
def run_speed_arm(arm: Arm, path: Path, probes: Probes) -> dict[str, Any]:
    """Time every model of the arm in alternating rounds and fit its memory; write arm.json (reused if present)."""
    stored = reuse(arm, path, None)
    if stored is not None and stored.get("labels") == arm.labels:
        return stored
    began = time.monotonic()
    device = pick_device(arm.labels["device"])
    precision, batch, size = resolve_precision("auto", device), batch_size(device), arm.labels["size"]
    torch.manual_seed(arm.seed)
    configs = {name: config_of(name, size) for name in arm.labels["models"]}
    built = {name: build_model(config).to(device).eval() for name, config in configs.items()}
    inputs = {name: torch.randn(batch, config.in_chans, size, size, device=device) for name, config in configs.items()}
    steps = {name: inference_step(model, inputs[name], device, precision) for name, model in built.items()}
    seconds: dict[str, list[float]] = {name: [] for name in built}
    for step in steps.values():
        step()  # warm-up: kernels chosen, caches filled
    for _ in range(ROUNDS):  # alternating: A, B, A, B, ...
        for name, step in steps.items():
            seconds[name].append(time_steps(step, device, STEPS))
    out = {}
    for name, model in built.items():
        params = sum(p.numel() for p in model.parameters())
        out[name] = {
            "images_per_s": batch / statistics.median(seconds[name]),
            "seconds_per_step": seconds[name],
            "params": params,
            "forward_flops": model_flops(configs[name]),
            **memory_fit(model, inputs[name], device, precision, params),
        }
    record = {
        "arm": arm.name,
        "seed": arm.seed,
        "labels": arm.labels,
        "config": None,
        "models": out,
        "batch": batch,
        "precision": precision,
        "device": str(device),
        "reused": False,
        "wall_minutes": round((time.monotonic() - began) / 60, 3),
    }
    write_record(path, record)
    return record


def memory_fit(
    model: torch.nn.Module, images: torch.Tensor, device: torch.device, precision: str, params: int
) -> dict[str, Any]:
    """Peak memory of inference at half and the full batch -> fixed + per-image bytes -> the largest batch."""
    peaks = []
    for count in (len(images) // 2, len(images)):
        step = inference_step(model, images[:count], device, precision)
        with PeakMemory(device) as memory:
            step()
        peaks.append((count, memory.bytes or 0))
    (b1, m1), (b2, m2) = peaks
    kind = PeakMemory(device).kind
    if m2 <= m1:  # below what the counter resolves (tiny models): no fit
        return {"per_image_bytes": None, "fixed_bytes": None, "largest_batch": None, "memory_kind": kind}
    per_image = (m2 - m1) / (b2 - b1)
    fixed = max(m1 - b1 * per_image, 0.0)
    room = memory_limit(device) - 4 * params - fixed  # fp32 weights stay resident
    return {
        "per_image_bytes": per_image,
        "fixed_bytes": fixed,
        "largest_batch": max(int(room // per_image), 0),
        "memory_kind": kind,
    }


# ------------------------------------------------------------------------------------- analysis
def log_ratios(records: list, context: Context, key: str) -> list[float]:
    """Per seed: the mean over pairs and sizes of log(ViT's / its ResNet peer's `key`) (unmeasured ones left out)."""
    out = []
    for seed in sorted({r["seed"] for r in records}):
        logs = [
            math.log(max(r["models"][vit][key], 1) / max(r["models"][cnn][key], 1))
            for r in records
            if r["seed"] == seed
            for vit, cnn in pairs(context)
            if r["models"][vit][key] is not None and r["models"][cnn][key] is not None
        ]
        if logs:
            out.append(sum(logs) / len(logs))
    return out


def ratio_claim(stat: list[float], threshold: float, what: str) -> Verdict:
    if not stat:
        return Verdict(
            INCONCLUSIVE, f"{what}: not measured (the memory counter does not resolve these models' per-image memory)"
        )
    shifted = [v - math.log(threshold) for v in stat]
    return exceeds(estimate(shifted, seed_sd(shifted)), 0.0, f"log({what}) - log({threshold})", seed_sd(shifted))


def geometric(values: list[float]) -> float | None:
    return round(math.exp(sum(values) / len(values)), 3) if values else None


def analyse(context: Context, records: list) -> Analysis:
    fast = log_ratios(records, context, "images_per_s")
    memory = log_ratios(records, context, "largest_batch")
    claims = [
        Claim(
            "speed.comparable",
            "ViT runs about as fast as ResNets of comparable cost",
            paper.SPEED,
            "inference images/s (median of alternating rounds)",
            ratio_claim(fast, COMPARABLE, "ViT / ResNet images/s"),
            {"ViT / ResNet speed (geometric mean)": geometric(fast), "pairs": pairs(context)},
        ),
        Claim(
            "speed.memory",
            "ViT fits clearly larger batches than ResNets",
            paper.SPEED,
            "largest inference batch in the device's memory",
            ratio_claim(memory, CLEARLY, "ViT / ResNet largest batch"),
            {"ViT / ResNet largest batch (geometric mean)": geometric(memory)},
        ),
    ]
    figure(context, records)
    device = records[0]["device"] if records else "?"
    notes = [
        f"inference, batch {records[0]['batch'] if records else '?'}, {records[0]['precision'] if records else '?'}"
        f" on {device}; {ROUNDS} alternating rounds of {STEPS} steps per model; memory limit "
        f"{CPU_MEMORY_GIB:g} GiB on a CPU (one TPUv3 core's), the device's memory on CUDA",
        "Figure 12 times each model at its best batch size on a TPUv3 core; here one batch size per device",
    ]
    return Analysis(
        claims,
        [table(records)],
        [("speed.png", "Figure 12: images/s (left) and largest batch (right) against input size")],
        notes,
    )


def table(records: list) -> Table:
    rows = [
        [
            f"{r['labels']['size']}",
            str(r["seed"]),
            name,
            f"{m['params']:,}",
            f"{m['forward_flops'] / 1e9:.2f}",
            f"{m['images_per_s']:.2f}",
            f"{m['per_image_bytes'] / 2**20:.1f}" if m["per_image_bytes"] else "-",
            f"{m['largest_batch']:,}" if m["largest_batch"] is not None else "-",
        ]
        for r in records
        for name, m in r["models"].items()
    ]
    return Table(
        "Speed and memory per model and input size",
        ["size", "seed", "model", "params", "GFLOPs/image", "images/s", "MiB/image", "largest batch"],
        rows,
    )


def figure(context: Context, records: list) -> None:
    panels = []
    for key, label in (("images_per_s", "inference images/s"), ("largest_batch", "largest batch")):
        series = []
        for name in records[0]["models"] if records else ():
            sizes = sorted({r["labels"]["size"] for r in records})
            sizes = [
                s for s in sizes if all(r["models"][name][key] is not None for r in records if r["labels"]["size"] == s)
            ]
            stats = [mean_sd([r["models"][name][key] for r in records if r["labels"]["size"] == s]) for s in sizes]
            series.append(
                Series(
                    name,
                    sizes,
                    [m for m, _ in stats],
                    [sd for _, sd in stats],
                    marker="o" if "vit" in name else "s",
                    dashed="vit" not in name,
                )
            )
        panels.append(Panel(f"like Figure 12: {label}", "input size (px)", label, series, ylog=True))
    draw(context.out / "speed.png", panels)


STUDY = Study(
    name="speed",
    title="Inference speed and memory against input size (App. D.5, Figure 12)",
    units=UNITS,
    plan=plan,
    analyse=analyse,
    run_arm=run_speed_arm,
)
