"""TrainConfig: --set overrides are type-checked, unknown keys are errors, config.json round-trips."""

from __future__ import annotations

import dataclasses
import json

import pytest

from vitkit.data.sources import SourceInfo
from vitkit.ssl.masked_patch import MPPConfig
from vitkit.train.config import TrainConfig, apply_overrides, from_dict, to_dict
from vitkit.train.plan import HostChoices, make_plan
from vitkit.train.plan_text import plan_lines
from vitkit.train.recipes import auto_recipe_name, get_recipe

INFO = SourceInfo(uri="digits", num_train=1438, num_classes=10, image_size=8, channels=1, in_memory=True)


def test_overrides_parse_each_type() -> None:
    config = apply_overrides(
        get_recipe("small-8px-tiny", INFO),
        [
            "optim.warmup_steps=500",
            "optim.lr=3e-4",
            "data.strict=true",
            "optim.schedule=linear",
            "optim.betas=0.8,0.99",
            "augment.randaugment=2,9",
            "augment.randaugment=none",
            "model.depth=3",
            "data.uri=digits",
            "optim.lr_sweep=0.001,0.01",
        ],
    )
    assert config.optim.warmup_steps == 500 and isinstance(config.optim.warmup_steps, int)
    assert config.optim.lr == 3e-4 and config.data.strict is True and config.optim.schedule == "linear"
    assert config.optim.betas == (0.8, 0.99) and config.augment.randaugment is None
    assert config.model.depth == 3 and config.optim.lr_sweep == (0.001, 0.01)


