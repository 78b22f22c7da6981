"""vitkit: the Vision Transformer of "An Image is Worth 16x16 Words" (Dosovitskiy et al., ICLR 2021).

Public API: `create_model`, `list_models`, `load`, `save`.
"""

from __future__ import annotations

import os
from typing import Any

from torch import nn

from vitkit.checkpoints import load as load_checkpoint
from vitkit.checkpoints import save
from vitkit.models import create_model, list_models
from vitkit.runs import find_checkpoint

__all__ = ["create_model", "list_models", "load", "save"]
__version__ = "0.1.0"


def load(path: str | os.PathLike[str], **options: Any) -> nn.Module:
    """The model stored at `path`: any checkpoint format vitkit reads (detected), or a run directory, which
    stands for the checkpoint every verb reads from it (vitkit.runs.find_checkpoint).  The model is in eval
    mode (PatchDropout, dropout and stochastic depth off), ready for inference; call `.train()` to fine-tune
    it.  `options` are `vitkit.checkpoints.read`'s (img_size, num_classes, pre_logits, resample, config)."""
    return load_checkpoint(find_checkpoint(path), **options).eval()
