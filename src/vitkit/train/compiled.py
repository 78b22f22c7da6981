"""torch.compile for training: the compiler check and a warm-up that compiles before the clock starts.

On the CPU, inductor writes C++ and needs a compiler (g++, clang++ or $CXX); without one, or on a
Python that torch.compile does not support, `compile_for_training` warns and keeps the eager
model.  Compiling one graph (forward + backward) takes 20-30 s on a 2-core CPU, and a run needs one
per phase of the schedule (PatchDropout on or off, each training resolution).  Left to the first
step of each phase, that time would count on the budget clock of `run.budget_schedule=fit` and eat
the warm-up of the learning rate.  `warm_up` compiles every graph the run will still need on blank
batches, before the clock starts: under a forked RNG and without an optimiser step, so weights,
gradients and random streams are exactly what they would be without it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from typing import Callable

import torch
from torch import Tensor, nn

from vitkit.train.schedule import phase_at

log = logging.getLogger("vitkit.train")


def cpp_compiler() -> str | None:
    """Path of the C++ compiler inductor would use on the CPU, or None."""
    for name in (os.environ.get("CXX"), "g++", "clang++", "c++"):
        path = shutil.which(name) if name else None
        if path:
            return path
    return None


def compile_for_training(model: nn.Module, device: torch.device) -> nn.Module:
    """`torch.compile(model)` with static shapes (one graph per phase), or `model` where it cannot compile."""
    if not torch._dynamo.is_dynamo_supported():  # e.g. a Python version this torch cannot trace
        log.warning("run.compile: torch.compile is not supported on this Python/torch; training eagerly")
        return model
    if device.type == "cpu" and cpp_compiler() is None:
        log.warning("run.compile: no C++ compiler (g++, clang++ or $CXX) for torch.compile's CPU code; "
                    "training eagerly (install g++ to compile)")
        return model
    return torch.compile(model, dynamic=False)


def phases(rate: float, until: float, resolutions: tuple[int, ...], resolution_until: tuple[float, ...], size: int,
           start: float = 0.0) -> list[tuple[float, int]]:
    """(PatchDropout rate, side) of each phase of the schedule that is not over at fraction `start`.

    The schedule changes phase only at `until` and the `resolution_until` marks; each span between
    marks is read with `phase_at`, the loop's own rule.
    """
    marks = sorted({0.0, 1.0, *(f for f in (*resolution_until, until) if 0.0 < f < 1.0)})
    found: list[tuple[float, int]] = []
    for begin, end in zip(marks, marks[1:]):
        phase = phase_at(begin, rate, until, resolutions, resolution_until, size)
        if end > start and phase not in found:
            found.append(phase)
    return found


def warm_up(model: nn.Module, module: nn.Module, needed: list[tuple[float, int]], inputs: Callable[[int], Tensor],
            autocast_dtype: torch.dtype | None, device: torch.device) -> float:
    """One forward + backward of `model` per (PatchDropout rate, side) in `needed`; returns the seconds spent.

    `module` is the unwrapped model (it carries `patch_dropout`); `inputs(side)` gives a batch laid
    out as the training batches are (the compiled code is specialised to shapes and strides, also of
    size-1 axes).  Gradients are cleared afterwards and the RNG state is restored, so the run
    continues as if nothing had happened.
    """
    start = time.monotonic()
    rate_before, was_training = getattr(module, "patch_dropout", None), module.training
    module.train()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for rate, side in needed:
                if rate_before is not None:
                    module.patch_dropout = rate
                with torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext():
                    logits = model(inputs(side))
                logits.float().sum().backward()
    finally:  # also when compilation fails: the caller may go on eagerly
        if rate_before is not None:
            module.patch_dropout = rate_before
        module.train(was_training)
        for param in module.parameters():
            param.grad = None
    return time.monotonic() - start
