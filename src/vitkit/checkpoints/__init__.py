"""Checkpoint formats: vitkit's own (native.py); foreign formats are converted on load."""

from __future__ import annotations

import os
from typing import Any

from torch import nn

from vitkit.checkpoints import native
from vitkit.checkpoints.native import Checkpoint

__all__ = ["Checkpoint", "load", "read", "save"]


def read(path: str | os.PathLike, **options: Any) -> Checkpoint:
    """Read any supported checkpoint into a `Checkpoint` (model + class names + normalisation)."""
    return native.load(path, **options)


def load(path: str | os.PathLike, **options: Any) -> nn.Module:
    """The model stored at `path`, in any supported format."""
    return read(path, **options).model


def save(model: nn.Module | Checkpoint, directory: str | os.PathLike, **meta: Any) -> os.PathLike:
    """Write vitkit's own format: `directory/model.safetensors` + `directory/config.json`."""
    return native.save(model, directory, **meta)
