"""Measured throughput: images/s, achieved FLOP/s and model FLOP utilisation (MFU).

A step is one batch: for inference a forward pass under `torch.inference_mode`, for training a
forward, a backward and an optimiser step.  Each mode is warmed up (kernels selected, caches filled,
`torch.compile` traced) before it is timed; a repeat times `steps` consecutive steps between two
device synchronisations, and the reported figure is the median over repeats, so one slow repeat
(another process taking the CPU) does not move it.

FLOPs are analytic (models/flops.py): the forward count per image, and three times that for a
training step (the backward pass costs two forwards).  MFU = achieved FLOP/s / peak FLOP/s, with the
peak either given or measured here as the best rate of a large square matmul in the same precision (in fp32
for bf16 on a CPU without native bf16: `peak_precision`).
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit import host as hosts
from vitkit.device import autocast as device_autocast
from vitkit.device import autocast_dtype, native_bf16, pick_device, resolve_precision, synchronize
from vitkit.models import build_model, preset_config
from vitkit.models.configs import HybridConfig, image_size, in_channels, num_classes
from vitkit.models.flops import model_flops

log = logging.getLogger(__name__)

Precision = Literal["auto", "fp32", "bf16"]
Mode = Literal["inference", "training"]
TRAIN_FLOPS_FACTOR = 3  # forward + backward (two forward-sized matmuls per forward matmul)


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """What `vitkit bench` measures; the CLI flags map one-to-one onto these fields."""

    model: str = "vit_ti16"  # preset name (vitkit models lists them)
    img_size: int | None = None  # input resolution; None = the preset's
    num_classes: int = 1000  # K, head size
    batch_size: int = 32  # images per step
    precision: Precision = "auto"  # fp32, bf16 autocast, or auto = bf16 where the device computes it natively
    attn_impl: str | None = None  # override the model's attention path (models/kernels.py); None keeps the preset's
    overrides: dict[str, Any] = field(
        default_factory=dict
    )  # other model-config fields, e.g. {"depth": 6, "patch_size": 4}
    compile: bool = False  # torch.compile the model (its compile time is spent in warm-up and reported)
    modes: tuple[Mode, ...] = ("inference", "training")  # what to measure
    warmup: int = 2  # untimed steps per mode
    steps: int = 5  # steps per timed repeat
    repeats: int = 3  # timed repeats; the median is reported
    peak_tflops: float | None = None  # hardware peak for MFU; None = measure a large matmul
    peak_matmul_size: int | None = None  # side of that square matmul; None = 2048 on CPU, 8192 on CUDA
    device: str = "auto"  # "cpu", "cuda", "cuda:1", or auto (CUDA when present)
    threads: int | None = None  # CPU intra-op threads; None keeps torch's default (one per core)
    seed: int = 0  # weights and synthetic inputs

    def __post_init__(self) -> None:
        if self.precision not in ("auto", "fp32", "bf16"):
            raise ValueError(f"precision must be auto, fp32 or bf16, got {self.precision!r}")
        for name in ("batch_size", "steps", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if not self.modes or set(self.modes) - {"inference", "training"}:
            raise ValueError(f"modes must be a non-empty subset of inference, training; got {self.modes}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            raise ValueError(f"peak_tflops must be positive, got {self.peak_tflops}")


# ---------------------------------------------------------------------------------------------
# Device and precision


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast (matmuls in bf16, reductions in fp32, weights kept fp32) or a no-op for fp32."""
    return device_autocast(device, autocast_dtype(precision))


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"cpu ({torch.get_num_threads()} threads)"


# ---------------------------------------------------------------------------------------------
# Steps: closures over model, optimiser and one fixed batch, so timing measures compute only


def make_optimizer(model: nn.Module, device: torch.device, lr: float = 1e-4) -> torch.optim.Optimizer:
    """AdamW as training uses it: one fused kernel on CUDA, the multi-tensor (foreach) path on CPU."""
    params = [p for p in model.parameters() if p.requires_grad]
    if device.type == "cuda":
        return torch.optim.AdamW(params, lr=lr, fused=True)
    return torch.optim.AdamW(params, lr=lr, foreach=True)


def inference_step(model: nn.Module, images: Tensor, device: torch.device, precision: str) -> Callable[[], Tensor]:
    """One forward pass without autograd bookkeeping; returns the logits (never read on the host)."""

    def step() -> Tensor:
        with torch.inference_mode(), autocast(device, precision):
            return model(images)

    return step


