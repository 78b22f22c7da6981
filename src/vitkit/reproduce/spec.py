"""What a study is made of: the request, the context its plan and analysis read, its arms, and the claims,
tables and figures its analysis returns; and how the analysis reads the arms' records.

These types sit below everything else in reproduce/: the study modules build them, study.py runs them,
report.py writes them up, and none of those import each other to share them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vitkit.data.sources import SourceInfo
from vitkit.reproduce.paper import PaperClaim
from vitkit.reproduce.scale import Scale
from vitkit.reproduce.verdict import Verdict
from vitkit.runs import FINAL, RunDir
from vitkit.train.config import TrainConfig

MAX_STUDY_SEEDS = 100  # repeats of every arm: beyond any study's budget


@dataclass(frozen=True, kw_only=True)
class StudyRequest:
    """What `vitkit reproduce STUDY` asks for."""

    data: str = "digits"  # source URI
    budget_minutes: float = 30.0  # wall-clock for the whole study (scale.py divides it)
    seeds: int = 1  # every arm is repeated with seeds 0 .. seeds-1
    out: str = ""  # the study directory
    threads: int = 0  # torch CPU threads per arm (0 = torch's default)
    device: str = "auto"
    # the transfer study only (reproduce/transfer.py):
    pretrain_data: str = ""  # source URI to pre-train on ("" = the target's own training split: mechanics only)
    init: str = ""  # a pre-trained ViT checkpoint or run directory to start from instead of pre-training one
    families: bool = False  # also pre-train and fine-tune the BiT ResNet and the hybrid of similar FLOPs

    def __post_init__(self) -> None:
        if self.budget_minutes <= 0:
            raise ValueError(f"--budget-minutes must be > 0, got {self.budget_minutes}")
        if not 1 <= self.seeds <= MAX_STUDY_SEEDS:  # every arm is listed before the first runs: bounded
            raise ValueError(f"--seeds must be from 1 to {MAX_STUDY_SEEDS}, got {self.seeds}")
        if not self.out:
            raise ValueError("the study needs an output directory (--out DIR)")
        if self.threads < 0:
            raise ValueError(f"--threads must be >= 0, got {self.threads}")


ARMS = "arms"  # a study's sub-directory of arm runs


@dataclass(frozen=True)
class Context:
    """What planning and analysis read: the request, the data set, the scale and the arms' base config."""

    request: StudyRequest
    info: SourceInfo
    scale: Scale
    base: TrainConfig
    out: Path

    @property
    def seeds(self) -> range:
        return range(self.request.seeds)

    def arm_dir(self, key: str) -> Path:
        """The run directory of arm `key`."""
        return self.out / ARMS / key

    def arm_model(self, key: str) -> Path:
        """Where arm `key`'s trained model is exported (written once it has run)."""
        return RunDir(self.arm_dir(key)).export(FINAL)


@dataclass(frozen=True)
class Arm:
    """One run of a study: a name, a seed, its complete config and the study's coordinates of it."""

    name: str  # e.g. "learned_1d@input"; unique in the study together with the seed
    seed: int
    config: TrainConfig | None  # None: an arm that measures without training (the speed study)
    labels: dict[str, Any] = field(default_factory=dict)  # e.g. {"posemb": "learned_1d", "where": "input"}
    measure: tuple[str, ...] = ("fewshot",)
    units: float = 1.0  # share of the training budget (scale.timed applies it)

    @property
    def key(self) -> str:
        return f"{re.sub(r'[^A-Za-z0-9._-]+', '_', self.name)}-s{self.seed}"


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]


@dataclass
class Claim:
    """One claim of the paper, its quote, the measured numbers behind the verdict, and the verdict."""

    key: str  # e.g. "posemb.none-worse"
    claim: str  # the claim in one line
    paper: PaperClaim
    metric: str  # what the verdict was computed on
    verdict: Verdict
    measured: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "claim": self.claim,
            "paper": asdict(self.paper),
            "metric": self.metric,
            "verdict": self.verdict.status,
            "reason": self.verdict.reason,
            "measured": self.measured,
        }


@dataclass
class Analysis:
    claims: list[Claim]
    tables: list[Table] = field(default_factory=list)
    figures: list[tuple[str, str]] = field(default_factory=list)  # (PNG file name in DIR, caption)
    notes: list[str] = field(default_factory=list)  # how this study was set up, in the report's words


# (arm, its run directory, the study's arms.Probes) -> the arm's record, written to DIR/arms/<key>/arm.json
ArmRunner = Callable[[Arm, Path, Any], dict[str, Any]]


@dataclass(frozen=True)
class Study:
    """What every study module defines as STUDY (study.py's docstring)."""

    name: str
    title: str
    units: float  # training budget of one seed's arms, in unit arms
    plan: Callable[[Context], list[Arm]]
    analyse: Callable[[Context, list[dict[str, Any]]], Analysis]
    run_arm: ArmRunner | None = None  # None: train the arm and measure it (arms.run_train_arm)
    options: tuple[str, ...] = ()  # StudyRequest fields beyond data and budget that decide the arms (study.json)


# ------------------------------------------------------------------------ reading the records
METRIC_NAMES = {
    "top1": "test top-1 (trained on the data set)",
    "val": "validation top-1",
    "fewshot5": "5-shot linear accuracy",
    "fewshot25": "25-shot linear accuracy",
}


def value(record: dict[str, Any], metric: str) -> float:
    """A metric of an arm's record: "top1" (test), "val" (validation top-1), "fewshot5", "fewshot25"."""
    if metric == "top1":
        return float(record["test"]["top1"])
    if metric == "val":
        return float(record["val"]["top1"])
    if metric.startswith("fewshot"):
        shots = record["fewshot"]
        k = metric[len("fewshot") :]
        return float((shots.get(k) or shots[min(shots, key=int)])["mean"])  # tiny sets: the largest k they allow
    raise ValueError(f"unknown metric {metric!r}")


def by_arm(records: list[dict[str, Any]], metric: str) -> dict[str, list[float]]:
    """Arm name -> the metric over its seeds, in plan order."""
    out: dict[str, list[float]] = {}
    for record in records:
        out.setdefault(record["arm"], []).append(value(record, metric))
    return out
