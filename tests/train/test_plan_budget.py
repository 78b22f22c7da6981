"""A fitted time budget's plan: what it holds back for evaluations, and what it says."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import tiny_config

from vitkit.train.config import apply_overrides
from vitkit.train.plan import make_plan


def test_a_budget_counts_the_periodic_evaluations_of_the_steps_that_fit() -> None:
    """A 1-minute budget on a 50-epoch run that evaluates every 5 epochs counted the 11 evaluations of all 50
    epochs (89 s) against its minute: "0 s are left to train ... ends late, after about 2.1 min", and the run
    trained its 1-s floor, then ended at 1.06 min.  The budget holds the evaluations of the steps it trains."""
    from vitkit.train.plan_text import plan_lines

    config = tiny_config(Path("/unused"), "data.steps=1000", "data.batch_size=100", "eval.every_epochs=10")
    config = apply_overrides(config, ["data.epochs=0", "run.max_minutes=1"])
    timings = {(0.0, 8): 0.2}
    plan = make_plan(config, num_train=1000, timings=timings, budget_s=50.0, eval_images=1000, eval_image_s=0.002)
    assert plan.eval_every == 100 and plan.steps == 1000  # 10 periodic evaluations of 2 s in its own length
    # 48 s after the final evaluation's 2, shared by steps of 0.2 s and 2 s of evaluation every 100 of them
    trained = 48.0 * 0.2 / (0.2 + 2.0 / 100) / 0.2
    assert plan.measured["fit_steps"] == round(trained) == 218
    assert plan.measured["eval_seconds"] == pytest.approx(2.0 + 0.02 * trained, abs=0.05)
    assert plan.measured["train_seconds"] == pytest.approx(50.0 - plan.measured["eval_seconds"], abs=0.05)
    assert not [line for line in plan_lines(plan) if line.startswith("warning:")]
    tight = make_plan(config, num_train=1000, timings=timings, budget_s=10.0, eval_images=1000, eval_image_s=0.002)
    assert tight.measured["fit_steps"] == round(8.0 / 0.22) and tight.measured["eval_seconds"] < 3.0
    own = apply_overrides(config, ["data.steps=50"])  # its own 50 steps end it first: their 0 evaluations count
    short = make_plan(own, num_train=1000, timings=timings, budget_s=50.0, eval_images=1000, eval_image_s=0.002)
    assert short.measured["fit_steps"] == 218 and short.measured["eval_seconds"] == pytest.approx(2.0 + 0.02 * 50)
