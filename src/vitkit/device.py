"""One device and precision policy (DESIGN.md "Precision", "The host decides how"), used by training, MPP,
evaluation, serving and bench.

- device "auto" is this process's GPU when CUDA is available (torchrun's LOCAL_RANK picks it), else the CPU;
- precision "auto" is bf16 autocast only where the device multiplies bf16 natively (CUDA; CPUs with
  AVX512-BF16 / AMX) and, where a caller can time its model (`choose_precision(measure=...)`), only where
  bf16 measures at least BF16_MIN_SPEEDUP times as fast as fp32 for that model on this host; fp32 elsewhere.
  Without native bf16 a bf16 matmul runs 10-20x slower than fp32 (AVX2: 2.5 against 58 GFLOP/s, one
  thread), so an explicit "bf16" there is kept but warned about once, with the slowdown measured;
- timing on this host is measured here: `time_pass` (one pass) and `first_is_faster` (two paths against each
  other, as the kernels' choice of the fused dense + GELU uses).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from vitkit import host as hosts

log = logging.getLogger(__name__)

Precision = Literal["auto", "fp32", "bf16"]


def pick_device(requested: str = "auto", local_rank: int = 0) -> torch.device:
    """ "auto" = GPU `local_rank` when CUDA is available, else the CPU; any torch device string otherwise.

    A GPU the machine does not have (more processes than GPUs under torchrun, or cuda:N past the last) is a
    ValueError that says what to run instead."""
    if requested == "auto":
        device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    else:
        try:
            device = torch.device(requested)
        except RuntimeError as err:
            raise ValueError(f"unknown device {requested!r}: use auto, cpu, cuda or cuda:N") from err
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device {requested!r} asks for CUDA but torch.cuda.is_available() is False")
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", local_rank)
    if device.type == "cuda" and device.index >= (count := torch.cuda.device_count()):
        if requested not in ("auto", "cuda"):  # a GPU named by its number
            raise ValueError(
                f"device {requested!r}: the machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
            )
        raise ValueError(
            f"this process (local rank {local_rank}) asks for GPU {device.index} but the machine has {count} CUDA "
            f"device(s): start at most one process per GPU (torchrun --nproc_per_node {count}), or train on the "
            "CPU with --set run.device=cpu"
        )
    return device


def native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bf16 natively (CUDA with bf16 support; oneDNN on AVX512-BF16 / AMX CPUs)."""
    return device.type in ("cpu", "cuda") and hosts.current(device).native_bf16


def resolve_precision(precision: Precision, device: torch.device) -> Literal["fp32", "bf16"]:
    """ "auto" -> "bf16" where native, else "fp32"; explicit values are kept (`choose_precision` without a model
    to time: for inference and benchmarks)."""
    return choose_precision(precision, device).precision


BF16_MIN_SPEEDUP = 1.15  # "auto" picks bf16 where a model's passes measure at least this much faster in it
_warned: set[str] = set()


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a run uses and why (the plan prints `reason`)."""

    precision: Literal["fp32", "bf16"]
    reason: str
    speedup: float | None = None  # measured bf16 speed / fp32 speed for the caller's model, where measured

    @property
    def dtype(self) -> torch.dtype | None:
        return autocast_dtype(self.precision)


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a precision ("bf16": bfloat16; "fp32": None, full precision)."""
    return torch.bfloat16 if precision == "bf16" else None


def _measured_words(speedup: float | None) -> str:
    """How a measured bf16/fp32 speed ratio reads: "measured 4.8x slower" or "measured 1.67x as fast"."""
    if not speedup:
        return ""
    if speedup < 1:
        return f", measured {1 / speedup:.1f}x slower than fp32 here"
    return f", measured {speedup:.2f}x as fast as fp32 here"


