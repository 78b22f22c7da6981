"""One device and precision policy (DESIGN.md "Precision"), used by training, MPP, evaluation and bench.

- device "auto" is this process's GPU when CUDA is available (torchrun's LOCAL_RANK picks it), else the CPU;
- precision "auto" is bf16 autocast wherever the device multiplies bf16 natively (CUDA; CPUs with
  AVX512-BF16 / AMX), fp32 elsewhere.  On such a CPU bf16 autocast trains 1.7-1.9x faster than fp32
  at equal accuracy (benchmarks/compare.py, benchmarks/precision_accuracy.py); without native bf16
  it would be slower, so "auto" stays in fp32 there.
"""

from __future__ import annotations

import contextlib
from typing import Literal

import torch

Precision = Literal["auto", "fp32", "bf16"]


def pick_device(requested: str = "auto", local_rank: int = 0) -> torch.device:
    """"auto" = GPU `local_rank` when CUDA is available, else the CPU; any torch device string otherwise."""
    if requested == "auto":
        return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    try:
        device = torch.device(requested)
    except RuntimeError as err:
        raise ValueError(f"unknown device {requested!r}: use auto, cpu, cuda or cuda:N") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {requested!r} asks for CUDA but torch.cuda.is_available() is False")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)
    return device


def native_bf16(device: torch.device) -> bool:
    """Whether `device` multiplies bf16 natively (CUDA with bf16 support; oneDNN on AVX512-BF16 / AMX CPUs)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return device.type == "cpu" and torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def resolve_precision(precision: Precision, device: torch.device) -> Literal["fp32", "bf16"]:
    """"auto" -> "bf16" where native, else "fp32"; explicit values are kept."""
    if precision not in ("auto", "fp32", "bf16"):
        raise ValueError(f"unknown precision {precision!r}; expected auto, fp32 or bf16")
    if precision == "auto":
        return "bf16" if native_bf16(device) else "fp32"
    return precision


def autocast_dtype(precision: Precision, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of a precision setting on `device` (None = full precision)."""
    return torch.bfloat16 if resolve_precision(precision, device) == "bf16" else None


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """`torch.autocast` for `dtype`, or a no-op for full precision."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def synchronize(device: torch.device) -> None:
    """Wait for queued device work (CUDA kernels run asynchronously; timings must wait for them)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
