"""Arms: the runs a study is made of, each a normal run directory, and what is measured on them.

    DIR/arms/<arm>-s<seed>/            a run directory of vitkit's engine (config.json, metrics.jsonl, checkpoints/)
    DIR/arms/<arm>-s<seed>/arm.json    written last and atomically, once the arm is trained and measured
    DIR/arms/<arm>-s<seed>/wall.json   an interrupted arm's wall time so far, until arm.json is written

A re-run of the study reuses every arm with an arm.json whose config is the planned one, and calls the
engine for the others, which resumes a killed run from its last checkpoint (train/trainer.py).  An
arm stopped by a signal stops the study (StudyInterrupted): re-running the same command continues it.

Measurements on a trained arm (`Arm.measure`):
    "fewshot"    few-shot linear accuracy of the frozen representation (Sec. 4.1; eval/fewshot.py): k = 5 and
                 25 images per class drawn FEWSHOT_DRAWS times from the arm's training split (its
                 validation hold-out excluded), scored on the test split
    "val"        top-1 on the arm's validation hold-out (what model selection reads)
    "attention"  mean attention distance per layer and head on ATTENTION_IMAGES test images (App. D.7)
Training FLOPs are analytic (models/flops.py): 3 x forward FLOPs per image x images seen.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from vitkit.atomic import atomic_write_text
from vitkit.data.inmemory import drawn_sample
from vitkit.data.shardset import ShardSet, label_index
from vitkit.data.sources import ImageSet, SourceInfo, load_split
from vitkit.eval.accuracy import AccuracyConfig, evaluate
from vitkit.eval.fewshot import FewShotConfig, run_fewshot
from vitkit.models.configs import image_size
from vitkit.models.flops import model_flops
from vitkit.reproduce.inspection import attention_distances
from vitkit.reproduce.spec import Arm
from vitkit.runs import CONFIG, open_checkpoint
from vitkit.train.config import TrainConfig, to_dict
from vitkit.train.trainer import train

log = logging.getLogger(__name__)

FEWSHOT_SHOTS = (5, 25)  # 5-shot is the paper's ablation metric (Table 8, Figures 4, 8, 9)
FEWSHOT_DRAWS = 5  # draws of the k shots per arm (the same draws for every arm of a study)


def fewshot_draws(scale_name: str) -> int:
    """Draws of the k shots per arm at a study's scale: two at the tiny one, whose arms test the mechanics."""
    return 2 if scale_name == "tiny" else FEWSHOT_DRAWS


FEWSHOT_L2 = tuple(range(-10, 21, 2))  # ridge penalties 2^-10 .. 2^20 in steps of 4x (eval/fewshot.py's grid, halved)
ATTENTION_IMAGES = 128  # App. D.7, Figure 11: "computed for 128 example images"
TRAIN_FLOPS_FACTOR = 3  # forward + backward (two forward-sized matmuls per forward matmul)
WALL_TALLY = "wall.json"  # an unfinished arm's wall seconds so far, so that its "arm min" counts every invocation
# Where a re-run may differ: output place, display, hardware, and the path of the arm it starts from (named by the arm).
IGNORED = {"run": ("out", "progress", "tensorboard", "threads", "device", "init_from")}


class StudyInterrupted(Exception):
    """An arm's training was stopped by a signal; its checkpoint is saved and re-running resumes it."""

    def __init__(self, arm: str, signum: int):
        super().__init__(f"arm {arm} was interrupted by signal {signum}; re-run the same command to resume")
        self.signum = signum


def comparable(config: dict[str, Any]) -> dict[str, Any]:
    """A config dict without the keys a re-run may change (output place, display, hardware)."""
    out = json.loads(json.dumps(config))
    for group, keys in IGNORED.items():
        for key in keys:
            out.get(group, {}).pop(key, None)
    return out


def reuse(arm: Arm, path: Path, planned: dict[str, Any] | None) -> dict[str, Any] | None:
    """The stored record of a finished arm, or None; an arm finished with another config is an error."""
    record_path = path / "arm.json"
    if not record_path.is_file():
        return None
    record = json.loads(record_path.read_text())
    if planned is not None and comparable(record.get("config") or {}) != comparable(planned):
        raise ValueError(
            f"{path} holds arm {arm.key} trained with another config; remove that directory or choose another --out"
        )
    return {**record, "reused": True}


def run_train_arm(arm: Arm, path: Path, probes: Probes) -> dict[str, Any]:
    """Train (or resume) the arm in `path`, measure it, write arm.json; a finished arm is reused as it is."""
    config = dataclasses.replace(arm.config, run=dataclasses.replace(arm.config.run, out=str(path)))
    stored = reuse(arm, path, to_dict(config))
    if stored is not None:
        return stored
    began, earlier = time.monotonic(), _earlier_seconds(path)
    try:
        result = train(config)
        if result["status"] == "interrupted":
            raise StudyInterrupted(arm.key, result.get("signal", 0))
        record = trained_record(arm, config, result)
        checkpoint = open_checkpoint(result["checkpoint"])
        for name in arm.measure:
            record[name] = probes.measure(name, checkpoint, config)
    except BaseException:  # stopped or failed: this invocation's time is counted when the arm finishes, where
        if (path / CONFIG).is_file():  # the arm is a run: before its config.json, a file would make it none
            atomic_write_text(path / WALL_TALLY, json.dumps({"seconds": earlier + time.monotonic() - began}) + "\n")
        raise
    measured = sum(record[name]["minutes"] for name in arm.measure)  # a killed invocation's kept training counts
    wall = max(earlier + time.monotonic() - began, 60 * (record["train_minutes"] + measured))
    record["wall_minutes"] = round(wall / 60, 3)
    write_record(path, record)
    (path / WALL_TALLY).unlink(missing_ok=True)
    if result.get("late_signal"):  # came as the arm finished: it is whole and recorded; the study stops here
        raise StudyInterrupted(arm.key, result["late_signal"])
    return record