def choose_precision(
    requested: Precision, device: torch.device, measure: Callable[[torch.dtype | None], float] | None = None
) -> PrecisionChoice:
    """The precision for `requested` on `device`, with its reason.

    `measure(dtype)` (optional) returns the seconds of one representative pass of the caller's model under
    autocast `dtype` (None = fp32); it is called only where the choice depends on it: "auto" on a CPU with
    native bf16, and an explicit "bf16" on one without (to say how much slower it is).
    """
    if requested not in ("auto", "fp32", "bf16"):
        raise ValueError(f"unknown precision {requested!r}; expected auto, fp32 or bf16")
    native = native_bf16(device)
    if requested == "fp32":
        return PrecisionChoice("fp32", "fp32 as requested")
    if requested == "bf16":
        if native or device.type != "cpu":
            return PrecisionChoice("bf16", "bf16 as requested")
        speedup = _speedup(measure)
        slower = _measured_words(speedup)
        _warn_once(
            "bf16-not-native",
            f"precision bf16 on a CPU without native bf16 ({hosts.current().isa}){slower}; "
            "precision auto (the default) trains in fp32 here",
        )
        return PrecisionChoice("bf16", f"bf16 as requested, though this CPU has no native bf16{slower}", speedup)
    if not native:
        return PrecisionChoice(
            "fp32", "auto: this " + ("GPU" if device.type == "cuda" else "CPU") + " has no native bf16"
        )
    if device.type != "cpu" or measure is None:
        return PrecisionChoice("bf16", "auto: native bf16")
    speedup = _speedup(measure)
    if speedup is not None and speedup < BF16_MIN_SPEEDUP:
        return PrecisionChoice(
            "fp32",
            f"auto: native bf16, but this model measured {speedup:.2f}x as fast in bf16 as in "
            f"fp32 here (below {BF16_MIN_SPEEDUP:g}x)",
            speedup,
        )
    measured = f", {speedup:.2f}x as fast as fp32 for this model here" if speedup else ""
    return PrecisionChoice("bf16", f"auto: native bf16{measured}", speedup)


PRECISION_ROUNDS = 2  # fp32 and bf16 timed alternately this often: a burst of other work falls on both


def _speedup(measure: Callable[[torch.dtype | None], float] | None) -> float | None:
    """fp32 seconds / bf16 seconds of the caller's pass (the fastest of PRECISION_ROUNDS alternated measurements
    each), or None where it cannot be measured."""
    if measure is None:
        return None
    fp32 = bf16 = float("inf")
    for _ in range(PRECISION_ROUNDS):
        fp32, bf16 = min(fp32, measure(None)), min(bf16, measure(torch.bfloat16))
    return fp32 / bf16 if 0 < fp32 < float("inf") and 0 < bf16 < float("inf") else None


def time_pass(run: Callable[[], object], device: torch.device, repeats: int = 3) -> float:
    """The fastest of `repeats` timed calls of `run` after one untimed one (which warms caches)."""
    run()
    synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        synchronize(device)
        best = min(best, time.perf_counter() - began)
    return best


TIMING_WARMUP = 3  # untimed calls of each path: a process's first calls pay for its thread pool and allocator
TIMING_ROUNDS = 5  # then the two paths alternate, so a passing disturbance falls on both


def first_is_faster(first: Callable[[], object], second: Callable[[], object], margin: float = 1.0) -> bool:
    """Whether `first` runs faster than `second` on this host, by at least `margin` (1.05: 5%): the fastest of
    TIMING_ROUNDS alternated calls each, after TIMING_WARMUP untimed calls of each (timed one after the other,
    with one warm-up call, the path timed first could still be cold and lose where it is faster)."""
    for _ in range(TIMING_WARMUP):
        first()
        second()
    best = [float("inf"), float("inf")]
    for _ in range(TIMING_ROUNDS):
        for index, run in enumerate((first, second)):
            began = time.perf_counter()
            run()
            best[index] = min(best[index], time.perf_counter() - began)
    return best[0] * margin < best[1]


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning("%s", message)


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """`torch.autocast` for `dtype`, or a no-op for full precision."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def synchronize(device: torch.device) -> None:
    """Wait for queued device work (CUDA kernels run asynchronously; timings must wait for them)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
