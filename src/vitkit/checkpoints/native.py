"""vitkit's own checkpoint: a directory with `model.safetensors` and `config.json` (DESIGN.md).

config.json records the model config, class names, input resolution and normalisation, provenance
and the SHA-256 of the weights file, so a directory whose two files do not belong together, or whose
weights are truncated, is refused with a clear message.  Both files are written atomically.  On
reading, config.json is untrusted: its fields are checked, the model's size is checked against the
memory limit and the weights' header against the model (both on the meta device) before anything
is built or read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from vitkit.atomic import atomic_write, atomic_write_text
from vitkit.checkpoints import headers, limits
from vitkit.checkpoints.validate import (
    CheckpointError,
    check_finite,
    check_fits,
    mapping,
    model_config,
    numbers_list,
    read_json,
    short,
    strings_list,
)
from vitkit.models import build_model
from vitkit.models.configs import ModelConfig, config_to_dict, in_channels, num_classes

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
    if not isinstance(checkpoint, Checkpoint) or not hasattr(checkpoint.model, "config"):
        raise TypeError(
            "vitkit.save takes a vitkit model (vitkit.create_model, vitkit.load) or a Checkpoint, got "
            f"{type(checkpoint.model if isinstance(checkpoint, Checkpoint) else checkpoint).__name__}"
        )
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
        return read_json(config).get("format") == FORMAT
    except CheckpointError:
        return False


def load(
    directory: str | os.PathLike, map_location: str | torch.device = "cpu", max_bytes: int | None = None
) -> Checkpoint:
    """Read a directory written by `save`; every mismatch is named in a CheckpointError (a ValueError).

    Order: config.json's fields, the model's size (limits.check_model, `max_bytes`), the weights' header
    against the model on the meta device (which bounds the file's size), their hash; only then the model is
    built and the data read.
    """
    config, fields, weights_path = check(directory, max_bytes)
    model = build_model(config)
    try:
        state = load_file(str(weights_path), device=str(map_location))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"cannot read {weights_path}: {err}") from None
    load_state_dict_strict(model, state, source=str(weights_path))
    return Checkpoint(model=model, **fields)


def check(directory: str | os.PathLike, max_bytes: int | None = None) -> tuple[ModelConfig, dict[str, Any], Path]:
    """Every check of `load` that needs no model built and no weight read into it: (the model config, the
    checked fields of config.json, the weights file).  The weights' hash reads the file once."""
    directory = Path(directory)
    config_path, weights_path = directory / CONFIG, directory / WEIGHTS
    for path in (config_path, weights_path):
        if not path.is_file():
            what = "is not a regular file" if path.exists() else "is missing"
            raise FileNotFoundError(f"{directory} is not a complete vitkit checkpoint: {path.name} {what}")
    meta = read_json(config_path)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{config_path} is not a vitkit checkpoint config (format={short(meta.get('format'))})")
    version = meta.get("format_version", FORMAT_VERSION)
    whole = isinstance(version, int) and not isinstance(version, bool)
    if not (whole and 1 <= version <= FORMAT_VERSION):
        why = "a newer vitkit wrote it: upgrade vitkit, or convert it there" if whole and version > 1 else "damaged"
        raise CheckpointError(
            f"{config_path}: format_version {short(version)}; this vitkit reads versions 1 to {FORMAT_VERSION} ({why})"
        )
    config = model_config(meta.get("model"), str(config_path))
    fields = read_fields(meta, config, config_path)
    expected = limits.check_model(config, str(config_path), max_bytes)
    check_weights(meta, config_path, weights_path, expected)
    return config, fields, weights_path


def read_fields(meta: dict[str, Any], config: ModelConfig, config_path: Path) -> dict[str, Any]:
    """Class names, normalisation and provenance of config.json, each checked."""
    classes = num_classes(config)
    names = strings_list(meta.get("class_names"), f"{config_path}: class_names", classes or None)
    norm = mapping(meta.get("normalization"), f"{config_path}: normalization")
    counts = tuple(sorted({1, 3, in_channels(config)}))  # one per channel, one for all, or the 3 of the default
    mean = numbers_list(norm.get("mean", (0.5,) * 3), f"{config_path}: normalization.mean", counts)
    std = numbers_list(norm.get("std", (0.5,) * 3), f"{config_path}: normalization.std", counts, positive=True)
    provenance = mapping(meta.get("provenance"), f"{config_path}: provenance")
    return {"class_names": names, "mean": mean, "std": std, "provenance": provenance}


def check_weights(
    meta: dict[str, Any], config_path: Path, weights_path: Path, expected: dict[str, torch.Tensor] | None = None
) -> None:
    """The weights file of a checkpoint directory: its header first, which must describe the file exactly (and
    so bounds the bytes read next) and fit the model's `expected` tensors where given; then its SHA-256 against
    the one config.json recorded."""
    header = headers.safetensors_header(weights_path)
    if expected is not None:
        check_fits(expected, header, str(weights_path))
    check_hash(meta.get("weights_sha256"), config_path, weights_path)


def check_hash(expected: Any, config_path: Path, weights_path: Path) -> None:
    """The weights are the ones config.json recorded (SHA-256), where it recorded them."""
    if expected is None:
        return
    if not (isinstance(expected, str) and re.fullmatch(r"[0-9a-f]{64}", expected)):
        raise CheckpointError(f"{config_path}: weights_sha256 must be a hex string of 64 digits, got {short(expected)}")
    if _sha256(weights_path) != expected:
        raise CheckpointError(
            f"{weights_path} does not match {config_path.name} (SHA-256 differs): the weights are truncated, "
            "damaged or belong to another checkpoint"
        )


def build_checkpoint(config: ModelConfig, state: dict[str, torch.Tensor], source: str, **meta: Any) -> Checkpoint:
    """The model `config` describes, filled with `state` (vitkit names), as a Checkpoint with `meta`."""
    model = build_model(config)
    load_state_dict_strict(model, state, source=source)
    return Checkpoint(model=model, **meta)


Convert = Callable[[dict[str, torch.Tensor], Any], tuple[ModelConfig, dict[str, torch.Tensor]]]


def read_checked(
    convert: Convert,
    header: dict[str, torch.Tensor],
    load: Callable[[], dict[str, torch.Tensor]],
    config: ModelConfig | None,
    source: str,
    max_bytes: int | None,
    fields: Callable[[ModelConfig], dict[str, Any]] = lambda config: {},
) -> Checkpoint:
    """A foreign file read in two passes of one `convert(tensors, config) -> (config, vitkit tensors)`.

    First on `header` (meta tensors: the file's names and shapes): the config is inferred, the model's size
    checked against the limit and its shapes against the converted ones, with nothing allocated.  Then
    `fields(config)` (class names, normalisation) and the same conversion on the data `load()` reads.
    """
    config, shapes = convert(header, config)
    check_fits(limits.check_model(config, source, max_bytes), shapes, source)
    extra = fields(config)
    _, state = convert(load(), config)
    return build_checkpoint(config, state, source, **extra)


@dataclass(frozen=True)
class Reading:
    """A foreign file opened for the two passes of one `convert` (`read_checked`): its header now, its data when
    asked."""

    convert: Convert
    header: dict[str, torch.Tensor]
    load: Callable[[], dict[str, torch.Tensor]]
    source: str
    fields: Callable[[ModelConfig], dict[str, Any]] = lambda config: {}

    def model_config(self, config: ModelConfig | None = None, max_bytes: int | None = None) -> ModelConfig:
        """The model the file holds, from its header alone (names and shapes), checked to fit `max_bytes`."""
        config, shapes = self.convert(self.header, config)
        check_fits(limits.check_model(config, self.source, max_bytes), shapes, self.source)
        return config

    def checkpoint(self, config: ModelConfig | None = None, max_bytes: int | None = None) -> Checkpoint:
        """The checkpoint: `read_checked`."""
        return read_checked(self.convert, self.header, self.load, config, self.source, max_bytes, self.fields)


def load_state_dict_strict(model: nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Copy `state` into `model`, naming every missing, unexpected, mis-shaped or non-finite tensor on failure."""
    check_fits(model.state_dict(), state, source)
    check_finite(state, source)
    model.load_state_dict(state, strict=True)