@pytest.mark.parametrize(
    "item, message",
    [
        ("optim.warmup_steps=abc", "expected int"),
        ("optim.nope=1", "unknown field"),
        ("nope.lr=1", "unknown key"),
        ("optim.schedule=cubic", "must be one of"),
        ("data.strict=maybe", "expected true or false"),
        ("run.compile=true", "must be one of auto, on, off"),
        ("optim.betas=0.9", "expected 2 comma-separated"),
        ("optim.lr", "expected group.field=value"),
        ("model.hidden_size=33", "not divisible"),  # the dataclass's own validation still runs
        ("optim.lr=-1", "lr > 0"),
        ("optim.lr=nan", "expected a finite number"),
        ("run.max_minutes=inf", "expected a finite number"),
        ("run.checkpoint_minutes=-1", r"checkpoint_minutes must be >= 0 \(0: off\)"),
        ("data.workers=100000", r"0 <= workers <= 256"),  # had passed, to fork as many processes
        ("optim.warmup_steps=-1", r"warmup_max_steps >= 0; got [\d.]+, -1, \d+"),  # the value given, not only the rule
        ("run.log_every=0", r"nan_patience must be >= 1; got \d+, 0, \d+"),
    ],
)
def test_bad_overrides_are_clear_errors(item: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        apply_overrides(get_recipe("small-8px-tiny", INFO), [item])


def test_fields_of_one_group_change_together() -> None:
    base = get_recipe("small-8px-tiny", INFO)  # batch_size and micro_batch_size are checked against each other
    config = apply_overrides(base, ["data.batch_size=64", "optim.lr=1e-3", "data.micro_batch_size=16"])
    assert (config.data.batch_size, config.data.micro_batch_size) == (64, 16)
    assert from_dict(json.loads(json.dumps(to_dict(config)))) == config
    with pytest.raises(ValueError, match="not a multiple"):
        apply_overrides(base, ["data.batch_size=64", "data.micro_batch_size=24"])


def test_fields_of_several_groups_are_checked_together_in_any_order() -> None:
    """A check across groups sees every --set, whatever order they were given in."""
    base = get_recipe("small-32px-tiny", INFO)  # a Muon recipe, and FSDP refuses Muon
    assert base.optim.name == "muon"
    for order in (["run.parallel=fsdp", "optim.name=adamw"], ["optim.name=adamw", "run.parallel=fsdp"]):
        config = apply_overrides(base, order)
        assert (config.run.parallel, config.optim.name) == ("fsdp", "adamw")
    mpp = dataclasses.replace(config, mpp=MPPConfig(), run=dataclasses.replace(config.run, parallel="ddp"))
    with pytest.raises(ValueError, match="masked patch prediction .* not supported with run.parallel='fsdp'"):
        apply_overrides(mpp, ["run.parallel=fsdp"])  # its gathered checkpoint had failed to load into the encoder


def test_removed_fields_of_a_stored_run_are_read_where_neutral() -> None:
    """A config.json written before options were removed still reads where they did nothing; where they did,
    the error says what was removed.  run.compile's old booleans read as on / off."""
    stored = to_dict(get_recipe("small-8px-tiny", INFO))
    old = {
        **stored,
        "data": {**stored["data"], "resolutions": [], "resolution_until": [], "patch_dropout_later": []},
        "optim": {**stored["optim"], "ema_warmup": False, "light_below_epochs": 0.0},
        "run": {**stored["run"], "compile": True},
    }
    config = from_dict(json.loads(json.dumps(old)))
    assert config.run.compile == "on" and config == dataclasses.replace(
        get_recipe("small-8px-tiny", INFO), run=dataclasses.replace(config.run, compile="on")
    )
    moved = {**stored, "data": {**stored["data"], "patch_dropout_until": 0.8}}  # PatchDropout's settings: one group
    assert from_dict(json.loads(json.dumps(moved))).model.patch_dropout_until == 0.8
    with pytest.raises(ValueError, match="moved to model.patch_dropout_until"):
        apply_overrides(get_recipe("small-8px-tiny", INFO), ["data.patch_dropout_until=0.5"])
    with pytest.raises(ValueError, match="progressive resolution was removed"):
        from_dict({**stored, "data": {**stored["data"], "resolutions": [4], "resolution_until": [0.5]}})
    with pytest.raises(ValueError, match="run.compile must be auto, on or off"):
        dataclasses.replace(config.run, compile="maybe")


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

    assert [auto_recipe_name(info(s)) for s in (8, 28, 32, 200)] == [
        "small-8px",
        "small-28px",
        "small-32px",
        "small-64px",
    ]


def test_the_plan_states_the_patch_dropout_phase() -> None:
    plan = make_plan(apply_overrides(get_recipe("small-32px", INFO), ["model.patch_dropout_until=0.6"]), num_train=1000)
    assert plan.patch_dropout == (0.75, 0.6) and plan.to_dict()["patch_dropout"] == [0.75, 0.6]
    assert "PatchDropout: 0.75 until 60%, then every patch" in plan_lines(plan)
    plain = make_plan(apply_overrides(get_recipe("small-32px", INFO), ["model.patch_dropout=0"]), num_train=1000)
    assert plain.patch_dropout == (0.0, 1.0) and not any("PatchDropout" in line for line in plan_lines(plain))
    content = make_plan(apply_overrides(get_recipe("small-32px", INFO), ["model.patch_dropout_keep=content"]), 1000)
    assert content.to_dict()["patch_dropout_keep"] == "content" and plan.patch_dropout_keep == "random"
    assert "PatchDropout (patches with content kept first): 0.75 until 80%, then every patch" in plan_lines(content)
    small = make_plan(get_recipe("small-28px", INFO), num_train=1000)  # small-28px: every patch from 70% on
    assert small.patch_dropout == (0.75, 0.7) and small.patch_dropout_keep == "content"


def test_the_plan_says_what_the_host_chose_and_why() -> None:
    choices = HostChoices(
        host="host: AMD EPYC (AVX2, no native bf16), 2 thread(s)",
        precision="fp32",
        precision_reason="auto: this CPU has no native bf16",
        compiled=False,
        compile_reason="auto: ~2 s of eager training ...",
    )
    lines = plan_lines(make_plan(get_recipe("small-28px", INFO), num_train=1000, choices=choices))
    assert "host: AMD EPYC (AVX2, no native bf16), 2 thread(s)" in lines
    assert "precision fp32 (auto: this CPU has no native bf16)" in lines
    assert "torch.compile: off (auto: ~2 s of eager training ...)" in lines
    gray = apply_overrides(get_recipe("small-28px", INFO), ["model.in_chans=1"])  # a probe that saw gray images only
    assert plan_lines(make_plan(gray, num_train=1000))[0].endswith("at 28px, 1 channel (grayscale)")
    colour = apply_overrides(get_recipe("small-28px", INFO), ["model.in_chans=3"])
    assert "channel" not in plan_lines(make_plan(colour, num_train=1000))[0]


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
    cosine = make_plan(
        apply_overrides(get_recipe("small-28px", INFO), ["optim.schedule=cosine", "optim.end_lr_fraction=0.1"]), 1000
    )
    flat = make_plan(apply_overrides(get_recipe("small-28px", INFO), ["optim.schedule=constant"]), 1000)
    assert (linear.decay, cosine.decay, flat.decay) == (
        "linear decay to 0",
        "cosine decay to 10% of the peak",
        "constant after warmup",
    )
    line = next(line for line in plan_lines(linear) if line.startswith("learning rate:"))
    assert line == (
        "learning rate: lr 0.002 at global batch 128 (as set, not rescaled with the batch size), "
        f"linear decay to 0; {linear.optimizer}"
    )


def test_the_plan_names_polyak_averaging_and_warns_where_the_run_is_too_short_for_it() -> None:
    """0.999 over 105 steps still weighs the starting weights 0.999^105 = 90%: warned, with a decay that fits."""

    def lines(*overrides: str) -> list[str]:
        return plan_lines(make_plan(apply_overrides(get_recipe("small-28px", INFO), list(overrides)), num_train=1000))

    short = lines("optim.ema_decay=0.999", "data.steps=105")
    named = "Polyak averaging: decay 0.999 (about the last 1,000 steps); the evaluations and the final model use"
    assert named + " the average" in short
    warning = [line for line in short if line.startswith("warning: after 105 steps")]
    assert warning == [
        "warning: after 105 steps the average still gives 90% of its weight to the starting weights; "
        "a run this short wants optim.ema_decay <= 0.971 or none"
    ]
    long = lines("optim.ema_decay=0.999", "data.steps=5000")  # 0.999^5000 = 0.7%
    assert any(line.startswith("Polyak averaging") for line in long) and not any("starting weights" in x for x in long)
    assert not any("Polyak" in line for line in lines("data.steps=105"))
    # under a time budget, the steps it holds: 5000 planned, 105 fit (the warning had said 5000 and stayed silent)
    budgeted = make_plan(apply_overrides(get_recipe("small-28px", INFO), ["optim.ema_decay=0.999", "data.steps=5000"]),
                         num_train=1000)  # fmt: skip
    budgeted = dataclasses.replace(budgeted, measured={**budgeted.measured, "fit_steps": 105, "fit_epochs": 13.4})
    from vitkit.train.plan_text import _average_lines

    assert _average_lines(budgeted)[1].startswith("warning: after 105 steps the average still gives 90%")
    starved = dataclasses.replace(budgeted, measured={**budgeted.measured, "fit_steps": 0})
    assert len(_average_lines(starved)) == 1  # not "after 0 steps ... optim.ema_decay <= 0"


def test_the_parameter_count_of_a_mimetic_model_skips_its_svds(monkeypatch) -> None:
    """Counting for the plan had built the model twice with mimetic init: 16 s of SVDs on a loaded 2-core host."""
    import vitkit.models.vit as vit_module
    from vitkit.models import build_model
    from vitkit.train.plan import count_params

    config = get_recipe("small-32px", SourceInfo("folder:x", 600, 10, 32, 3, True)).model
    assert config.init == "mimetic"
    built = sum(p.numel() for p in build_model(config).parameters())

    def refused(blocks):
        raise AssertionError("mimetic init ran to count parameters")

    monkeypatch.setattr(vit_module, "mimetic_init_", refused)
    assert count_params(config) == built == 1_806_154
