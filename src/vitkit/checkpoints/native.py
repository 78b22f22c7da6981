"""vitkit's own checkpoint: a directory with `model.safetensors` and `config.json` (DESIGN.md).

config.json records the model config, class names, input resolution and normalisation, provenance
and the SHA-256 of the weights file, so a directory whose two files do not belong together, or whose
weights are truncated, is refused with a clear message.  Both files are written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from vitkit.atomic import atomic_write, atomic_write_text
from vitkit.models import build_model
from vitkit.models.configs import ModelConfig, config_from_dict, config_to_dict, in_channels

FORMAT = "vitkit"
FORMAT_VERSION = 1
WEIGHTS, CONFIG = "model.safetensors", "config.json"


@dataclass
class Checkpoint:
    """A model with everything needed to feed and read it."""

    model: nn.Module
    class_names: list[str] | None = None
    # Pixel normalisation in [0, 1] units: x = (pixel / 255 - mean) / std.  0.5 / 0.5 is the official [-1, 1].
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> ModelConfig:
        return self.model.config


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def save(checkpoint: Checkpoint | nn.Module, directory: str | os.PathLike, **meta: Any) -> Path:
    """Write `checkpoint` (or a bare model plus `class_names=`, `mean=`, `std=`, `provenance=`) to `directory`."""
    if isinstance(checkpoint, nn.Module):
        checkpoint = Checkpoint(model=checkpoint, **meta)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model = checkpoint.model
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    atomic_write(directory / WEIGHTS, lambda tmp: save_file(tensors, str(tmp), metadata={"format": FORMAT}))
    channels = in_channels(model.config)
    config = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "model": config_to_dict(model.config),
        "class_names": checkpoint.class_names,
        "normalization": {"mean": list(checkpoint.mean)[:channels], "std": list(checkpoint.std)[:channels]},
        "provenance": checkpoint.provenance,
        "weights_sha256": _sha256(directory / WEIGHTS),
    }
    atomic_write_text(directory / CONFIG, json.dumps(config, indent=2) + "\n")
    return directory


def is_native(path: Path) -> bool:
    config = Path(path) / CONFIG
    if not config.is_file():
        return False
    try:
        return json.loads(config.read_text()).get("format") == FORMAT
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False


def load(directory: str | os.PathLike, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Read a directory written by `save`; every mismatch is named in a ValueError."""
    directory = Path(directory)
    config_path, weights_path = directory / CONFIG, directory / WEIGHTS
    for path in (config_path, weights_path):
        if not path.is_file():
            raise FileNotFoundError(f"{directory} is not a complete vitkit checkpoint: {path.name} is missing")
    try:
        meta = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{config_path} is not valid JSON ({err}); the checkpoint is damaged") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{config_path} is not a vitkit checkpoint config (format={meta.get('format')!r})")
    expected = meta.get("weights_sha256")
    if expected and _sha256(weights_path) != expected:
        raise ValueError(
            f"{weights_path} does not match {config_path.name} (SHA-256 differs): the weights are truncated, "
            "damaged or belong to another checkpoint"
        )
    model = build_model(config_from_dict(meta["model"]))
    try:
        state = load_file(str(weights_path), device=str(map_location))
    except (SafetensorError, OSError) as err:
        raise ValueError(f"cannot read {weights_path}: {err}") from None
    load_state_dict_strict(model, state, source=str(weights_path))
    norm = meta.get("normalization") or {}
    return Checkpoint(
        model=model,
        class_names=meta.get("class_names"),
        mean=tuple(norm.get("mean", (0.5,) * 3)),
        std=tuple(norm.get("std", (0.5,) * 3)),
        provenance=meta.get("provenance") or {},
    )


def build_checkpoint(config: ModelConfig, state: dict[str, torch.Tensor], source: str, **meta: Any) -> Checkpoint:
    """The model `config` describes, filled with `state` (vitkit names), as a Checkpoint with `meta`."""
    model = build_model(config)
    load_state_dict_strict(model, state, source=source)
    return Checkpoint(model=model, **meta)


def load_state_dict_strict(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Copy `state` into `model`, naming every missing, unexpected or mis-shaped tensor on failure."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [f"{k}: file {tuple(state[k].shape)} vs model {tuple(own[k].shape)}" for k in own if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"missing {missing[:10]}{' ...' if len(missing) > 10 else ''}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}")
        if shapes:
            parts.append(f"shape mismatch {shapes[:10]}")
        raise ValueError(f"{source} does not fit the model: " + "; ".join(parts))
    model.load_state_dict(state, strict=True)
