"""torch.compile for training: whether it pays for itself on this host, its cache, and the compiler check.

Compiling one graph (forward + backward) takes ~20-70 s on a 2-core CPU (COMPILE_SECONDS) and a run needs
one per phase of its schedule (PatchDropout on, then off); the compiled small recipes then step 1.3-1.5x as
fast.
`decide` compiles only where the run saves more time than compiling costs: a run of a few steps trains
eagerly.  The trainer compiles every graph the run needs in its warm-up, before the clock starts
(train/budget.py).  inductor's cache is reused across runs; vitkit keeps it per host class (ISA, native
bf16, torch version) unless TORCHINDUCTOR_CACHE_DIR names one, since a cache written under one class can
crash a process of another (with torch 2.13, kernels cached under ATEN_CPU_CAPABILITY=avx2 corrupt the heap
of an AVX-512 process that loads them).  On the CPU, inductor writes C++ and needs a compiler (g++, clang++
or $CXX); without one, or on a Python that torch.compile does not support, the model trains eagerly.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from vitkit import host as hosts
from vitkit.atomic import atomic_write_text
from vitkit.train.budget import GraphKey, warm_up

log = logging.getLogger("vitkit.train")

# compiling one training graph into a cold cache on a 2-core CPU, until this host class has measured its own:
# 20-40 s measured with AVX-512 and native bf16, 71 s on an AVX2 CPU (AMD EPYC, Zen 3)
COMPILE_SECONDS = 45.0
MEASURED_FILE = "vitkit-compile-seconds.json"  # in the host class's cache dir: the last cold compiles, per graph
RECENT = 5  # cold compiles kept: their median is the next decision's cost
COMPILED_SPEEDUP = 1.3  # eager step time / compiled step time, the least measured for the small recipes


def cpp_compiler() -> str | None:
    """Path of the C++ compiler inductor would use on the CPU, or None."""
    for name in (os.environ.get("CXX"), "g++", "clang++", "c++"):
        path = shutil.which(name) if name else None
        if path:
            return path
    return None


def decide(
    requested: Literal["auto", "on", "off"],
    device: torch.device,
    *,
    graphs: int,
    eager_step_s: float,
    steps: int | None,
    budget_s: float | None,
    graph_s: tuple[float, str] = (COMPILE_SECONDS, "estimated"),
) -> tuple[bool, str]:
    """Whether to compile, and why: "auto" compiles where the run's eager time, cut by COMPILED_SPEEDUP, saves
    more than compiling its `graphs` costs at `graph_s` = (seconds a graph, where that figure comes from).
    The run's eager time is `steps` x `eager_step_s`, at most the usable `budget_s`; under a budget alone, the
    budget."""
    if requested == "off":
        return False, "run.compile=off"
    unavailable = _unavailable(device)
    if unavailable:
        return False, unavailable
    if requested == "on":
        return True, "run.compile=on"
    run_s = min((x for x in (None if steps is None else steps * eager_step_s, budget_s) if x is not None), default=0.0)
    saved_s, cost_s = run_s * (1 - 1 / COMPILED_SPEEDUP), graphs * graph_s[0]
    numbers = (
        f"~{_duration(run_s)} of eager training, {COMPILED_SPEEDUP:g}x faster compiled, saves "
        f"~{_duration(saved_s)}; compiling {graphs} graph(s) costs ~{_duration(cost_s)} into a cold cache "
        f"({graph_s[1]})"
    )
    if saved_s > cost_s:
        return True, f"auto: {numbers}"
    return False, f"auto: {numbers}; run.compile=on forces it"


def _unavailable(device: torch.device) -> str:
    """Why torch.compile cannot run here ("" where it can)."""
    if not torch._dynamo.is_dynamo_supported():  # e.g. a Python version this torch cannot trace
        return "torch.compile is not supported on this Python/torch"
    if device.type == "cpu" and cpp_compiler() is None:
        return "no C++ compiler (g++, clang++ or $CXX) for torch.compile's CPU code; install g++ to compile"
    return ""


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def graph_seconds(device: torch.device) -> tuple[float, str]:
    """Seconds compiling one training graph into a cold cache costs here, and where the figure comes from: the
    median of the last RECENT cold compiles measured on this host class (kept in its cache dir), else
    COMPILE_SECONDS."""
    recent = _recent_compiles(device)
    if not recent:
        return COMPILE_SECONDS, "estimated"
    return statistics.median(recent), "measured on this host class"


def _recent_compiles(device: torch.device) -> list[float]:
    """The seconds a graph of the last cold compiles took here, oldest first ([] where none is known or the file
    is not one vitkit wrote; a file of one figure, "per_graph_s", is read as one compile)."""
    try:
        kept = json.loads(Path(hosts.use_compile_cache(device), MEASURED_FILE).read_text())
        recent = kept.get("recent_s", [kept.get("per_graph_s")])
        recent = [float(seconds) for seconds in recent][-RECENT:]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return []
    return recent if all(0 < seconds < 86_400 for seconds in recent) else []


def remember_graph_seconds(device: torch.device, per_graph_s: float, *, cold: bool) -> None:
    """Keep a compile's seconds a graph for the next run's decision (best effort): only a `cold` one, which
    compiled a graph its cache did not hold, and only the last RECENT of them, so one made under load passes."""
    if not cold:
        return
    recent = [*_recent_compiles(device), round(per_graph_s, 1)][-RECENT:]
    text = json.dumps({"per_graph_s": statistics.median(recent), "recent_s": recent})
    try:
        atomic_write_text(Path(hosts.use_compile_cache(device), MEASURED_FILE), text)
    except OSError as err:
        log.debug("could not keep the compile time (%s)", err)


def _cache_misses() -> int:
    """Graphs inductor has compiled in this process that its cache did not hold."""
    return int(torch._dynamo.utils.counters["inductor"].get("fxgraph_cache_miss", 0))


def compile_for_training(model: nn.Module, device: torch.device) -> nn.Module:
    """`torch.compile(model)` with static shapes (one graph per phase), its cache kept per host class."""
    hosts.use_compile_cache(device)
    return torch.compile(model, dynamic=False)


def warm_up_compiled(
    module: nn.Module,
    phases: list[GraphKey],
    run_once: Callable[[float, int], None],
    device: torch.device,
    *,
    compiling: bool,
    to_eager: Callable[[], None],
    timed: int = 2,
) -> tuple[dict[GraphKey, float], str]:
    """`budget.warm_up` (`timed` passes per phase after the first), which compiles every phase's graph when
    `compiling`; a broken compiler toolchain trains eagerly (`to_eager()`) rather than not at all.  Returns the
    timings and, if compiling failed, why."""
    if compiling:
        log.info(
            "torch.compile: compiling %d graph(s) before the first step (tens of seconds each on a CPU)", len(phases)
        )
    misses = _cache_misses()
    try:
        seconds, timings = warm_up(module, phases, run_once, device, timed=timed)
    except Exception as err:
        if not compiling:
            raise
        first = (str(err).strip().splitlines() or [""])[0]
        log.warning(
            "torch.compile failed (%s: %s); training eagerly (run.compile=off skips compiling)",
            type(err).__name__,
            first,
        )
        to_eager()
        return warm_up(module, phases, run_once, device, timed=timed)[
            1
        ], f"compiling failed here ({type(err).__name__})"
    if compiling:
        log.info(
            "torch.compile: %d graph(s) (PatchDropout rate, side) %s compiled in %.0f s", len(phases), phases, seconds
        )
        remember_graph_seconds(device, seconds / max(len(phases), 1), cold=_cache_misses() > misses)
    return timings, ""