def training_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    images: Tensor,
    labels: Tensor,
    device: torch.device,
    precision: str,
) -> Callable[[], Tensor]:
    """Forward, cross-entropy, backward and optimiser step; returns the loss tensor (no host sync)."""

    def step() -> Tensor:
        with autocast(device, precision):
            logits = model(images)
        loss = F.cross_entropy(logits.float(), labels)  # loss in fp32 whatever the matmul precision
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def time_steps(step: Callable[[], Any], device: torch.device, steps: int) -> float:
    """Seconds per step over `steps` consecutive steps, synchronised before and after."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return (time.perf_counter() - start) / steps


# ---------------------------------------------------------------------------------------------
# Peak memory: CUDA's allocator high-water mark, or the CPU process's peak resident set


class PeakMemory:
    """Peak memory while the `with` block runs: bytes above the level at entry.

    CUDA: `torch.cuda.max_memory_allocated` (tensors only).  CPU: the process's peak resident set
    size (VmHWM in /proc/self/status), reset at entry through /proc/self/clear_refs where the kernel
    allows it; otherwise the high-water mark can only grow, and the figure is a lower bound.
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.bytes: int | None = None
        self.kind = "cuda max_memory_allocated" if device.type == "cuda" else "cpu peak RSS increase"

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            _reset_cpu_peak()
            self._base = _proc_status_bytes("VmRSS") or 0
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            synchronize(self.device)
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self._base
        else:
            peak = _proc_status_bytes("VmHWM")
            self.bytes = None if peak is None else max(peak - self._base, 0)


def _proc_status_bytes(field: str) -> int | None:
    """A "kB" field of /proc/self/status in bytes, or None where there is no procfs (not Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_cpu_peak() -> None:
    """Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


# ---------------------------------------------------------------------------------------------
# Peak FLOP/s and the summary of one mode


def measure_peak_flops(device: torch.device, precision: str, size: int | None = None, repeats: int = 5) -> float:
    """FLOP/s of the best of `repeats` square matmuls (size x size) in `peak_precision(device, precision)`.

    The default size (2048 on CPU, 8192 on CUDA) is large enough to reach the matmul plateau.
    """
    dtype = autocast_dtype(peak_precision(device, precision)) or torch.float32
    size = size or (8192 if device.type == "cuda" else 2048)
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device, dtype)
    b = torch.randn(size, size, generator=gen).to(device, dtype)
    torch.mm(a, b)  # warm-up: library initialisation, kernel choice
    best = min(time_steps(lambda: torch.mm(a, b), device, steps=2) for _ in range(repeats))
    return 2.0 * size**3 / best


def peak_precision(device: torch.device, precision: str) -> str:
    """The precision whose matmul plateau is the peak MFU is measured against: the run's own, except bf16 on a CPU
    without native bf16, which converts to fp32 and multiplies on the fp32 units.  Its own square matmul there is
    no ceiling (a few GFLOP/s, below the model's rectangular ones: MFU read 280-550%), fp32's is the hardware's."""
    emulated = precision == "bf16" and device.type == "cpu" and not native_bf16(device)
    return "fp32" if emulated else precision


def summarize(
    seconds_per_step: list[float], batch_size: int, flops_per_image: float, peak_flops: float | None
) -> dict[str, Any]:
    """images/s from the median step time; achieved FLOP/s = images/s x FLOPs/image; MFU = achieved / peak."""
    median = statistics.median(seconds_per_step)
    images_per_s = batch_size / median
    achieved = images_per_s * flops_per_image
    return {
        "images_per_s": images_per_s,
        "seconds_per_step": median,
        "seconds_per_step_repeats": list(seconds_per_step),
        "flops_per_image": flops_per_image,
        "achieved_flops": achieved,
        "mfu": achieved / peak_flops if peak_flops else None,
    }


# ---------------------------------------------------------------------------------------------
# The benchmark


def bench_model(config: BenchConfig) -> tuple[nn.Module, Any]:
    overrides = dict(config.overrides)
    if config.attn_impl is not None:
        overrides["attn_impl"] = config.attn_impl
    model_config = preset_config(config.model, num_classes=config.num_classes, img_size=config.img_size, **overrides)
    torch.manual_seed(config.seed)
    return build_model(model_config), model_config


def run_benchmark(config: BenchConfig) -> dict[str, Any]:
    """Measure every mode of `config`; returns the JSON-ready result (see `summarize` for each mode)."""
    with num_threads(config.threads):
        return _run_benchmark(config)


