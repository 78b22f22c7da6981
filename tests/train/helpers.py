"""Shared tiny configurations for the training tests (digits, in memory, a few steps)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vitkit.data.sources import SourceInfo
from vitkit.train.config import TrainConfig, apply_overrides
from vitkit.train.recipes import get_recipe

DIGITS = SourceInfo(uri="digits", num_train=1438, num_classes=10, image_size=8, channels=1, in_memory=True)


def tiny_config(out: Path, *overrides: str, recipe: str = "small-8px-tiny") -> TrainConfig:
    """small-8px-tiny with dropout (so the RNG matters), fp32, 1 thread, no progress bar, in `out`.

    Precision is pinned to fp32: these tests check the loop's mechanics against golden values and
    exact equalities, which must not move when run.precision's "auto" default changes.
    """
    config = get_recipe(recipe, DIGITS)
    config = dataclasses.replace(config, run=dataclasses.replace(config.run, out=str(out), threads=1, progress=False,
                                                                 tensorboard=False))
    return apply_overrides(config, ["model.dropout=0.1", "run.precision=fp32", *overrides])
