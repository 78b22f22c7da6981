"""The engine's rules: a budget is fitted (ends annealed, by a fake clock), flips follow the source,
every folder layout trains and reports a test accuracy, evaluation during training never reads test."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import FakeTime, metrics_records, sigterm_after, tiny_config
from PIL import Image

from vitkit.cli import main
from vitkit.data.sources import SourceInfo
from vitkit.train import trainer
from vitkit.train.recipes import auto_recipe_name, get_recipe
from vitkit.train.resolve import Request, resolve


def test_budgeted_run_with_a_fake_clock_ends_at_the_final_learning_rate(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(trainer, "time", FakeTime())
    run = tmp_path / "run"  # 1,000,000 planned steps, 0.02 min of fake time: the clock ends the schedule
    result = trainer.train(
        tiny_config(
            run,
            "data.steps=1000000",
            "run.max_minutes=0.02",
            "run.log_every=1",
            "optim.warmup_steps=3",
            "optim.end_lr_fraction=0.1",
        )
    )
    lrs = [r["lr"] for r in metrics_records(run) if r["split"] == "train"]
    assert result["status"] == "finished" and 5 < result["step"] < 1_000_000 and len(lrs) == result["step"]
    assert lrs[-1] == pytest.approx(0.1 * result["plan"]["lr"])  # exactly the end value of the schedule
    assert all(b <= a + 1e-12 for a, b in zip(lrs[3:], lrs[4:]))  # decaying after warmup, never cut
    assert result["plan"]["measured"]["fit_epochs"] > 0


def test_a_budget_alone_runs_until_the_time_is_spent(tmp_path: Path, monkeypatch) -> None:
    """No length of its own: the fake clock alone ends the run, annealed, however many steps fit."""
    monkeypatch.setattr(trainer, "time", FakeTime())
    run = tmp_path / "run"
    result = trainer.train(
        tiny_config(
            run, "data.steps=0", "data.epochs=0", "run.max_minutes=0.05", "run.log_every=1", "optim.end_lr_fraction=0.1"
        )
    )
    lrs = [r["lr"] for r in metrics_records(run) if r["split"] == "train"]
    assert result["status"] == "finished" and not result["plan"]["steps_given"] and len(lrs) == result["step"] > 5
    assert lrs[-1] == pytest.approx(0.1 * result["plan"]["lr"])  # ended at the schedule's end value


def test_a_fitted_run_records_its_last_steps_and_only_on_its_cadence(tmp_path: Path, monkeypatch) -> None:
    """The last steps after the last multiple of log_every had been in no record, and a record fell off the
    cadence where the warm-up's estimate of the length had been."""
    monkeypatch.setattr(trainer, "time", FakeTime())
    run = tmp_path / "run"
    result = trainer.train(tiny_config(run, "data.steps=0", "data.epochs=0", "run.max_minutes=0.05", "run.log_every=4"))
    steps = [r["step"] for r in metrics_records(run) if r["split"] == "train"]
    assert steps[-1] == result["step"] > 8 and all(step % 4 == 0 for step in steps[:-1])


def test_a_fitted_run_that_ended_annealed_before_its_length_stays_finished(tmp_path: Path, monkeypatch) -> None:
    """Re-run, it had been taken for a run made longer by hand: "budget spent, not annealed", or trained on."""
    monkeypatch.setattr(trainer, "time", FakeTime())
    config = tiny_config(tmp_path / "run", "data.steps=1000000", "run.max_minutes=0.02")
    first = trainer.train(config)
    again = trainer.train(config)
    assert first["status"] == again["status"] == "finished" and again["step"] == first["step"] < 1_000_000