def _earlier_seconds(path: Path) -> float:
    """Wall seconds of the arm's earlier invocations that stopped before it finished.  A SIGKILL'd one cannot
    count itself: its training up to its last checkpoint is counted (the run's own clock), its start-up not."""
    try:
        return float(json.loads((path / WALL_TALLY).read_text())["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def trained_record(arm: Arm, config: TrainConfig, result: dict[str, Any]) -> dict[str, Any]:
    """What the report needs of a finished run: sizes, compute, time, device and the final test evaluation."""
    plan = result["plan"]
    images = result["step"] * config.data.batch_size
    forward = model_flops(config.model)
    return {
        "arm": arm.name,
        "seed": arm.seed,
        "labels": arm.labels,
        "units": arm.units,
        "config": to_dict(config),
        "status": result["status"],
        "step": result["step"],
        "steps": result["steps"],
        "epochs": round(images / max(plan["num_train"], 1), 3),
        "num_train": plan["num_train"],
        "images_seen": images,
        "params": plan["params"],
        "forward_flops": forward,
        "train_flops": TRAIN_FLOPS_FACTOR * forward * images,
        "train_minutes": round(result["minutes"], 3),
        "device": plan["device"],
        "precision": plan["precision"],
        "images_per_s": (plan.get("measured") or {}).get("images_per_s"),
        "test": result.get(config.eval.final_split),
        "reused": False,
    }


def write_record(path: Path, record: dict[str, Any]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path / "arm.json", json.dumps(record, indent=1) + "\n")


def evaluation_images(arm: Arm, tests: int, info: SourceInfo) -> int:
    """The images `arm`'s evaluations pass forward: its final test evaluation of `tests` images, then what it
    measures (`Probes.measure`): the few-shot probe's test features and its largest shots of every class in
    every draw, its validation hold-out, the attention images."""
    count = tests
    if "fewshot" in arm.measure:
        count += tests + max(FEWSHOT_SHOTS) * info.num_classes * FEWSHOT_DRAWS
    if "val" in arm.measure:  # the study's hold-out of the training split (scale.VAL_FRACTION)
        count += round(arm.config.data.val_fraction * info.num_train)
    if "attention" in arm.measure:
        count += ATTENTION_IMAGES
    return count


class Probes:
    """The measurements of trained arms, with each data split loaded once per (seed, size)."""

    def __init__(self, device: str = "auto", *, shots: tuple[int, ...] = FEWSHOT_SHOTS, draws: int = FEWSHOT_DRAWS):
        self.device, self.shots, self.draws = device, shots, draws
        self._splits: dict[tuple, ImageSet] = {}

    def split(self, config: TrainConfig, split: str) -> ImageSet:
        """The arm's `split` exactly as its run read it (same validation hold-out, seed and image size)."""
        data = config.data
        hold_out = (data.val_fraction, config.run.seed) if split != "test" else (0.0, 0)  # test: one for all
        key = (data.uri, split, image_size(config.model), *hold_out)
        if key not in self._splits:
            self._splits[key] = load_split(data.uri, split, image_size=key[2], val_fraction=key[3], seed=key[4])
        return self._splits[key]

    def measure(self, name: str, checkpoint: Any, config: TrainConfig) -> dict[str, Any]:
        began = time.monotonic()
        if name == "fewshot":
            out = self.fewshot(checkpoint, config)
        elif name == "val":
            out = self.accuracy(checkpoint, config, "val")
        elif name == "attention":
            out = self.attention(checkpoint, config)
        else:
            raise ValueError(f"unknown arm measurement {name!r}; expected fewshot, val or attention")
        out["minutes"] = round((time.monotonic() - began) / 60, 3)
        return out

    def fewshot(self, checkpoint: Any, config: TrainConfig) -> dict[str, Any]:
        train_set, test_set = self.split(config, "train"), self.split(config, "test")
        labels = label_index(train_set) if isinstance(train_set, ShardSet) else train_set.labels
        smallest = int(torch.bincount(labels[labels >= 0], minlength=train_set.num_classes).min())
        shots = tuple(k for k in self.shots if k <= smallest)
        probe = FewShotConfig(
            shots=shots or (1,), seeds=self.draws, l2_exponents=FEWSHOT_L2, batch_size=500, device=self.device
        )
        result = run_fewshot(checkpoint, train_set, test_set, probe)
        return {str(k): {"mean": v["mean"], "std": v["std"]} for k, v in result.shots.items()}

    def accuracy(self, checkpoint: Any, config: TrainConfig, split: str) -> dict[str, Any]:
        result = evaluate(checkpoint, self.split(config, split), AccuracyConfig(batch_size=500, device=self.device))
        return {"top1": result.top1, "count": result.num_images}

    def attention(self, checkpoint: Any, config: TrainConfig) -> dict[str, Any]:
        test_set = self.split(config, "test")
        return attention_distances(checkpoint, drawn_sample(test_set, ATTENTION_IMAGES), self.device)
