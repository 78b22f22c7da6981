"""Fuzz targets for the checkpoint readers: per format, a small valid seed and one mutation of it read back.

`READERS` maps a format to `(make_seed, fuzz_one)`: `make_seed(workdir: Path) -> Path` writes a small valid
checkpoint; `fuzz_one(seed: Path, rng: random.Random, workdir: Path) -> str` writes one mutation of it
(byte flips, truncation, header field edits, JSON value edits) under `workdir`, reads it with
`vitkit.checkpoints.read` and returns "ok" (read, and the model runs) or "handled" (a CheckpointError
naming the file); anything else raises.  tests/fuzz/test_fuzz_checkpoints.py runs a few hundred in the
default suite; benchmarks/fuzz.py imports this file by path for long runs.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import random
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from vitkit.checkpoints import Checkpoint, CheckpointError, read, timm, write
from vitkit.models import build_model
from vitkit.models.configs import ViTConfig


def _sibling(name: str):
    # loaded by path, so that this file works imported by path too (benchmarks/fuzz.py)
    spec = importlib.util.spec_from_file_location(f"checkpoint_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_mutations = _sibling("checkpoint_mutations")
mutate_bytes, mutate_json = _mutations.mutate_bytes, _mutations.mutate_json
mutate_npz, mutate_pth, mutate_safetensors = _mutations.mutate_npz, _mutations.mutate_pth, _mutations.mutate_safetensors

SEED_VIT = ViTConfig(img_size=16, patch_size=8, hidden_size=16, depth=2, num_heads=2, mlp_dim=32, num_classes=3)
# a bare timm state dict records no head count: timm.guess_num_heads assumes head_dim 64
TIMM_VIT = dataclasses.replace(SEED_VIT, hidden_size=64, num_heads=1, gelu="exact")
HANG_SECONDS = 30  # one read of a seed takes ~10 ms


def _checkpoint(config: ViTConfig) -> Checkpoint:
    torch.manual_seed(0)
    return Checkpoint(model=build_model(config).eval(), class_names=["a", "b", "c"])


# ---- seeds ------------------------------------------------------------------------------------------------


def seed_vitkit(workdir: Path) -> Path:
    return write(_checkpoint(SEED_VIT), workdir / "seed_vitkit", to="vitkit")


def seed_hf(workdir: Path) -> Path:
    return write(_checkpoint(dataclasses.replace(SEED_VIT, gelu="exact")), workdir / "seed_hf", to="hf")


def seed_timm_safetensors(workdir: Path) -> Path:
    path = workdir / "seed_timm.safetensors"
    save_file(timm.from_vitkit(_checkpoint(TIMM_VIT)), str(path))
    return path


def seed_timm_pth(workdir: Path) -> Path:
    path = workdir / "seed_timm.pth"
    torch.save({"state_dict": timm.from_vitkit(_checkpoint(TIMM_VIT))}, path)
    return path


def seed_official(workdir: Path) -> Path:
    return write(_checkpoint(SEED_VIT), workdir / "seed_official.npz", to="official")


# ---- one mutation -----------------------------------------------------------------------------------------


def _mutate_dir(seed: Path, rng: random.Random, workdir: Path) -> Path:
    """A copy of a checkpoint directory with one of its files mutated (config files as JSON or as bytes)."""
    case = workdir / "case_dir"
    shutil.rmtree(case, ignore_errors=True)
    shutil.copytree(seed, case)
    if rng.random() < 0.5:  # without the recorded hash, damaged weights reach the header checks
        config = case / "config.json"
        meta = json.loads(config.read_text())
        if isinstance(meta, dict) and meta.pop("weights_sha256", None):
            config.write_text(json.dumps(meta))
    target = rng.choice(sorted(p for p in case.iterdir() if p.is_file()))
    data = target.read_bytes()
    if target.suffix == ".json":
        data = mutate_json(data, rng) if rng.random() < 0.7 else mutate_bytes(data, rng)
    else:
        data = mutate_safetensors(data, rng) if rng.random() < 0.6 else mutate_bytes(data, rng)
    target.write_bytes(data)
    return case


def _mutate_file(structured: Callable[[bytes, random.Random], bytes]) -> Callable[[Path, random.Random, Path], Path]:
    def mutate(seed: Path, rng: random.Random, workdir: Path) -> Path:
        data = seed.read_bytes()
        data = structured(data, rng) if rng.random() < 0.6 else mutate_bytes(data, rng)
        case = workdir / f"case{seed.suffix}"
        case.write_bytes(data)
        return case

    return mutate


def read_and_classify(path: Path) -> str:
    """ "ok" when `path` reads and its model runs; "handled" for a CheckpointError naming `path`; else raise."""
    try:
        checkpoint = read(path)
    except CheckpointError as err:
        if str(path) not in str(err):
            raise AssertionError(f"the error does not name {path}: {err}") from err
        return "handled"
    config, threads = checkpoint.config, torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny forward pass: threads would only wait for each other
    try:
        with torch.no_grad():
            logits = checkpoint.model.eval()(torch.zeros(1, config.in_chans, config.img_size, config.img_size))
    finally:
        torch.set_num_threads(threads)
    assert logits.shape == (1, config.num_classes), logits.shape
    return "ok"


class Hang(Exception):
    """A read that took longer than HANG_SECONDS."""


def _guarded(path: Path) -> str:
    # an alarm interrupts a read stuck in Python code (main thread only); the elapsed check catches the rest
    start = time.monotonic()
    alarm = threading.current_thread() is threading.main_thread() and hasattr(signal, "SIGALRM")

    def interrupt(*_: object) -> None:
        raise Hang(f"{path}: still reading after {HANG_SECONDS} s")

    if alarm:
        previous = signal.signal(signal.SIGALRM, interrupt)
        signal.alarm(HANG_SECONDS)
    try:
        outcome = read_and_classify(path)
    finally:
        if alarm:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
    if time.monotonic() - start > HANG_SECONDS:
        raise Hang(f"{path}: read took {time.monotonic() - start:.0f} s")
    return outcome


def _target(mutate: Callable[[Path, random.Random, Path], Path]) -> Callable[[Path, random.Random, Path], str]:
    def fuzz_one(seed: Path, rng: random.Random, workdir: Path) -> str:
        return _guarded(mutate(seed, rng, workdir))

    return fuzz_one


READERS: dict[str, tuple[Callable[[Path], Path], Callable[[Path, random.Random, Path], str]]] = {
    "vitkit": (seed_vitkit, _target(_mutate_dir)),
    "timm_safetensors": (seed_timm_safetensors, _target(_mutate_file(mutate_safetensors))),
    "timm_pth": (seed_timm_pth, _target(_mutate_file(mutate_pth))),
    "hf": (seed_hf, _target(_mutate_dir)),
    "official_npz": (seed_official, _target(_mutate_file(mutate_npz))),
}