def test_cut_budget_keeps_the_old_guillotine(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(trainer, "time", FakeTime())
    run = tmp_path / "run"
    result = trainer.train(
        tiny_config(
            run,
            "data.steps=1000000",
            "run.max_minutes=0.02",
            "run.log_every=1",
            "optim.warmup_steps=3",
            "run.budget_schedule=cut",
        )
    )
    lrs = [r["lr"] for r in metrics_records(run) if r["split"] == "train"]
    assert result["status"] == "time_budget" and lrs[-1] > 0.9 * result["plan"]["lr"]  # stopped near the peak


@pytest.mark.parametrize(
    ("uri", "flip"),
    [("digits", False), ("mnist:/x", False), ("fashion-mnist:/x", True), ("cifar10:/x", True), ("folder:/x", True)],
)
def test_flips_follow_the_source(uri: str, flip: bool) -> None:
    """In every recipe: the paper's two had flipped digits too, which a mirror does not keep."""
    size = {"digits": 8, "mnist": 28, "fashion-mnist": 28, "cifar10": 32}.get(uri.split(":")[0], 64)
    info = SourceInfo(uri=uri, num_train=1000, num_classes=10, image_size=size, channels=1, in_memory=True)
    assert get_recipe(auto_recipe_name(info), info).augment.flip is flip
    for recipe in ("paper-pretrain", "paper-finetune", "paper-pretrain-tiny", "paper-finetune-tiny"):
        assert get_recipe(recipe, info).augment.flip is flip, recipe


def _images(root: Path, classes: tuple[str, ...] = ("cat", "dog"), count: int = 10) -> None:
    rng = np.random.default_rng(0)
    for label, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(count):
            pixels = (rng.integers(0, 80, (12, 12, 3)) + 120 * label).astype(np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")


@pytest.mark.parametrize("layout", ["flat", "train-only"])
def test_every_folder_layout_trains_and_reports_test_accuracy(tmp_path: Path, layout: str, capsys) -> None:
    data = tmp_path / "data"
    _images(data if layout == "flat" else data / "train")
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--data",
            f"folder:{data}",
            "--recipe",
            "small-64px-tiny",
            "--out",
            str(out),
            "--json",
            "--set",
            "run.threads=1",
            "--set",
            "data.steps=2",
            "--set",
            "eval.every_epochs=1",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:]
    result = json.loads(captured.out.strip().splitlines()[-1])
    assert result["test"]["count"] == 4 and 0 <= result["test"]["top1"] <= 1  # the fixed 20% hold-out: 2 per class
    splits = result["plan"]["splits"]
    assert splits["test"]["images"] == 4 and "hold-out" in splits["test"]["from"]
    assert splits["val"]["images"] == 2 and splits["train"]["images"] == 14  # val: held out of train, not test
    assert "test: 4 images from a fixed 20% class-stratified hold-out" in captured.err
    assert "the convention for natural images" in captured.err  # a folder cannot tell whether flips keep labels


def test_train_fraction_takes_nested_stratified_parts(tmp_path: Path) -> None:
    from vitkit.train.assemble import load_splits

    parts = [load_splits(tiny_config(tmp_path, f"data.train_fraction={f}")).train for f in (0.1, 0.3, 1.0)]
    per_class = parts[2].labels.bincount().tolist()
    assert [len(p) for p in parts] == [sum(max(1, round(f * n)) for n in per_class) for f in (0.1, 0.3, 1.0)]
    for part in parts[:2]:
        counts = part.labels.bincount(minlength=10).double()
        assert ((counts / counts.sum() - 0.1).abs() < 0.02).all()  # class-stratified: ~10% of each digit
    rows = [{tuple(img.flatten().tolist()) for img in part.images} for part in parts]
    assert rows[0] <= rows[1] <= rows[2]  # growing subsets contain the smaller ones
    assert "10.0% class-stratified part" in parts[0].origin


@pytest.mark.parametrize(
    "flags, expected",
    [
        ({"max_minutes": 5.0}, 0.0),  # the budget alone decides: no length of the recipe's
        ({"max_minutes": 5.0, "epochs": 7.0}, 7.0),  # the user's length stays
        ({"max_minutes": 5.0, "overrides": ("data.epochs=9",)}, 9.0),
        (
            {"max_minutes": 5.0, "overrides": ("run.budget_schedule=cut",)},
            "1x",
        ),  # a guillotine keeps the recipe's length
        ({}, "1x"),  # no budget: the recipe's length
    ],
)
def test_a_budget_without_a_given_length_runs_by_the_clock_alone(flags: dict, expected) -> None:
    from vitkit.train.resolve import Request, resolve

    recipe = resolve(Request(data="digits", out="unused")).config.data.epochs
    epochs = resolve(Request(data="digits", out="unused", **flags)).config.data.epochs
    assert epochs == ({"1x": recipe}.get(expected, expected)) and recipe == 60


def test_the_pretraining_recipes_own_epochs_bound_a_budgeted_run() -> None:
    """small-64px-pretrain overfits past its 60 epochs (140 fit an hour with native bf16): under --max-minutes
    its length stays, so the run ends at whichever comes first; --epochs still replaces it."""
    from vitkit.train.resolve import Request, resolve

    def length(**flags) -> tuple[float, int]:
        data = resolve(Request(data="digits", out="unused", recipe="small-64px-pretrain", **flags)).config.data
        return data.epochs, data.steps

    assert length() == length(max_minutes=60.0) == (60.0, 0)
    assert length(max_minutes=60.0, epochs=20.0) == (20.0, 0)
    plain = resolve(Request(data="digits", out="unused", recipe="small-32px", max_minutes=60.0)).config.data
    assert (plain.epochs, plain.steps) == (0.0, 0)  # another recipe: the budget alone decides


def test_fine_tuning_under_a_budget_is_bounded_by_its_named_epochs() -> None:
    """finetune-small runs 10 epochs without a budget; under one, as many as fit up to FINETUNE_MAX_EPOCHS (a
    fast host's 15 minutes held 843 epochs of 100 labels a class and overfit); --epochs still wins."""
    from vitkit.train.resolve import Request, resolve
    from vitkit.train.transfer_recipes import FINETUNE_MAX_EPOCHS

    def epochs(**flags) -> float:
        return resolve(Request(data="digits", out="unused", recipe="finetune-small", **flags)).config.data.epochs

    assert FINETUNE_MAX_EPOCHS == 100.0
    assert (epochs(), epochs(max_minutes=15.0), epochs(max_minutes=15.0, epochs=300.0)) == (10.0, 100.0, 300.0)


def test_a_pretraining_run_re_run_without_its_budget_keeps_it(tmp_path: Path) -> None:
    """Killed and re-run without --max-minutes, a budgeted small-64px-pretrain run keeps its budget, as a run
    whose length is its budget does: its 60 epochs are a cap, not a length the user asked for (on a host
    where the hour holds 22 of them, the re-run would otherwise train 2.7 hours)."""
    from vitkit.train.parts import reconcile

    def unbudgeted(config):
        return dataclasses.replace(config, run=dataclasses.replace(config.run, max_minutes=0.0))

    for recipe, kept in (("small-64px-pretrain", 60.0), ("small-32px", 0.0)):  # small-32px: a length of its own
        planned = tiny_config(tmp_path / recipe, "data.steps=2", "run.max_minutes=60")
        planned = dataclasses.replace(planned, recipe=recipe)
        trainer.train(planned)  # a checkpoint to resume from, and the stored config
        assert reconcile(unbudgeted(planned)).run.max_minutes == kept, recipe


def test_a_run_whose_length_is_its_budget_re_run_without_it_warns_of_no_change(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    """training.md: a re-run without --max-minutes keeps the budget; it had warned of a "different config
    (data.epochs, run.max_minutes)" on every resume, once per process under torchrun."""
    from vitkit.train.parts import reconcile

    monkeypatch.setattr(trainer, "time", FakeTime())
    budgeted = ("data.steps=0", "data.epochs=0", "run.max_minutes=0.02")
    trainer.train(tiny_config(tmp_path / "run", *budgeted))
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        kept = reconcile(tiny_config(tmp_path / "run"), length_given=False)  # the recipe's epochs, as resolved
    assert kept.run.max_minutes == 0.02 and kept.data.epochs == 0 and "different config" not in caplog.text
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        reconcile(tiny_config(tmp_path / "run", "data.epochs=50"))  # the user's --epochs 50: kept from them, said
    assert "different config (data.epochs" in caplog.text
    caplog.clear()
    from vitkit.train.resolve import Request, resolve  # what the CLI passes as length_given

    given = [resolve(Request(data="digits", out="x", **flags)).length_given for flags in ({}, {"epochs": 50.0})]
    assert given == [False, True]
    assert resolve(Request(data="digits", out="x", overrides=("data.steps=9",))).length_given
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        reconcile(tiny_config(tmp_path / "run", *budgeted, "optim.lr=0.5"))
    assert "different config (optim.lr)" in caplog.text  # a real change is still said
    caplog.clear()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "localhost")
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        reconcile(tiny_config(tmp_path / "run", *budgeted, "optim.lr=0.5"))
    assert "different config" not in caplog.text  # the main process says it for the run


def test_a_budgeted_run_resumed_after_a_long_start_up_trains_the_rest_and_ends_annealed(
    tmp_path: Path, monkeypatch
) -> None:
    """An interruption costs its restart on top of the budget: the resumed run's start-up is not charged, so
    it trains the rest of its schedule and its last step runs at the schedule's end value."""
    clock, real_step, real_warm_up = FakeTime(), trainer.train_step, trainer.Trainer._warm_up
    monkeypatch.setattr(trainer, "time", clock)
    overrides = ("data.steps=0", "data.epochs=0", "run.max_minutes=0.05", "run.log_every=1")
    # FakeTime ticks at every reading: checkpoints by the clock, read every step here, would halve the steps that fit
    overrides += ("optim.end_lr_fraction=0.1", "run.checkpoint_minutes=0")

    monkeypatch.setattr(trainer, "train_step", sigterm_after(150, real_step))
    run = tmp_path / "run"
    first = trainer.train(tiny_config(run, *overrides))
    assert first["status"] == "interrupted" and first["step"] == 150

    def slow_warm_up(self):  # the restart loads, builds and compiles for longer than the budget had left, and
        clock.now += 10.0  # times far slower passes (a loaded host): its estimate of the whole run's steps, below
        return {key: 10 * seconds for key, seconds in real_warm_up(self).items()}  # the 150 taken, had read as spent

    monkeypatch.setattr(trainer, "train_step", real_step)
    monkeypatch.setattr(trainer.Trainer, "_warm_up", slow_warm_up)
    resumed = trainer.train(tiny_config(run, *overrides))
    lrs = [r["lr"] for r in metrics_records(run) if r["split"] == "train"]
    assert resumed["status"] == "finished" and resumed["step"] > 150 and len(lrs) == resumed["step"]
    assert lrs[-1] == pytest.approx(0.1 * resumed["plan"]["lr"])  # ended at the schedule's end value


def test_a_finished_budgeted_run_re_run_takes_no_more_steps(tmp_path: Path, monkeypatch, caplog) -> None:
    """The last step ran at the schedule's end value: a re-run finds the run ended, however its clock reads
    (here its final evaluation is timed faster, so less of the budget is kept back for it), and says so instead
    of a plan whose estimates and warnings would read as a run to come."""
    monkeypatch.setattr(trainer, "time", FakeTime())
    run, overrides = tmp_path / "run", ("data.steps=0", "data.epochs=0", "run.max_minutes=0.05", "run.log_every=1")
    monkeypatch.setattr(trainer.Trainer, "_eval_image_seconds", lambda self, count: 0.5 / count)
    plans: list = []
    first = trainer.train(tiny_config(run, *overrides), on_plan=plans.append)
    before = [r for r in metrics_records(run) if r["split"] == "train"]
    monkeypatch.setattr(trainer.Trainer, "_eval_image_seconds", lambda self, count: 0.0)
    with caplog.at_level(logging.INFO, logger="vitkit.train.trainer"):
        again = trainer.train(tiny_config(run, *overrides), on_plan=plans.append)
    said = f"finished at step {first['step']}: nothing left to train (another --epochs or --max-minutes does not"
    assert len(plans) == 1 and said in caplog.text  # not "again": a signal may have cut the first evaluation short
    assert f"start a new one from its weights with --set run.init_from={run})" in caplog.text
    assert "schedule annealed at step" not in caplog.text  # "(about 581)": the new budget's estimate, taken for news
    assert first["status"] == again["status"] == "finished" and again["step"] == first["step"] == len(before)
    assert [r for r in metrics_records(run) if r["split"] == "train"] == before
    assert again["test"]["top1"] == first["test"]["top1"]


def test_what_the_command_spent_before_training_is_charged_to_the_budget(tmp_path: Path, monkeypatch) -> None:
    """Importing torch and reading the data take seconds of a --max-minutes budget before train() is called."""
    from vitkit.host import process_seconds

    assert 0.0 < process_seconds() < 86_400  # this test process's age, from the OS
    monkeypatch.setattr(trainer, "time", FakeTime())
    overrides = ("data.steps=0", "data.epochs=0", "run.max_minutes=0.05")
    fresh = trainer.train(tiny_config(tmp_path / "fresh", *overrides))
    late = trainer.train(tiny_config(tmp_path / "late", *overrides), spent_s=1.5)
    left = fresh["plan"]["measured"]["train_seconds"] - late["plan"]["measured"]["train_seconds"]
    assert left == pytest.approx(1.5, abs=0.1) and late["step"] < fresh["step"]


def test_a_grayscale_model_reads_a_colour_folder_as_eval_and_predict_do(tmp_path: Path) -> None:
    """Each split is decoded to Pillow's L before resizing, as `vitkit eval` reads it, so the run's own test
    figure and eval's agree (converting after resizing differed by one image in 392)."""
    from vitkit.data.sources import load_split
    from vitkit.train.assemble import load_splits

    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for name in ("a", "b"):
            (tmp_path / "data" / split / name).mkdir(parents=True)
            for i in range(3):
                pixels = rng.integers(0, 256, (13, 11, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / "data" / split / name / f"{i}.png")
    uri = f"folder:{tmp_path / 'data'}"
    splits = load_splits(tiny_config(tmp_path / "run", f"data.uri={uri}"))
    as_eval = load_split(uri, "test", image_size=8, channels=1)
    assert splits.test.images.shape == (6, 1, 8, 8)
    assert torch.equal(splits.test.images, as_eval.images) and torch.equal(splits.test.labels, as_eval.labels)


def test_a_folder_one_level_too_high_names_the_folder_its_classes_are_in(tmp_path: Path) -> None:
    """DIR/mydata/{cat,dog}/*.png given as folder:DIR is one class, "mydata": the refusal pointed a newcomer to
    pretrain-mpp, not to the folder whose sub-folders are the classes."""
    _images(tmp_path / "toodeep" / "mydata")
    with pytest.raises(ValueError) as refused:
        resolve(Request(data=f"folder:{tmp_path / 'toodeep'}", out=str(tmp_path / "run")))
    message = str(refused.value)
    inner = tmp_path / "toodeep" / "mydata"
    assert "has 1 class(es)" in message and message.endswith(f"one level down: folder:{inner}")
    _images(tmp_path / "flat", classes=("only",))  # one class of images alone: no such hint
    with pytest.raises(ValueError) as refused:
        resolve(Request(data=f"folder:{tmp_path / 'flat'}", out=str(tmp_path / "run2")))
    assert "one level down" not in str(refused.value)


def test_a_recipe_batch_above_a_small_set_shrinks_to_it(tmp_path: Path) -> None:
    """small-64px's batch of 128 on 20 images made one step 6.4 epochs, so --epochs 1 trained 6; a batch the
    user sets is still refused above the set."""
    _images(tmp_path / "small")
    plan = resolve(Request(data=f"folder:{tmp_path / 'small'}", out=str(tmp_path / "run"), epochs=1.0))
    assert plan.config.data.batch_size == plan.info.num_train < 128
    with pytest.raises(ValueError, match="is larger than the"):
        resolve(Request(data=f"folder:{tmp_path / 'small'}", out=str(tmp_path / "run2"), batch_size=64))
    with pytest.raises(ValueError, match="is larger than the"):  # the user's, though the recipe's value
        resolve(Request(data=f"folder:{tmp_path / 'small'}", out=str(tmp_path / "run2"), batch_size=128))
    _images(tmp_path / "big", count=40)  # 80 images, 2 labelled a class: the 4 trained on, not the 80
    few = resolve(Request(data=f"folder:{tmp_path / 'big'}", out=str(tmp_path / "run3"), labels_per_class=2))
    assert few.config.data.batch_size == 4
