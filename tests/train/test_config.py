"""TrainConfig: --set overrides are type-checked, unknown keys are errors, config.json round-trips."""

from __future__ import annotations

import json

import pytest

from vitkit.data.sources import SourceInfo
from vitkit.train.config import TrainConfig, apply_overrides, from_dict, to_dict
from vitkit.train.plan import make_plan, plan_lines
from vitkit.train.recipes import auto_recipe_name, get_recipe

INFO = SourceInfo(uri="digits", num_train=1438, num_classes=10, image_size=8, channels=1, in_memory=True)


def test_overrides_parse_each_type() -> None:
    config = apply_overrides(get_recipe("small-8px-tiny", INFO), [
        "optim.warmup_steps=500", "optim.lr=3e-4", "run.compile=true", "optim.schedule=linear",
        "optim.betas=0.8,0.99", "augment.randaugment=2,9", "augment.randaugment=none", "model.depth=3",
        "data.uri=digits", "optim.lr_sweep=0.001,0.01",
    ])
    assert config.optim.warmup_steps == 500 and isinstance(config.optim.warmup_steps, int)
    assert config.optim.lr == 3e-4 and config.run.compile is True and config.optim.schedule == "linear"
    assert config.optim.betas == (0.8, 0.99) and config.augment.randaugment is None
    assert config.model.depth == 3 and config.optim.lr_sweep == (0.001, 0.01)