def _run_benchmark(config: BenchConfig) -> dict[str, Any]:
    device = pick_device(config.device)
    precision = resolve_precision(config.precision, device)
    model, model_config = bench_model(config)
    model = model.to(device)
    params = sum(p.numel() for p in model.parameters())
    flops = model_flops(model_config)
    if config.peak_tflops is not None:
        peak, peak_source = config.peak_tflops * 1e12, "given"
    else:
        peak = measure_peak_flops(device, precision, config.peak_matmul_size)
        measured = peak_precision(device, precision)
        peak_source = f"measured ({measured} matmul{'; bf16 is not native here' if measured != precision else ''})"
    if config.compile:
        hosts.use_compile_cache(device)  # kernels of another host class crash this one
    runner = torch.compile(model) if config.compile else model
    gen = torch.Generator(device="cpu").manual_seed(config.seed)
    size, chans = image_size(model_config), in_channels(model_config)
    images = torch.randn(config.batch_size, chans, size, size, generator=gen).to(device, non_blocking=True)
    labels = torch.randint(0, max(num_classes(model_config), 1), (config.batch_size,), generator=gen).to(device)
    result: dict[str, Any] = {
        "model": config.model,
        "family": "hybrid" if isinstance(model_config, HybridConfig) else type(model_config).__name__[:-6].lower(),
        "img_size": size,
        "batch_size": config.batch_size,
        "precision": precision,
        "attn_impl": getattr(model_config, "attn_impl", None),
        "compile": config.compile,
        "device": device_name(device),
        "torch": torch.__version__,
        "params": params,
        "forward_flops_per_image": flops,
        "peak_flops": peak,
        "peak_source": peak_source,
    }
    for mode in config.modes:
        if mode == "inference":
            model.eval()
            step = inference_step(runner, images, device, precision)
            factor = 1
        else:
            model.train()
            optimizer = make_optimizer(model, device)
            step = training_step(runner, optimizer, images, labels, device, precision)
            factor = TRAIN_FLOPS_FACTOR
        with PeakMemory(device) as memory:
            start = time.perf_counter()
            for _ in range(config.warmup):
                step()
            synchronize(device)
            warmup_s = time.perf_counter() - start
            times = [time_steps(step, device, config.steps) for _ in range(config.repeats)]
        summary = summarize(times, config.batch_size, factor * flops, peak)
        summary.update(warmup_s=warmup_s, peak_memory_bytes=memory.bytes, memory_kind=memory.kind)
        result[mode] = summary
        log.info("%s %s: %.1f images/s", config.model, mode, summary["images_per_s"])
    note = mfu_note(result)
    return {**result, "mfu_note": note} if note else result


def mfu_note(result: dict[str, Any]) -> str | None:
    """What an MFU above 100% means: the peak it is against is below the rate the run reached (a given peak too
    low, or a measured one disturbed); None where every MFU is a fraction of its peak."""
    above = [mode for mode in ("inference", "training") if mode in result and (result[mode]["mfu"] or 0) > 1]
    if not above:
        return None
    remedy = "pass the hardware's peak to --peak-tflops" if result["peak_source"] == "given" else "measure again"
    return (
        f"MFU above 100% ({', '.join(above)}): the peak, {result['peak_flops'] / 1e12:.3g} TFLOP/s "
        f"({result['peak_source']}), is below what the run reached; {remedy}"
    )


def format_table(result: dict[str, Any]) -> str:
    """The human-readable table `vitkit bench` prints."""
    head = (
        f"{result['model']} @ {result['img_size']}px, batch {result['batch_size']}, {result['precision']}, "
        f"attention {result['attn_impl']}, compile {result['compile']}, {result['device']}\n"
        f"params {result['params']:,}   forward {result['forward_flops_per_image'] / 1e9:.3f} GFLOPs/image   "
        f"peak {result['peak_flops'] / 1e12:.3f} TFLOP/s ({result['peak_source']})"
    )
    lines = [head, f"{'mode':<10}{'img/s':>10}{'ms/step':>10}{'GFLOP/img':>11}{'TFLOP/s':>9}{'MFU':>8}{'peak MiB':>10}"]
    for mode in ("inference", "training"):
        if mode not in result:
            continue
        r = result[mode]
        mfu = "-" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%" if r["mfu"] < 10 else ">999%"  # column width
        mem = f"{r['peak_memory_bytes'] / 2**20:.0f}" if r["peak_memory_bytes"] is not None else "-"
        lines.append(
            f"{mode:<10}{r['images_per_s']:>10.1f}{1e3 * r['seconds_per_step']:>10.1f}"
            f"{r['flops_per_image'] / 1e9:>11.3f}{r['achieved_flops'] / 1e12:>9.3f}{mfu:>8}{mem:>10}"
        )
    return "\n".join([*lines, result["mfu_note"]] if result.get("mfu_note") else lines)


@contextlib.contextmanager
def num_threads(threads: int | None) -> Iterator[None]:
    """Run the block with `threads` intra-op CPU threads (None: leave torch's setting)."""
    before = torch.get_num_threads()
    if threads:
        hosts.set_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
