"""Verdicts: does a measured effect support the paper's claim at this scale?

Every claim is reduced to one number per seed (a difference of accuracies, a log compute ratio, ...)
and tested against a threshold with its seed spread, never by eye:

    estimate   mean over seeds; standard error se = sd / sqrt(n), where sd is the seed standard deviation
               pooled over all arms of the study (two seeds alone estimate it poorly; the pool is steadier)
    interval   mean +- 2 se (about 95%)

    "A exceeds B" (a claim that something is better / larger):
        reproduced                      the interval is above 0 and the mean reaches the smallest effect of interest
        not reproduced at this scale    the whole interval is below the smallest effect of interest
        inconclusive                    otherwise: the seed spread is larger than the effect
    "A is about B" (a claim that variants differ little):
        reproduced                      range of the means + 2 se is within the margin
        not reproduced at this scale    range - 2 se is beyond the margin
        inconclusive                    otherwise

With one seed the spread is not measured: se = 0 and every reason says so.  Nothing is dropped: an
arm that disagrees counts like any other.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced at this scale"
INCONCLUSIVE = "inconclusive"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE)
Z = 2.0  # interval half-width in standard errors
SMALLEST_EFFECT = 0.005  # accuracy: half a point is the smallest difference a claim of "better" needs
SIMILAR_MARGIN = 0.01  # accuracy: variants "differ little" when their means lie within one point


@dataclass(frozen=True)
class Estimate:
    """A mean over seeds and its standard error (0 when the spread is unknown)."""

    mean: float
    se: float
    n: int

    @property
    def low(self) -> float:
        return self.mean - Z * self.se

    @property
    def high(self) -> float:
        return self.mean + Z * self.se


@dataclass(frozen=True)
class Verdict:
    status: str  # one of VERDICTS
    reason: str


def seed_sd(values: Sequence[float]) -> float | None:
    """Sample standard deviation over seeds; None for a single seed."""
    return statistics.stdev(values) if len(values) > 1 else None


def pooled_sd(groups: Iterable[Sequence[float]]) -> float | None:
    """The seed standard deviation pooled over arms (each arm's values over its seeds); None without repeats."""
    squares, dof = 0.0, 0
    for values in groups:
        if len(values) > 1:
            mean = sum(values) / len(values)
            squares += sum((v - mean) ** 2 for v in values)
            dof += len(values) - 1
    return math.sqrt(squares / dof) if dof else None


def estimate(values: Sequence[float], sd: float | None) -> Estimate:
    """Mean of per-seed values with se = sd / sqrt(n) (sd None: se 0)."""
    if not values:
        raise ValueError("an estimate needs at least one value")
    n = len(values)
    return Estimate(sum(values) / n, (sd or 0.0) / math.sqrt(n), n)


def difference(a: Sequence[float], b: Sequence[float], sd: float | None) -> Estimate:
    """mean(a) - mean(b) with the standard error of a difference of two independent means."""
    se = (sd or 0.0) * math.sqrt(1 / len(a) + 1 / len(b))
    return Estimate(sum(a) / len(a) - sum(b) / len(b), se, min(len(a), len(b)))


def spread_note(sd: float | None, n: int) -> str:
    return f"seed sd {sd:.4f} over {n} seeds" if sd is not None else "one seed: seed spread not measured"


def exceeds(effect: Estimate, smallest: float, what: str, sd: float | None, unit: str = "") -> Verdict:
    """The claim "effect > 0, by at least `smallest`" (module docstring)."""
    shown = (
        f"{what} = {effect.mean:+.4f}{unit} (interval {effect.low:+.4f} .. {effect.high:+.4f}; "
        f"{spread_note(sd, effect.n)})"
    )
    if effect.low > 0 and effect.mean >= smallest:
        return Verdict(REPRODUCED, f"{shown}: above 0 and at least the smallest effect of interest {smallest:g}")
    if effect.high < smallest:
        return Verdict(NOT_REPRODUCED, f"{shown}: below the smallest effect of interest {smallest:g}")
    return Verdict(INCONCLUSIVE, f"{shown}: the seed spread is larger than the effect")


def within(means: Sequence[float], margin: float, what: str, sd: float | None, n: int) -> Verdict:
    """The claim "these variants differ by less than `margin`": the range of their means against it."""
    spread = max(means) - min(means)
    se = (sd or 0.0) * math.sqrt(2 / n)  # se of a difference of two arm means
    shown = f"{what}: range of means {spread:.4f} (+- {Z * se:.4f}; {spread_note(sd, n)}) against the margin {margin:g}"
    if spread + Z * se <= margin:
        return Verdict(REPRODUCED, f"{shown}: within it")
    if spread - Z * se > margin:
        return Verdict(NOT_REPRODUCED, f"{shown}: beyond it")
    return Verdict(INCONCLUSIVE, f"{shown}: the seed spread straddles it")


def both(first: Verdict, second: Verdict) -> Verdict:
    """A claim made of two parts: reproduced only if both are, not reproduced if either is not."""
    reason = f"{first.reason}; {second.reason}"
    if NOT_REPRODUCED in (first.status, second.status):
        return Verdict(NOT_REPRODUCED, reason)
    if first.status == second.status == REPRODUCED:
        return Verdict(REPRODUCED, reason)
    return Verdict(INCONCLUSIVE, reason)
