"""`vitkit reproduce transfer`: its grid of arms and their budgets, arms built as a user's commands build runs,
few-shot arms that train nothing, and the options recorded in study.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.train.helpers import tiny_config

from vitkit.cli import main
from vitkit.reproduce import StudyRequest, get_study, reproduce
from vitkit.reproduce.study import make_context, prepare_directory
from vitkit.reproduce.transfer_arms import _with_model
from vitkit.train import trainer
from vitkit.train.resolve import Request, resolve

STUDY = get_study("transfer")


def _plan(tmp_path: Path, **changes) -> dict:
    request = StudyRequest(data="digits", out=str(tmp_path / "study"), **changes)
    return {arm.key: arm for arm in STUDY.plan(make_context(STUDY, request))}


def test_the_grid_gives_each_arm_its_budget_in_minutes(tmp_path: Path) -> None:
    arms = _plan(tmp_path, pretrain_data="digits", budget_minutes=375)  # 25 units of 15 minutes
    minutes = {key: arm.config.run.max_minutes for key, arm in arms.items() if arm.units}
    assert sum(minutes.values()) == 375 and minutes["pretrain-vit-s0"] == 60
    assert {minutes[f"{kind}-vit_{n}-s0"] for kind in ("finetune", "scratch") for n in ("10", "100", "all")} == {15}
    assert {minutes[f"scratch-total-vit_{n}-s0"] for n in ("10", "100", "all")} == {75}
    tuned, scratch = arms["finetune-vit_100-s0"].config, arms["scratch-vit_100-s0"].config
    final = str(tmp_path / "study" / "arms" / "pretrain-vit-s0" / "checkpoints" / "final")
    assert tuned.recipe == "finetune-small" and tuned.run.init_from == final and tuned.data.labels_per_class == 100
    assert scratch.recipe == "small-8px" and scratch.run.init_from == "" and scratch.data.epochs == 0  # by the clock
    assert tuned.model.representation_size is None and arms["pretrain-vit-s0"].config.model.num_classes == 10
    assert arms["fewshot-pretrained-vit-s0"].config.run.init_from == final
    assert arms["fewshot-random-vit-s0"].config.run.init_from == "" and arms["fewshot-random-vit-s0"].units == 0


def test_families_add_the_bit_resnet_and_the_hybrid(tmp_path: Path) -> None:
    families = _plan(tmp_path, pretrain_data="digits", budget_minutes=675, families=True)  # 45 units of 15
    assert len(families) == 30 and families["finetune-resnet_all-s0"].config.run.max_minutes == 15
    assert type(families["pretrain-hybrid-s0"].config.model).__name__ == "HybridConfig"


def test_a_bit_resnet_arm_trains_a_muon_recipe_with_its_adamw_part() -> None:
    muon = resolve(Request(recipe="small-28px", out="x")).config  # the recipes above 8 px train with Muon
    resnet, hybrid = _with_model(muon, "resnet").optim, _with_model(muon, "hybrid").optim
    assert muon.optim.name == "muon" and hybrid == muon.optim  # the hybrid's encoder has matrices for Muon
    assert resnet.name == "adamw" and (resnet.lr, resnet.weight_decay) == (muon.optim.lr, muon.optim.weight_decay)


def test_a_given_checkpoint_replaces_the_vit_pre_training(tmp_path: Path) -> None:
    run = tmp_path / "pre"
    trainer.train(tiny_config(run, "data.steps=2"))
    arms = _plan(tmp_path, init=str(run), budget_minutes=315)  # 21 units of 15
    assert "pretrain-vit-s0" not in arms and arms["finetune-vit_10-s0"].config.run.init_from == str(run)
    assert arms["finetune-vit_10-s0"].config.run.max_minutes == 15
    assert arms["fewshot-pretrained-vit-s0"].config.model.img_size == 8  # the checkpoint's own model


def test_tiny_study_trains_each_arm_as_planned(tmp_path: Path) -> None:
    reproduce("transfer", StudyRequest(data="digits", budget_minutes=0.5, out=str(tmp_path), threads=1))
    arms = {r["arm"]: r for r in json.loads((tmp_path / "results.json").read_text())["arms"]}
    assert arms["pretrain-vit"]["step"] == 40 and arms["scratch-total-vit@10"]["step"] == 50  # 4 and 5 units
    assert arms["finetune-vit@10"]["num_train"] == arms["scratch-vit@10"]["num_train"] == 100  # 10 per class
    assert arms["finetune-vit@all"]["num_train"] == 1438 and arms["finetune-vit@all"]["step"] == 10
    pretrained, random = arms["fewshot-pretrained-vit"], arms["fewshot-random-vit"]
    assert pretrained["encoder"].endswith("pretrain-vit-s0/checkpoints/final") and random["encoder"] == "random"
    assert set(pretrained["fewshot"]) == {"10"} and 0 < random["fewshot"]["10"]["mean"] < 1
    assert "tests the mechanics, not transfer" in (tmp_path / "report.md").read_text()


def test_the_transfer_options_are_recorded_and_a_changed_one_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    request = StudyRequest(data="digits", out=str(tmp_path), budget_minutes=375, pretrain_data="digits")
    prepare_directory(STUDY, make_context(STUDY, request))
    stored = json.loads((tmp_path / "study.json").read_text())
    assert (stored["pretrain_data"], stored["init"], stored["families"]) == ("digits", "", False)
    other = StudyRequest(data="digits", out=str(tmp_path), budget_minutes=375, pretrain_data="npz:x.npz")
    with pytest.raises(ValueError, match="planned with pretrain_data='digits'"):
        prepare_directory(STUDY, make_context(STUDY, other))
    assert main(["reproduce", "head", "--families", "--out", str(tmp_path / "h")]) == 2
    assert "only the transfer study takes these flags" in capsys.readouterr().err


def test_the_report_names_time_budget_arms_as_budgets_not_steps() -> None:
    """A study whose arms are time budgets (transfer, above the tiny scale) has no steps per unit arm: the
    report's scale line says the arms are budgets, not that they are the -tiny recipe's steps."""
    from vitkit.reproduce.report import unit_text

    small = {"name": "small", "unit_steps": 0, "unit_minutes": 1.66, "images_per_s": 0.0}
    assert unit_text(small) == "arms are time budgets in minutes, given below"
    assert unit_text({**small, "name": "tiny"}) == "a unit arm is the -tiny recipe's steps"
    stepped = {**small, "unit_steps": 277, "unit_minutes": 0.47, "images_per_s": 1266.4}
    assert unit_text(stepped).startswith("a unit arm is 277 steps, 0.47 min at the 1266.4 images/s")
