"""vitkit.train: the training engine (DESIGN.md "train/").  `train(config)` runs or resumes a run; the
Trainer and its parts live in the modules named in train/trainer.py's docstring."""

from __future__ import annotations

from typing import Any

__all__ = ["train", "Trainer"]


def __getattr__(name: str) -> Any:  # lazy: `vitkit.train.config` alone must not import the whole engine
    if name in __all__:
        from vitkit.train import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'vitkit.train' has no attribute {name!r}")
