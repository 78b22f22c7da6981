"""What a run holds out and when it evaluates: hold-outs by run length and final split, and one label a class."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import metrics_records, tiny_config

from vitkit.train import trainer


@pytest.mark.parametrize(
    "overrides, held_out",
    [
        (("data.steps=0", "data.epochs=10"), True),  # evaluations at epochs 5 and 10: a validation hold-out to read
        (("data.steps=0", "data.epochs=1"), False),  # shorter than one evaluation period: every image trains
        (("data.epochs=0", "data.steps=300"), True),  # 5 epochs of 1,295 images at batch 32 are 202 steps
        (("data.epochs=0", "data.steps=30"), False),  # ... so 30 steps never reach the first evaluation
        (("eval.every_epochs=1.0125", "data.steps=0", "data.epochs=1.0126"), False),  # a period of 40.97 steps
        # rounds to 41, the run's ceil(40.98) steps: longer than its period in epochs, not in steps
        (("data.steps=0", "data.epochs=0", "run.max_minutes=5"), True),  # a fitted budget decides the length later
        (("data.steps=0", "data.epochs=1", "run.max_minutes=5"), False),  # ... bounded by one epoch
    ],
)
def test_a_run_shorter_than_its_evaluation_period_holds_nothing_out(tmp_path: Path, overrides, held_out) -> None:
    from vitkit.train.assemble import load_splits

    config = tiny_config(tmp_path, "eval.every_epochs=5", *overrides)
    splits = load_splits(config)
    whole = len(load_splits(tiny_config(tmp_path, "eval.every_epochs=0")).train)
    assert ("val" in splits.evals) is held_out
    assert len(splits.train) == (whole - len(splits.evals["val"]) if held_out else whole)


@pytest.mark.parametrize("every", ["5", "0"])
def test_a_run_whose_final_split_is_val_holds_one_out(tmp_path: Path, every: str) -> None:
    """eval.final_split=val reads the validation hold-out at the end, evaluating as it goes or not: never the
    training images."""
    from vitkit.train.assemble import load_splits

    overrides = (f"eval.every_epochs={every}", "data.steps=0", "data.epochs=1", "eval.final_split=val")
    config = tiny_config(tmp_path, *overrides)
    splits = load_splits(config)
    train = {tuple(image.flatten().tolist()) for image in splits.train.images}
    held = {tuple(image.flatten().tolist()) for image in splits.test.images}
    assert held and not train & held and "hold-out" in splits.test.origin


def test_a_run_that_holds_nothing_out_plans_its_evaluation_at_the_end(tmp_path: Path) -> None:
    """One epoch of 22.5 batches with an evaluation every epoch: round(22.47) = 22 falls before the 23rd and
    last step, but no validation split was held out, so the plan says "at the end only" and evaluates once."""
    result = trainer.train(
        tiny_config(tmp_path, "eval.every_epochs=1", "data.steps=0", "data.epochs=1", "data.batch_size=64")
    )
    assert result["plan"]["steps"] == 23 and result["plan"]["eval_every"] == 0
    assert [r["split"] for r in metrics_records(tmp_path) if r["split"] != "train"] == ["test"]


def test_one_label_a_class_evaluates_at_the_end_and_refuses_a_final_val_split(tmp_path: Path) -> None:
    """A hold-out of one image a class is empty (each class keeps its only image): a run that would evaluate
    as it goes trains on all ten images and evaluates at the end; one that must end on val is refused at the
    start, not after training."""
    from vitkit.train.assemble import load_splits

    lengths = ("data.steps=0", "data.epochs=10", "eval.every_epochs=5", "data.labels_per_class=1")
    splits = load_splits(tiny_config(tmp_path, *lengths))
    assert splits.evals == {} and len(splits.train) == 10 and sorted(splits.train.labels.tolist()) == list(range(10))
    with pytest.raises(ValueError, match="1 label per class"):
        load_splits(tiny_config(tmp_path, *lengths, "eval.final_split=val"))
    with pytest.raises(ValueError, match="1 label per class"):
        load_splits(tiny_config(tmp_path, *lengths, "data.val_fraction=0.2"))


def test_the_recipe_line_says_a_run_trains_on_fewer_labels_than_it_was_chosen_for() -> None:
    """With --labels-per-class 10 the line said "chosen for ... 776 training images" of a run that trained on 100."""
    from vitkit.train.resolve import Request, resolve

    assert resolve(Request(data="digits", out="unused")).notes[0] == (
        "recipe: small-8px (chosen for 8px images, 1,438 training images)"
    )
    assert resolve(Request(data="digits", out="unused", labels_per_class=10)).notes[0] == (
        "recipe: small-8px (chosen for 8px images, 1,438 training images, of which --labels-per-class trains on "
        "10 a class)"
    )
