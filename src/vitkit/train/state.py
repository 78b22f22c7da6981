"""Everything a run needs to continue bit-exactly, and its atomic checkpoints (DESIGN.md "A run").

A checkpoint is `checkpoints/step_NNNNNNN/` holding the model in vitkit's own format
(`model.safetensors` + `config.json`, readable by `vitkit.load`) and `train_state.pt` (optimiser,
EMA, step, RNG states, counters), which contains only tensors and plain Python containers so that
`torch.load(..., weights_only=True)` reads it.  A streamed training split (tar shards, Parquet) adds
its position under "data" (vitkit.data.stream.ShardBatches.state_dict).  The directory is written under a temporary name
and renamed; then `checkpoints/LATEST` is replaced atomically.  A crash at any moment therefore
leaves the previous checkpoint intact and LATEST pointing at a complete one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitkit.checkpoints import native
from vitkit.train.ema import ModelEMA

log = logging.getLogger(__name__)

LATEST = "LATEST"
STATE_FILE = "train_state.pt"
KEEP = 2  # checkpoints kept besides the newest


@dataclass
class TrainState:
    """The model being trained (possibly wrapped by DDP/FSDP/compile) and its optimiser state."""

    model: nn.Module  # what forward runs through (the wrapped model)
    module: nn.Module  # the bare VisionTransformer (what checkpoints store)
    optimizer: torch.optim.Optimizer
    generator: torch.Generator  # augmentation randomness, on the training device
    ema: ModelEMA | None = None
    step: int = 0  # optimiser steps taken (skipped non-finite steps count: the data moved on)
    skipped_steps: int = 0  # non-finite steps skipped in total
    nan_streak: int = 0  # consecutive non-finite steps
    elapsed: float = 0.0  # training seconds over all invocations
    skipped_samples: int = 0  # corrupt samples skipped over all processes and invocations (at the last count)
    data: Any = None  # a TrainBatches whose position is saved ("data"), or None when the step alone gives it
    extra: dict[str, Any] = field(default_factory=dict)

    def state_dict(self, *, optimizer: bool = True) -> dict[str, Any]:
        rng: dict[str, Any] = {"torch": torch.get_rng_state(), "augment": self.generator.get_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {
            "step": self.step,
            "skipped_steps": self.skipped_steps,
            "nan_streak": self.nan_streak,
            "elapsed": self.elapsed,
            "optimizer": self.optimizer.state_dict() if optimizer else None,
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "rng": rng,
            "skipped_samples": self.skipped_samples,
            "data": self.data.state_dict() if self.data is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any], *, optimizer: bool = True) -> None:
        self.step = int(state["step"])
        self.skipped_steps = int(state["skipped_steps"])
        self.nan_streak = int(state["nan_streak"])
        self.elapsed = float(state["elapsed"])
        self.skipped_samples = int(state.get("skipped_samples", 0))
        if self.data is not None and state.get("data") is not None:
            self.data.load_state_dict(state["data"])
        if optimizer:
            self.optimizer.load_state_dict(state["optimizer"])
        if (state["ema"] is None) != (self.ema is None):
            raise ValueError("the checkpoint's EMA setting differs from the config's optim.ema_decay")
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        torch.set_rng_state(state["rng"]["torch"])
        self.generator.set_state(state["rng"]["augment"].to(torch.uint8))
        if "cuda" in state["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])


def gather_sharded(state: TrainState) -> tuple[dict[str, Any], dict[str, Any]]:
    """FSDP2: the full (unsharded) model and optimiser state dicts on the CPU.

    A collective: every process must call it; only rank 0 then writes.  The optimiser state is keyed
    by parameter names (torch.distributed.checkpoint's format), loadable with weights_only=True.
    """
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return (get_model_state_dict(state.model, options=options),
            get_optimizer_state_dict(state.model, state.optimizer, options=options))


def load_sharded(path: Path, state: TrainState) -> None:
    """FSDP2 resume: every process reads the full checkpoint and keeps its shards."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True)
    weights = native.load(path, map_location="cpu").model.state_dict()
    payload = torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=True)
    set_model_state_dict(state.model, weights, options=options)
    set_optimizer_state_dict(state.model, state.optimizer, optim_state_dict=payload["optimizer"], options=options)
    state.load_state_dict(payload, optimizer=False)


def save_checkpoint(run_dir: Path, state: TrainState, meta: dict[str, Any],
                    full: tuple[dict[str, Any], dict[str, Any]] | None = None) -> Path:
    """Write `checkpoints/step_<step>/` atomically and point LATEST at it; prune old ones.

    `full` = (model, optimiser) state dicts gathered by `gather_sharded` for an FSDP2 run.
    """
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{state.step:07d}"
    final, tmp = root / name, root / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    payload = state.state_dict() if full is None else {**state.state_dict(optimizer=False), "optimizer": full[1]}
    module = state.module
    if full is not None:  # a plain CPU copy of the sharded model, for vitkit's own format
        from vitkit.models import build_model

        module = build_model(state.module.config)
        module.load_state_dict(full[0])
    native.save(module, tmp, **meta)
    native.atomic_write(tmp / STATE_FILE, lambda path: torch.save(payload, path))
    _fsync_dir(tmp)
    if final.exists():  # re-saving the same step (e.g. the end of a resumed, finished run)
        shutil.rmtree(final)
    os.replace(tmp, final)
    native.atomic_write_text(root / LATEST, name + "\n")
    _fsync_dir(root)
    for old in sorted(p for p in root.glob("step_*") if p.is_dir() and p.name != name)[:-KEEP or None]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The complete checkpoint LATEST names, or None; a LATEST pointing nowhere is an error."""
    root = Path(run_dir) / "checkpoints"
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    if not (path / STATE_FILE).is_file() or not native.is_native(path):
        raise ValueError(f"{pointer} names {path.name}, which is missing or incomplete; remove {pointer} to start over")
    return path


def load_checkpoint(path: Path, state: TrainState, map_location: torch.device) -> None:
    """Restore model weights (checked key by key) and the training state from `path`."""
    checkpoint = native.load(path, map_location="cpu")
    own = {k: v for k, v in checkpoint.model.state_dict().items()}
    native.load_state_dict_strict(state.module, own, source=str(path))
    payload = torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=True)
    state.load_state_dict(payload)


def read_meta(path: Path) -> dict[str, Any]:
    return json.loads((Path(path) / native.CONFIG).read_text())
