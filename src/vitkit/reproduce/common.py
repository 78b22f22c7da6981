"""Pieces the study modules share: arms over seeds, numbers over seeds, and the one-line tests of a claim."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from vitkit.models.configs import ModelConfig
from vitkit.reproduce.figures import mean_sd
from vitkit.reproduce.scale import timed
from vitkit.reproduce.spec import Arm, Context, Table, by_arm
from vitkit.reproduce.verdict import SIMILAR_MARGIN, SMALLEST_EFFECT, Verdict, difference, exceeds, pooled_sd, within


def arm(
    context: Context,
    name: str,
    seed: int,
    model: ModelConfig,
    labels: dict[str, Any],
    *,
    units: float = 1.0,
    measure: tuple[str, ...] = ("fewshot",),
    data: dict[str, Any] | None = None,
    optim: dict[str, Any] | None = None,
    run: dict[str, Any] | None = None,
) -> Arm:
    """An arm training `model` from the study's base config for `units` units with `seed`; `data`, `optim` and
    `run` replace fields of those groups."""
    config = dataclasses.replace(context.base, model=model)
    changes = {"data": data or {}, "optim": optim or {}, "run": {**(run or {}), "seed": seed}}
    config = dataclasses.replace(
        config, **{g: dataclasses.replace(getattr(config, g), **c) for g, c in changes.items()}
    )
    return Arm(
        name=name, seed=seed, config=timed(config, units, context.scale), labels=labels, measure=measure, units=units
    )


def over_seeds(context: Context, make) -> list[Arm]:
    """`make(seed)` -> arms, for every seed; seed-major, so a killed study has whole seeds done first."""
    return [a for seed in context.seeds for a in make(seed)]


def table_of(
    records: list[dict[str, Any]],
    metrics: Sequence[str],
    names: dict[str, str],
    title: str,
    extra: dict[str, list[str]] | None = None,
    extra_header: Sequence[str] = (),
) -> Table:
    """One row per arm: extra columns, then mean +- seed sd of every metric."""
    columns = {m: by_arm(records, m) for m in metrics}
    arms = list(columns[metrics[0]])
    rows = []
    for name in arms:
        cells = [name, *((extra or {}).get(name, []))]
        for m in metrics:
            mean, sd = mean_sd(columns[m][name])
            cells.append(f"{100 * mean:.2f} +- {100 * sd:.2f}" if len(columns[m][name]) > 1 else f"{100 * mean:.2f}")
        rows.append(cells)
    return Table(title, ["arm", *extra_header, *(names[m] + " (%)" for m in metrics)], rows)


def better(records: list[dict[str, Any]], metric: str, a: str, b: str, what: str) -> Verdict:
    """The claim "arm a beats arm b" on `metric`, with the study's pooled seed spread."""
    values = by_arm(records, metric)
    sd = pooled_sd(values.values())
    return exceeds(difference(values[a], values[b], sd), SMALLEST_EFFECT, what, sd)


def similar(records: list[dict[str, Any]], metric: str, names: Sequence[str], what: str) -> Verdict:
    """The claim "these arms differ little" on `metric`."""
    values = by_arm(records, metric)
    sd = pooled_sd(values.values())
    means = [sum(values[n]) / len(values[n]) for n in names]
    return within(means, SIMILAR_MARGIN, what, sd, min(len(values[n]) for n in names))


def means(records: list[dict[str, Any]], metric: str) -> dict[str, float]:
    return {name: round(sum(v) / len(v), 4) for name, v in by_arm(records, metric).items()}
