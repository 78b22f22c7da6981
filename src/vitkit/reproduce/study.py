"""A study: arms planned for a time budget, run (or reused), analysed into claims, written as a report.

    DIR/study.json      the request the study was planned with (a re-run must ask for the same study,
                        data and budget; --seeds may grow: the new seeds' arms are added)
    DIR/arms/...        one run directory per arm and seed (reproduce/arms.py)
    DIR/report.md, DIR/results.json, DIR/*.png   (reproduce/report.py)

Every study module defines STUDY = Study(name, title, units, plan, analyse) (reproduce/spec.py): `units`
is the training time of one seed's arms in unit arms (scale.py turns the budget into minutes per unit),
`plan` returns the arms, `analyse` turns the arms' records into claims with verdicts, tables and figures.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from vitkit.atomic import atomic_write_text
from vitkit.bench.throughput import num_threads
from vitkit.data.sources import describe
from vitkit.reproduce.arms import FEWSHOT_SHOTS, Probes, evaluation_images, fewshot_draws, run_train_arm
from vitkit.reproduce.report import OVERRUN, unit_text, write_report
from vitkit.reproduce.scale import ARM_SECONDS, Scale, base_config, calibrated, scale_for, smallest_budget
from vitkit.reproduce.spec import Analysis, Context, Study, StudyRequest
from vitkit.reproduce.verdict import INCONCLUSIVE, Verdict
from vitkit.runs import CONFIG

log = logging.getLogger(__name__)


def make_context(study: Study, request: StudyRequest) -> Context:
    info = describe(request.data)
    scale = scale_for(request.budget_minutes, study.units * request.seeds)
    base = base_config(info, scale, threads=request.threads, device=request.device)
    return Context(request=request, info=info, scale=scale, base=base, out=Path(request.out))


def prepare_directory(study: Study, context: Context, probes: Probes | None = None) -> Context:
    """Refuse a directory planned for another study, data set or budget; calibrate the unit arm once (or read the
    stored calibration, so that a re-run plans the same arms); record the request in study.json.  `probes`: where
    the test split is read to size the arms' evaluations (kept for the arms' own)."""
    path = context.out / "study.json"
    request = context.request
    mine = {
        "study": study.name,
        "data": request.data,
        "budget_minutes": request.budget_minutes,
        **{key: getattr(request, key) for key in study.options},
    }
    stored = json.loads(path.read_text()) if path.is_file() else {}
    if not stored and (context.out / CONFIG).is_file():  # a training run's directory: the study is not written in it
        raise ValueError(f"{context.out} holds a training run (its config.json); choose another --out for the study")
    if stored:
        differs = [k for k, v in mine.items() if stored.get(k) != v]
        if differs:
            planned = ", ".join(f"{k}={stored.get(k)!r}" for k in differs)
            raise ValueError(
                f"{context.out} holds a study planned with {planned}; re-run with the same values to "
                "resume, or use another --out"
            )
    scale = context.scale
    if stored.get("scale"):  # planned before (tiny, or calibrated): the same arms again, whatever --seeds says now
        scale = Scale(**stored["scale"])
    elif scale.name != "tiny" and study.run_arm is None:  # arms that train: their speed sets the unit
        provisional = dataclasses.replace(context, scale=dataclasses.replace(scale, unit_steps=1))
        arms = study.plan(provisional)
        configs, probes = [(a.units, a.config) for a in arms], probes or Probes(request.device)
        tests = len(probes.split(context.base, "test"))
        evaluated = [evaluation_images(arm, tests, context.info) for arm in arms]
        scale = calibrated(scale, request.budget_minutes, configs, context.base, eval_images=evaluated)
        log.info("calibration: %s", calibration_text(scale, context.base.data.batch_size))
    if scale.name != context.scale.name:  # a stored plan at another scale than this --seeds alone would give
        base = base_config(context.info, scale, threads=request.threads, device=request.device)
        context = dataclasses.replace(context, base=base)
    context = dataclasses.replace(context, scale=scale)
    context.out.mkdir(parents=True, exist_ok=True)
    record = {**mine, "seeds": request.seeds, "scale": asdict(scale)}
    atomic_write_text(path, json.dumps(record, indent=1) + "\n")
    return context


def calibration_text(scale: Scale, batch: int) -> str:
    beside = f"about {scale.beside_s / 60:.1f} min of the arms' start-up and evaluations"
    if scale.name == "tiny":
        return f"{beside} leave too little to train at the small scale: tiny scale"
    return (
        f"{len(scale.speeds)} model(s) timed; the base model trains {scale.images_per_s:.0f} images/s; {beside}; a "
        f"unit arm is {scale.unit_steps} steps of {batch} images"
    )


def run_study(study: Study, request: StudyRequest) -> dict[str, Any]:
    """Plan, run (resuming and reusing), analyse and report `study`; returns the report's summary."""
    began = time.monotonic()
    probes = Probes(request.device)  # the splits it reads are kept for the arms' measurements
    context = prepare_directory(study, make_context(study, request), probes)
    arms = study.plan(context)
    keys = [a.key for a in arms]
    if len(set(keys)) != len(keys):  # a planning error: two arms would share one run directory
        shared = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"study {study.name} planned arms with the same directory: {shared}")
    log.info(
        "study %s: %d arms (%s scale; %s) on %s into %s",
        study.name,
        len(arms),
        context.scale.name,
        unit_text(asdict(context.scale)),
        request.data,
        context.out,
    )
    tiny = context.scale.name == "tiny"
    probes.shots, probes.draws = (5,) if tiny else FEWSHOT_SHOTS, fewshot_draws(context.scale.name)
    run_arm = study.run_arm or run_train_arm
    records = []
    with num_threads(request.threads or None):  # the probes too, not only the arms' training
        for index, arm in enumerate(arms, 1):
            record = run_arm(arm, context.arm_dir(arm.key), probes)
            records.append(record)
            log.info("arm %d/%d %s: %s", index, len(arms), arm.key, headline(record))
    analysis = study.analyse(context, records)
    if tiny:  # the speed study's too: its tiny pair is no pair of comparable cost (4-5x apart in FLOPs)
        beside = context.scale.beside_s or ARM_SECONDS * len(arms)  # not calibrated: what every arm takes at least
        minimum = smallest_budget(study.units * request.seeds, beside)
        analysis = without_verdicts(analysis, mechanics_only(minimum, calibrated=bool(context.scale.beside_s)))
    elif why := learned_little(records, context.info.num_classes):
        analysis = without_verdicts(analysis, why)
    minutes = (time.monotonic() - began) / 60
    summary = write_report(study, context, records, analysis, minutes=minutes)
    if not tiny and summary["arm_minutes"] > OVERRUN * request.budget_minutes:  # tiny arms' steps are fixed
        log.warning(
            "study %s: its arms took %.1f min of its %g-min budget: their start-up and evaluations cost more here "
            "than the plan allowed (the report says so)",
            study.name,
            summary["arm_minutes"],
            request.budget_minutes,
        )
    return summary


