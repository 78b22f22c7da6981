"""The host's choices for a run (DESIGN.md "The host decides how"): precision and torch.compile, each with
its reason, from the host's capabilities and a short measurement of the run's own model.

`probe_pass` times one eager forward + backward of the model on a small blank batch (about PROBE_FLOPS of
work, so a probe costs well under a second for the small recipes and a few seconds for ViT-B); scaled to the
micro-batch it gives the eager step time the compile decision weighs, and in both precisions it decides an
eager run's precision.  A compiled run's precision is decided by `matmul_seconds` at the model's own shape.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from vitkit import host as hosts
from vitkit.device import PrecisionChoice, autocast, choose_precision, native_bf16, time_pass
from vitkit.models.configs import HybridConfig, ModelConfig, ViTConfig, image_size, in_channels
from vitkit.models.flops import model_flops
from vitkit.train import compiled, distributed
from vitkit.train.config import TrainConfig
from vitkit.train.plan import HostChoices

PROBE_FLOPS = 4e9  # forward + backward work of one probe pass (the batch is sized to it)
MATMUL_ROWS = 8192  # a compiled model's precision probe: at most this many rows of its MLP matmul


def probe_batch(model_config: ModelConfig, micro_batch: int) -> int:
    """Images in a probe pass: about PROBE_FLOPS of forward + backward work, at most a micro-batch."""
    per_image = 3 * model_flops(model_config)  # backward ~ twice the forward
    return max(1, min(micro_batch, math.ceil(PROBE_FLOPS / max(per_image, 1))))


def probe_pass(
    model: nn.Module, model_config: ModelConfig, images: int, device: torch.device, dtype: torch.dtype | None
) -> float:
    """Seconds of one forward + backward of `model` on `images` blank images under autocast `dtype` (the
    fastest of three after a warm-up); gradients are cleared and the RNG left as it was."""
    size, channels = image_size(model_config), in_channels(model_config)
    x = torch.zeros(images, channels, size, size, device=device)

    def run() -> None:
        with autocast(device, dtype):
            out = model(x)
        (out.float() if isinstance(out, torch.Tensor) else out[0].float()).sum().backward()

    was_training = model.training
    model.train()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            return time_pass(run, device)
    finally:
        model.train(was_training)
        for param in model.parameters():
            param.grad = None


def choose(
    config: TrainConfig,
    model: nn.Module,
    device: torch.device,
    *,
    micro_batch: int,
    accumulation: int,
    graphs: int,
    steps: int | None,
    budget_s: float | None,
    stored_precision: str | None = None,
    stored_compiled: bool | None = None,
) -> HostChoices:
    """Compilation, then precision, for this run on this host, with their reasons (`stored_precision`,
    `stored_compiled`: the choices of an earlier invocation of the same run, which a resumed run keeps, so that
    it trains as an uninterrupted one would have).

    The precision is measured the way the model will run: eagerly, a whole forward + backward in each precision
    (for small models the casts autocast adds can cost more than bf16 saves); compiled, where Inductor fuses
    the casts away, the model's largest matmul at its real rows (micro-batch x tokens).
    """
    images = probe_batch(config.model, micro_batch)
    timed: dict[torch.dtype | None, float] = {}

    def eager(dtype: torch.dtype | None) -> float:  # timed anew at every call: the fastest of them so far
        timed[dtype] = min(timed.get(dtype, math.inf), probe_pass(model, config.model, images, device, dtype))
        return timed[dtype]

    kept = config.run.compile == "auto" and isinstance(stored_compiled, bool)
    wants_timing = config.run.compile == "auto" and (steps is not None or budget_s is not None) and not kept
    eager_step_s = eager(None) * micro_batch / images * accumulation if wants_timing else 0.0
    if kept:
        on, why = stored_compiled, "auto: as this run's first invocation chose"
    else:
        on, why = compiled.decide(
            config.run.compile,
            device,
            graphs=graphs,
            eager_step_s=eager_step_s,
            steps=steps,
            budget_s=budget_s,
            graph_s=compiled.graph_seconds(device),
        )
    shape = matmul_shape(config.model, micro_batch)
    measure = (lambda dtype: matmul_seconds(*shape, device, dtype)) if on and shape else eager
    precision = _precision(config.run.precision, device, measure, stored_precision)
    return agreed(
        HostChoices(
            host=hosts.current(device).describe(),
            precision=precision.precision,
            precision_reason=precision.reason,
            compiled=on,
            compile_reason=why,
        ),
        device,
    )


def eager_precision(
    requested: str, model: nn.Module, model_config: ModelConfig, device: torch.device, micro_batch: int
) -> PrecisionChoice:
    """The precision an eager run of `model` trains at for `requested`: "auto" timed as `choose` times it (for a
    caller that must time what a run will train, as a study's calibration)."""
    images = probe_batch(model_config, micro_batch)
    return choose_precision(requested, device, lambda dtype: probe_pass(model, model_config, images, device, dtype))


def _precision(requested: str, device: torch.device, measure, stored: str | None) -> PrecisionChoice:
    """The precision: a resumed "auto" run's first choice, unless that was bf16 and this host has no native bf16
    (a run moved from a workstation to a laptop), where it is chosen here and the change said."""
    moved = stored == "bf16" and not native_bf16(device)
    if stored in ("fp32", "bf16") and requested == "auto" and not moved:
        return PrecisionChoice(stored, "auto: as this run's first invocation chose")
    precision = choose_precision(requested, device, measure)
    if moved and requested == "auto":
        return dataclasses.replace(
            precision,
            reason=f"{precision.reason}; its earlier invocations trained in bf16, on a host with native bf16 "
            "(the run goes on in fp32, not bit-identical to an uninterrupted one)",
        )
    return precision


def matmul_shape(model_config: ModelConfig, micro_batch: int) -> tuple[int, int, int] | None:
    """(rows, D, mlp_dim) of a ViT's first MLP matmul in training: micro-batch x the tokens PatchDropout keeps
    (at most MATMUL_ROWS); None for other families."""
    vit = getattr(model_config, "vit", model_config)
    if not isinstance(vit, ViTConfig) or isinstance(model_config, HybridConfig):
        return None
    patches = (vit.img_size // vit.patch_size) ** 2
    tokens = max(1, round(patches * (1 - vit.patch_dropout))) + (vit.pool == "token")
    return min(micro_batch * tokens, MATMUL_ROWS), vit.hidden_size, vit.mlp_dim


def matmul_seconds(rows: int, inner: int, outer: int, device: torch.device, dtype: torch.dtype | None) -> float:
    """Seconds of one (rows x inner) . (inner x outer) product in `dtype` (None = fp32), the fastest of a few."""
    generator = torch.Generator().manual_seed(0)
    x, w = (
        torch.randn(shape, generator=generator).to(device, dtype or torch.float32)
        for shape in ((rows, inner), (outer, inner))
    )
    with torch.no_grad():
        return time_pass(lambda: torch.nn.functional.linear(x, w), device, repeats=5)


def agreed(picked: HostChoices, device: torch.device) -> HostChoices:
    """The same choices on every process (each measured its own): bf16 and compiling only where all chose them."""
    bf16 = distributed.min_across(float(picked.precision == "bf16"), device) > 0
    on = distributed.min_across(float(picked.compiled), device) > 0
    if bf16 == (picked.precision == "bf16") and on == picked.compiled:
        return picked
    return dataclasses.replace(
        picked,
        precision="bf16" if bf16 else "fp32",
        compiled=on,
        precision_reason=picked.precision_reason
        if bf16 == (picked.precision == "bf16")
        else "another process chose fp32",
        compile_reason=picked.compile_reason if on == picked.compiled else "another process chose not to compile",
    )
