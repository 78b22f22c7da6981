"""Shared tiny configurations for the training tests (digits, in memory, a few steps)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

from vitkit.data.sources import SourceInfo
from vitkit.train.config import TrainConfig, apply_overrides, to_dict
from vitkit.train.recipes import get_recipe

ROOT = Path(__file__).resolve().parents[2]
DIGITS = SourceInfo(uri="digits", num_train=1438, num_classes=10, image_size=8, channels=1, in_memory=True)


def tiny_config(out: Path, *overrides: str, recipe: str = "small-8px-tiny") -> TrainConfig:
    """small-8px-tiny with dropout (so the RNG matters), fp32, 1 thread, no progress bar, in `out`.

    Precision is pinned to fp32: these tests check the loop's mechanics against golden values and
    exact equalities, which must not move when run.precision's "auto" default changes.
    """
    config = get_recipe(recipe, DIGITS)
    config = dataclasses.replace(
        config, run=dataclasses.replace(config.run, out=str(out), threads=1, progress=False, tensorboard=False)
    )
    return apply_overrides(config, ["model.dropout=0.1", "run.precision=fp32", *overrides])


class FakeTime:
    """time.monotonic for the trainer: every reading advances `tick` seconds, so a run's clock is deterministic."""

    def __init__(self, tick: float = 0.01) -> None:
        self.now, self.tick = 1000.0, tick

    def monotonic(self) -> float:
        self.now += self.tick
        return self.now

    def perf_counter(self) -> float:
        return self.monotonic()


def sigterm_after(step: int, real_step):
    """A `trainer.train_step` that sends this process SIGTERM right after optimiser step `step`, as a scheduler's
    `kill PID` would (the trainer saves at the step boundary and returns "interrupted")."""

    def stepped(state, batch, spec, loss_of=None):
        out = real_step(state, batch, spec, loss_of)
        if state.step == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    return stepped


# `python -c _KILLER CONFIG_JSON STEP`: train the config and die by SIGKILL right after STEP (0: never), as `kill -9`
_KILLER = """
import json, os, signal, sys
from vitkit.train import trainer
from vitkit.train.config import from_dict
config = from_dict(json.loads(open(sys.argv[1]).read()))
kill_at = int(sys.argv[2])
real = trainer.train_step
def step(state, batch, spec, loss_of=None):
    out = real(state, batch, spec, loss_of)
    if state.step == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)  # no handler, no cleanup: as `kill -9`
    return out
trainer.train_step = step
trainer.train(config)
"""


def train_in_subprocess(config: TrainConfig, kill_at: int = 0) -> subprocess.CompletedProcess:
    """Train `config` in a fresh process (its JSON beside the run directory), dying by SIGKILL right after
    step `kill_at` (0: never); the same call again resumes the run."""
    path = Path(config.run.out).with_suffix(".config.json")
    path.write_text(json.dumps(to_dict(config)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(
        [sys.executable, "-c", _KILLER, str(path), str(kill_at)], env=env, capture_output=True, text=True, timeout=300
    )


def last_json(text: str) -> dict:
    """The JSON object a verb run with --json printed on its last line."""
    return json.loads(text.strip().splitlines()[-1])


def class_npz(path: Path, classes: int = 4, n: int = 80) -> Path:
    """An npz: source of `n` 8x8 images whose brightness tells their `classes` apart."""
    rng = np.random.default_rng(0)
    labels = np.arange(n) % classes
    images = (rng.integers(0, 60, (n, 8, 8)) + labels[:, None, None] * 50).astype(np.uint8)
    np.savez(path, images=images, labels=labels)
    return path


def metrics_records(run: Path) -> list[dict]:
    """Every record of a run's metrics.jsonl, in order."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