LEARNED_SHARE = 0.1  # arms "learned" where the best test top-1 lies this share of the way from chance to 100%


def mechanics_only(minimum_minutes: float, *, calibrated: bool) -> str:
    """Why a tiny-scale study has no verdict: its arms train 10 steps per unit of length (a test of the mechanics)
    and sit near chance, so an effect between them says nothing of the paper's claim.  The budget it names is
    timed on this host where the study was `calibrated`, else a floor (the arms' start-up and evaluations not yet
    timed here)."""
    floor = (
        "" if calibrated else "; that is a floor: its arms' start-up is timed here at that budget, and may ask for more"
    )
    return (
        "tiny scale: every arm is a tiny model run for a few steps (10 per unit of its length), a test of the "
        f"mechanics, not of the claim; give --budget-minutes {math.ceil(minimum_minutes)} or more, with --seeds as "
        f"now, for a verdict{floor}"
    )


def learned_little(records: list[dict[str, Any]], num_classes: int) -> str | None:
    """Why a study has no verdict where even its best arm sits near chance (its test top-1 below LEARNED_SHARE of
    the way from chance to 100%): an effect between untrained arms says nothing of the claim, and arms that all
    learned nothing "differ little".  The best, not a typical, arm: some arms sit near chance by design (a few
    labels from scratch), and some measure another task (a pre-training set).  None where one learned."""
    tops = [r["test"]["top1"] for r in records if (r.get("test") or {}).get("top1") is not None]
    if not tops or num_classes < 2:
        return None
    chance = 1 / num_classes
    floor, best = chance + LEARNED_SHARE * (1 - chance), max(tops)
    if best >= floor:
        return None
    return (
        f"the arms learned little: the best test top-1 is {100 * best:.1f}%, chance {100 * chance:.1f}% (a "
        f"verdict needs {100 * floor:.1f}%); give a larger --budget-minutes"
    )


def without_verdicts(analysis: Analysis, why: str) -> Analysis:
    """Every verdict of `analysis` made inconclusive for the reason `why`, the measured one kept beside it."""
    claims = [
        dataclasses.replace(claim, verdict=Verdict(INCONCLUSIVE, f"{why}. Measured: {claim.verdict.reason}"))
        for claim in analysis.claims
    ]
    return dataclasses.replace(analysis, claims=claims)


def headline(record: dict[str, Any]) -> str:
    """One line on a finished arm."""
    parts = ["reused" if record.get("reused") else f"{record.get('wall_minutes', 0):.2f} min"]
    if record.get("test"):
        parts.append(f"test top-1 {100 * record['test']['top1']:.2f}%")
    shots = record.get("fewshot") or {}
    if "5" in shots:
        parts.append(f"5-shot {100 * shots['5']['mean']:.2f}%")
    return ", ".join(parts)
