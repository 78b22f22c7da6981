"""Verdict logic on constructed numbers: reproduced / not reproduced at this scale / inconclusive."""

from __future__ import annotations

import math

import pytest

from vitkit.reproduce.compute import accuracy_at, compute_ratios, flops_for, frontier, hybrid_leads
from vitkit.reproduce.verdict import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Verdict,
    both,
    difference,
    estimate,
    exceeds,
    pooled_sd,
    within,
)


def test_pooled_sd_equals_the_textbook_pool() -> None:
    groups = [[0.60, 0.62], [0.70, 0.74, 0.72], [0.5]]  # the single-seed arm adds no degrees of freedom
    squares = (0.01**2 * 2) + (0.02**2 * 2)
    assert pooled_sd(groups) == pytest.approx(math.sqrt(squares / 3))
    assert pooled_sd([[0.5], [0.6]]) is None


def test_difference_and_its_standard_error() -> None:
    effect = difference([0.64, 0.66], [0.60, 0.62], sd=0.01)
    assert effect.mean == pytest.approx(0.04) and effect.se == pytest.approx(0.01)  # 0.01 * sqrt(1/2 + 1/2)
    assert (effect.low, effect.high) == (pytest.approx(0.02), pytest.approx(0.06))


@pytest.mark.parametrize(
    ("a", "b", "sd", "expected"),
    [
        ([0.64, 0.65], [0.60, 0.61], 0.005, REPRODUCED),  # 4 points, se 0.005: clearly above
        ([0.601, 0.602], [0.600, 0.601], 0.0005, NOT_REPRODUCED),  # 0.1 point, tight: below the 0.5-point effect
        ([0.62, 0.60], [0.60, 0.62], 0.02, INCONCLUSIVE),  # no difference but the spread (2 points) is larger
        ([0.60, 0.59], [0.64, 0.65], 0.005, NOT_REPRODUCED),  # the opposite direction, clearly
        ([0.61, 0.62], [0.60, 0.60], 0.01, INCONCLUSIVE),  # 1.5 points with a 2-point interval: straddles 0
    ],
)
def test_exceeds(a, b, sd, expected) -> None:
    verdict = exceeds(difference(a, b, sd), 0.005, "a - b", sd)
    assert verdict.status == expected, verdict.reason
    assert "a - b" in verdict.reason and "seed sd" in verdict.reason


def test_one_seed_decides_on_the_effect_and_says_so() -> None:
    verdict = exceeds(estimate([0.03], None), 0.005, "gap", None)
    assert verdict.status == REPRODUCED and "one seed" in verdict.reason
    assert exceeds(estimate([0.003], None), 0.005, "gap", None).status == NOT_REPRODUCED


@pytest.mark.parametrize(
    ("means", "sd", "n", "expected"),
    [
        ([0.640, 0.642, 0.643], 0.001, 2, REPRODUCED),  # range 0.3 point + 0.2 interval < 1 point
        ([0.60, 0.64, 0.63], 0.001, 2, NOT_REPRODUCED),  # range 4 points
        ([0.640, 0.646, 0.643], 0.01, 2, INCONCLUSIVE),  # range 0.6 point, interval 2 points: straddles the margin
    ],
)
def test_within(means, sd, n, expected) -> None:
    assert within(means, 0.01, "variants", sd, n).status == expected


def test_both_parts() -> None:
    yes, no, maybe = Verdict(REPRODUCED, "a"), Verdict(NOT_REPRODUCED, "b"), Verdict(INCONCLUSIVE, "c")
    assert both(yes, yes).status == REPRODUCED
    assert both(yes, no).status == NOT_REPRODUCED and both(maybe, no).status == NOT_REPRODUCED
    assert both(yes, maybe).status == INCONCLUSIVE and both(yes, maybe).reason == "a; c"


def test_frontier_and_log_linear_interpolation() -> None:
    points = [(1e9, 0.70), (2e9, 0.65), (4e9, 0.80), (8e9, 0.78), (16e9, 0.85)]
    assert frontier(points) == [(1e9, 0.70), (4e9, 0.80), (16e9, 0.85)]
    front = frontier(points)
    assert accuracy_at(front, 2e9) == pytest.approx(0.75)  # halfway in log compute between 1e9 and 4e9
    assert accuracy_at(front, 1e8) == 0.70 and accuracy_at(front, 1e11) == 0.85  # never extrapolated
    assert flops_for(front, 0.75) == (pytest.approx(2e9), "matched")
    assert flops_for(front, 0.60) == (1e9, "ratio is a lower bound")
    assert flops_for(front, 0.90) == (16e9, "ratio is an upper bound")