@pytest.mark.parametrize("item, message", [
    ("optim.warmup_steps=abc", "expected int"),
    ("optim.nope=1", "unknown field"),
    ("nope.lr=1", "unknown key"),
    ("optim.schedule=cubic", "must be one of"),
    ("run.compile=maybe", "expected true or false"),
    ("optim.betas=0.9", "expected 2 comma-separated"),
    ("optim.lr", "expected group.field=value"),
    ("model.hidden_size=33", "not divisible"),  # the dataclass's own validation still runs
    ("optim.lr=-1", "lr > 0"),
])
def test_bad_overrides_are_clear_errors(item: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        apply_overrides(get_recipe("small-8px-tiny", INFO), [item])


def test_fields_of_one_group_change_together() -> None:
    base = get_recipe("small-8px-tiny", INFO)  # resolutions and resolution_until are checked against each other
    config = apply_overrides(base, ["data.resolutions=4,6", "optim.lr=1e-3", "data.resolution_until=0.3,0.6"])
    assert config.data.resolutions == (4, 6) and config.data.resolution_until == (0.3, 0.6)
    assert from_dict(json.loads(json.dumps(to_dict(config)))) == config
    for bad in (["data.resolutions=4,6", "data.resolution_until=0.3"],  # one bound per phase
                ["data.resolutions=4,6", "data.resolution_until=0.6,0.3"],  # increasing
                ["data.resolutions=4", "data.resolution_until=1.5"],  # within (0, 1]
                ["data.resolutions=0", "data.resolution_until=0.5"]):
        with pytest.raises(ValueError, match="resolution"):
            apply_overrides(base, bad)
    stepped = ["data.patch_dropout_until=0.5", "data.patch_dropout_later=0.5,0.25", "data.patch_dropout_later_until=0.7,0.9"]
    assert apply_overrides(base, stepped).data.patch_dropout_later_until == (0.7, 0.9)
    for bad in (["data.patch_dropout_later=0.5"],  # one bound per phase
                ["data.patch_dropout_until=0.5", "data.patch_dropout_later=0.5", "data.patch_dropout_later_until=0.4"],
                ["data.patch_dropout_until=0.5", "data.patch_dropout_later=1.0", "data.patch_dropout_later_until=0.9"]):
        with pytest.raises(ValueError, match="patch_dropout_later"):
            apply_overrides(base, bad)


def test_to_dict_from_dict_round_trip() -> None:
    for name in ("paper-pretrain", "paper-finetune-tiny", "small-32px"):
        config = get_recipe(name, INFO)
        data = json.loads(json.dumps(to_dict(config)))
        assert from_dict(data) == config
    with pytest.raises(ValueError, match="unknown field"):
        from_dict({**to_dict(TrainConfig()), "optim": {"bogus": 1}})


def test_auto_recipe_by_resolution() -> None:
    def info(side: int) -> SourceInfo:
        return SourceInfo(uri="digits", num_train=100, num_classes=2, image_size=side, channels=3, in_memory=True)

    assert [auto_recipe_name(info(s)) for s in (8, 28, 32, 200)] == ["small-8px", "small-28px", "small-32px", "small-64px"]


def test_the_plan_states_the_patch_dropout_phases() -> None:
    stepped = ["data.patch_dropout_until=0.6", "data.patch_dropout_later=0.5", "data.patch_dropout_later_until=0.9"]
    plan = make_plan(apply_overrides(get_recipe("small-32px", INFO), stepped), num_train=1000)
    assert plan.patch_dropout_phases == ((0.75, 0.6), (0.5, 0.9))
    assert "PatchDropout: 0.75 until 60%, 0.5 until 90%, then every patch" in plan_lines(plan)
    assert plan.to_dict()["patch_dropout_phases"] == [[0.75, 0.6], [0.5, 0.9]]
    plain = make_plan(apply_overrides(get_recipe("small-32px", INFO), ["model.patch_dropout=0"]), num_train=1000)
    assert "patch_dropout_phases" not in plain.to_dict() and not any("PatchDropout" in line for line in plan_lines(plain))
    content = make_plan(apply_overrides(get_recipe("small-32px", INFO), ["model.patch_dropout_keep=content"]), 1000)
    assert content.to_dict()["patch_dropout_keep"] == "content" and plan.patch_dropout_keep == "random"
    assert "PatchDropout (patches with content kept first): 0.75 until 80%, then every patch" in plan_lines(content)
    small = make_plan(get_recipe("small-28px", INFO), num_train=1000)  # small-28px: every patch from 70% on
    assert small.patch_dropout_phases == ((0.75, 0.7),) and small.patch_dropout_keep == "content"


def test_the_plan_says_when_evaluation_averages_an_image_and_its_mirror() -> None:
    plain = make_plan(get_recipe("small-28px", INFO), num_train=1000)
    views = make_plan(apply_overrides(get_recipe("small-28px", INFO), ["eval.flip_views=true"]), num_train=1000)
    assert not plain.flip_views and views.flip_views and views.to_dict()["flip_views"] is True
    assert not any("mirror image, logits averaged" in line for line in plan_lines(plain))
    assert any("each image and its mirror image, logits averaged" in line for line in plan_lines(views))


def test_the_plan_names_muons_own_learning_rate_factor() -> None:
    plain = make_plan(get_recipe("small-28px", INFO), num_train=1000)
    scaled = make_plan(apply_overrides(get_recipe("small-28px", INFO), ["optim.muon_lr_scale=2"]), num_train=1000)
    assert plain.optimizer == "muon (encoder matrices) + adamw (embeddings, norms, biases, head)"
    assert scaled.optimizer == "muon (encoder matrices, lr x 2) + adamw (embeddings, norms, biases, head)"
    assert any(line.endswith(scaled.optimizer) for line in plan_lines(scaled)) and scaled.lr == plain.lr


def test_the_plan_names_the_learning_rates_decay() -> None:
    linear = make_plan(get_recipe("small-28px", INFO), num_train=1000)
    cosine = make_plan(apply_overrides(get_recipe("small-28px", INFO), ["optim.schedule=cosine",
                                                                      "optim.end_lr_fraction=0.1"]), 1000)
    flat = make_plan(apply_overrides(get_recipe("small-28px", INFO), ["optim.schedule=constant"]), 1000)
    assert (linear.decay, cosine.decay, flat.decay) == (
        "linear decay to 0", "cosine decay to 10% of the peak", "constant after warmup")
    line = next(line for line in plan_lines(linear) if line.startswith("learning rate:"))
    assert line == ("learning rate: lr 0.002 at global batch 128 (tuned for this batch; no rescaling), "
                    f"linear decay to 0; {linear.optimizer}")
