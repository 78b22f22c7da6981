"""Which checkpoint a run directory stands for: the model every verb and `vitkit.load` read from it (the run
directory itself is vitkit.runs')."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from vitkit.checkpoints import native

FINAL, EMA = "final", "ema"  # a finished run's evaluated model; the Polyak-averaged weights


def standing(checkpoints: Path, latest: Callable[[], Path | None]) -> Path:
    """The checkpoint of the run whose checkpoints folder is `checkpoints`, `latest()` giving LATEST's target.

    The `final` export, else the `ema` one, when it is of LATEST's step or a later one (a finished run's model,
    the Polyak average when enabled; `ema` is what the run's own evaluations use), else LATEST's target.  Without
    LATEST: `final`, then the newest complete checkpoint by time and step number.
    """
    candidates = (
        [p for p in checkpoints.iterdir() if p.is_dir() and not p.name.startswith(".") and native.is_native(p)]
        if checkpoints.is_dir()
        else []
    )
    if not candidates:
        raise FileNotFoundError(
            f"{checkpoints} holds no complete vitkit checkpoint "
            "(a folder with config.json + model.safetensors); has the run saved one yet?"
        )
    newest = latest()
    if newest is not None:
        exports = (checkpoints / name for name in (FINAL, EMA))
        return next((p for p in exports if native.is_native(p) and _as_new(p, newest)), newest)
    by_name = {p.name: p for p in candidates}
    for name in (FINAL, "last", "latest"):
        if name in by_name:
            return by_name[name]
    return max(candidates, key=lambda p: (_mtime(p), step_number(p)))


def step_number(path: Path) -> int:
    """The step a checkpoint's name gives (step_0000420: 420), -1 where it gives none."""
    digits = re.findall(r"\d+", path.name)
    return int(digits[-1]) if digits else -1


def _as_new(export: Path, latest: Path) -> bool:
    """Whether an export is the model of LATEST's step or a later one.  By the step it records, which a copy keeps
    (`cp -r` gives the files the copy's times, in its order): of LATEST's step, it is; of an earlier one, the run
    trained on.  Of a later step (an earlier run's, where LATEST was removed to start over; or a last step whose
    checkpoint was not saved), and where it records none, by time."""
    with suppress(OSError, ValueError, TypeError, KeyError, AttributeError):
        step = json.loads((export / native.CONFIG).read_text())["provenance"]["step"]
        if type(step) is int and step <= step_number(latest):  # not a bool
            return step == step_number(latest)
    return _mtime(export) >= _mtime(latest)


def _mtime(path: Path) -> float:
    return (path / native.CONFIG).stat().st_mtime