def test_compute_ratio_of_a_vit_twice_as_efficient() -> None:
    vit = [(1e9, 0.70), (4e9, 0.80)]
    resnet = [(4e9, 0.75), (8e9, 0.70)]  # the second point is dominated and left out of the frontier
    assert compute_ratios(vit, resnet) == [(pytest.approx(2.0), "matched")]
    lead_small, lead_large = hybrid_leads(vit, [(1e9, 0.74), (4e9, 0.80)])
    assert (lead_small, lead_large) == (pytest.approx(0.04), pytest.approx(0.0))


def test_calibrated_unit_arm_fills_the_budget_at_each_models_speed() -> None:
    import dataclasses

    from vitkit.data.sources import describe
    from vitkit.reproduce.scale import Scale, calibrated
    from vitkit.train.recipes import get_recipe

    base = get_recipe("small-8px", describe("digits"))  # batch 128
    wide = dataclasses.replace(base, model=dataclasses.replace(base.model, hidden_size=128))
    speeds = {64: 1000.0, 128: 250.0}  # images/s of each model, as a fake clock would measure them
    scale = calibrated(
        Scale("small", 1.0),
        10.0,
        [(1.0, base), (1.0, base), (2.0, wide)],
        base,
        measure=lambda config: speeds[config.model.hidden_size],
    )
    # 0.8 x 10 min = 480 s, less 3 arms x 5 s = 465 s; one unit step costs 128/1000 + 128/1000 + 2 x 128/250 =
    # 1.28 s -> 363 steps
    assert scale.unit_steps == 363 and scale.images_per_s == 1000.0 and len(scale.speeds) == 2
    assert scale.unit_minutes == pytest.approx(363 * 128 / 1000 / 60, abs=1e-3) and scale.beside_s == 15.0
    # 0.8 x 3 min = 144 s, less 2 arms x (5 s + 20,000 forward images at a third of 1000 training images/s) =
    # 63.3 s: 80.7 s train 2 unit arms, over the 0.3 min each the small scale needs
    evaluated = calibrated(
        Scale("small", 1.0), 3.0, [(1.0, base)] * 2, base, lambda c: 1000.0, eval_images=[20_000, 20_000]
    )
    assert evaluated.name == "small" and evaluated.beside_s == pytest.approx(2 * (5 + 20_000 / 3000), abs=0.1)
    assert evaluated.unit_steps == round((144 - evaluated.beside_s) / (2 * 0.128))
    # 8 arms' 40 s beside 48 s: the arms would train a few steps and sit near chance (they trained a quarter)
    many = calibrated(Scale("small", 1.0), 1.0, [(1.0, base)] * 8, base, measure=lambda c: 1000.0)
    assert many == Scale("tiny", 0.0, beside_s=40.0)
    assert calibrated(Scale("tiny", 0.0), 10.0, [(1.0, base)], base, measure=lambda c: 1 / 0) == Scale("tiny", 0.0)


@pytest.mark.parametrize(("bf16_s", "expected"), [(0.5, "bf16"), (0.95, "fp32")])
def test_calibration_times_the_precision_an_arm_chooses_by_measurement(monkeypatch, bf16_s, expected) -> None:
    """On a host with native bf16, "auto" trains in bf16 only where the model measures 1.15x as fast in it; the
    calibration must time that choice (it took bf16 unmeasured, and arms in fp32 then ran over their time)."""
    from vitkit import device as devices
    from vitkit.data.sources import describe
    from vitkit.reproduce import scale
    from vitkit.train import choices
    from vitkit.train.recipes import get_recipe

    config = get_recipe("small-8px", describe("digits"))
    monkeypatch.setattr(devices, "native_bf16", lambda device: True)
    monkeypatch.setattr(choices, "probe_pass", lambda model, cfg, images, device, dtype: bf16_s if dtype else 1.0)
    timed: list[str] = []

    def step_at(model, optimizer, images, labels, device, precision):
        timed.append(precision)
        return lambda: None

    monkeypatch.setattr(scale, "training_step", step_at)
    monkeypatch.setattr(scale, "time_steps", lambda step, device, steps: 0.5)
    assert scale.calibrate(config) == config.data.batch_size / 0.5
    assert timed == [expected]


def test_a_tiny_study_names_the_budget_for_a_verdict_as_timed_or_as_a_floor() -> None:
    """A study at --budget-minutes 1 (not calibrated) said "give --budget-minutes 4 or more (per seed count as
    now)"; at 4 it calibrated, was still tiny, and said 8.  An uncalibrated figure is a floor, and says so."""
    from vitkit.reproduce.study import mechanics_only

    timed, floor = mechanics_only(7.2, calibrated=True), mechanics_only(3.4, calibrated=False)
    assert "give --budget-minutes 8 or more, with --seeds as now, for a verdict" in timed and "floor" not in timed
    assert "give --budget-minutes 4 or more" in floor and floor.endswith("may ask for more")
