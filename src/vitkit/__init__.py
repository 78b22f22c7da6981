"""vitkit: the Vision Transformer of "An Image is Worth 16x16 Words" (Dosovitskiy et al., ICLR 2021).

Public API: `create_model`, `list_models`, `load`, `save`, `predict`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names are read when first used: `vitkit --help` and Ctrl-C need no torch
    from torch import nn

    from vitkit.checkpoints import save
    from vitkit.models import create_model, list_models

__all__ = ["create_model", "list_models", "load", "predict", "save"]
__version__ = "0.1.0"


def load(path: str | os.PathLike[str], **options: Any) -> nn.Module:
    """The model stored at `path`: any checkpoint format vitkit reads (detected), or a run directory, which
    stands for the checkpoint every verb reads from it (vitkit.runs.find_checkpoint).  The model is in eval
    mode (PatchDropout, dropout and stochastic depth off), ready for inference; call `.train()` to fine-tune
    it.  `options` are `vitkit.checkpoints.read`'s (img_size, num_classes, pre_logits, resample, config)."""
    from vitkit.checkpoints import load as load_checkpoint
    from vitkit.runs import find_checkpoint

    return load_checkpoint(find_checkpoint(path), **options).eval()


def predict(
    path: str | os.PathLike[str],
    images: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    top_k: int = 5,
    **options: Any,
) -> list[dict[str, Any]]:
    """The `top_k` classes of image files (and folders of them), as `vitkit predict` gives them: each image is
    decoded (any mode Pillow reads, converted to the model's channels), its shorter side resized bilinearly
    to the model's input and centre-cropped, normalised with the checkpoint's mean and std, and run in eval
    mode.  One dict per file, in order: {"file", "predictions": [{"class", "index", "probability"}]}, or
    {"file", "error"}.  `path`: as for `load`; `options`: `img_size`, `batch_size`, `device`."""
    from vitkit.eval.features import require_classifier
    from vitkit.eval.predict import PredictConfig, predict_files
    from vitkit.runs import open_checkpoint

    files = [images] if isinstance(images, (str, os.PathLike)) else images  # one path, not its characters
    checkpoint = open_checkpoint(path)
    require_classifier(checkpoint, path)
    return predict_files(checkpoint, files, PredictConfig(top_k=top_k, **options))


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def __getattr__(name: str) -> Any:
    if name == "save":
        from vitkit.checkpoints import save

        return save
    if name in ("create_model", "list_models"):
        from vitkit import models

        return getattr(models, name)
    raise AttributeError(f"module 'vitkit' has no attribute {name!r}")
