"""optim.light_below_epochs / heavy_from_epochs (train/short_run.py): the decision follows the epochs that fit,
is applied in place (compiled graphs stay valid), trains exactly as the lighter or heavier config would, and a
resumed run keeps it."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import DIGITS, FakeTime, tiny_config
from vitkit.models import build_model
from vitkit.models.configs import HybridConfig, ViTConfig
from vitkit.models.vit import drop_path_rates
from vitkit.runs import RunDir
from vitkit.train import compiled, estimate, short_run, trainer
from vitkit.train.plan import make_plan


def _vit(**fields) -> torch.nn.Module:
    return build_model(ViTConfig(img_size=16, patch_size=4, in_chans=1, num_classes=3, hidden_size=16, depth=3,
                                 num_heads=2, mlp_dim=32, pool="gap", **fields))


def test_drop_path_rates_change_in_place_and_stay_out_of_the_state_dict() -> None:
    model = _vit(drop_path=0.4)
    assert [float(b.drop_path.rate) for b in model.blocks] == pytest.approx([0.0, 0.2, 0.4])
    assert not any("rate" in key for key in model.state_dict())  # checkpoints keep their keys
    x = torch.randn(8, 1, 16, 16)
    reference = model.eval().forward_features(x)  # (the head is zero-initialised)
    model.train()
    assert not torch.allclose(model.forward_features(x), reference)  # branches dropped at random
    model.set_drop_path(0.0)
    assert torch.equal(model.forward_features(x), reference)  # no dropout of any kind left: training == evaluation
    model.set_drop_path(0.2)
    assert [float(b.drop_path.rate) for b in model.blocks] == pytest.approx(drop_path_rates(0.2, 3))
    with pytest.raises(ValueError, match="built without it"):
        _vit().set_drop_path(0.1)


def test_a_decision_taken_again_overrides_the_first_in_place() -> None:
    config = tiny_config(Path("/unused"), "model.drop_path=0.2", "augment.pad=2")
    model = build_model(config.model)
    rates = lambda: [float(b.drop_path.rate) for b in model.blocks]  # noqa: E731
    built = rates()
    assert short_run.apply(config, "heavy", model).model.drop_path == pytest.approx(0.4)
    assert rates() == pytest.approx(drop_path_rates(0.4, len(built)))
    again = short_run.apply(config, "configured", model)  # from the configured config, not the heavier one
    assert again is config and rates() == pytest.approx(built)
    assert short_run.apply(config, "light", model).augment.pad == 1 and rates() == [0.0] * len(built)


@pytest.mark.skipif(compiled.cpp_compiler() is None, reason="torch.compile on the CPU needs a C++ compiler")
def test_a_compiled_model_follows_the_new_rate_without_recompiling() -> None:
    model = _vit(drop_path=0.5).train()
    x = torch.randn(8, 1, 16, 16)
    with torch.no_grad():
        reference = model.eval().forward_features(x)  # (the head is zero-initialised)
        model.train()
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        fast = torch.compile(model.forward_features, dynamic=False)
        assert not torch.allclose(fast(x), reference, atol=1e-5)
        model.set_drop_path(0.0)
        torch.testing.assert_close(fast(x), reference, rtol=1e-5, atol=1e-5)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1


def _plan(epochs_fit: float, **run: object):
    config = tiny_config(Path("/unused"), "optim.light_below_epochs=55", "optim.heavy_from_epochs=70")
    plan = make_plan(config, DIGITS.num_train)
    return config, dataclasses.replace(plan, measured={"fit_epochs": epochs_fit}, **run)


def _optim(config, **fields):
    return dataclasses.replace(config, optim=dataclasses.replace(config.optim, **fields))


def test_the_decision_follows_the_epochs_that_fit() -> None:
    cpu = torch.device("cpu")
    config, budgeted = _plan(40.0, budget_minutes=30.0)
    tiers = {fit: short_run.decide(config, _plan(fit, budget_minutes=30.0)[1], None, cpu)
             for fit in (40.0, 54.9, 55.0, 69.9, 70.0, 85.0)}
    assert tiers == {40.0: "light", 54.9: "light", 55.0: "configured", 69.9: "configured", 70.0: "heavy",
                     85.0: "heavy"}
    assert short_run.decide(config, budgeted, "heavy", cpu) == "heavy"  # a resumed run keeps its first decision
    assert short_run.decide(config, budgeted, False, cpu) == "configured"  # as stored before session 42: a bool
    assert short_run.decide(config, budgeted, True, cpu) == "light"
    unbudgeted = _plan(40.0)[1]  # no budget: the planned epochs (10 steps of 32 here: 0.2) decide
    assert short_run.planned_epochs(unbudgeted) == pytest.approx(10 * 32 / DIGITS.num_train)
    off = _optim(config, light_below_epochs=0.0, heavy_from_epochs=0.0)
    assert short_run.decide(off, budgeted, "light", cpu) is None and short_run.describe(off, budgeted, None) == ""
    only_heavy = _optim(config, light_below_epochs=0.0)
    assert short_run.decide(only_heavy, budgeted, None, cpu) == "configured"
    assert short_run.describe(config, budgeted, "light") == (
        "lighter regularisation for a short run (about 40 epochs fit, fewer than optim.light_below_epochs=55): "
        "stochastic depth 0, pad-crop 0 px instead of stochastic depth 0, pad-crop 1 px")
    long = _plan(85.0, budget_minutes=30.0)[1]
    assert short_run.describe(config, long, "configured") == (
        "regularisation as configured (about 85 epochs fit, not fewer than optim.light_below_epochs=55, fewer than "
        "optim.heavy_from_epochs=70): stochastic depth 0, pad-crop 1 px")
    assert short_run.describe(only_heavy, long, "heavy").startswith(
        "heavier regularisation for a long run (about 85 epochs fit, at least optim.heavy_from_epochs=70): ")


def test_thresholds_are_checked() -> None:
    config = _plan(40.0)[0]
    with pytest.raises(ValueError, match="must not be below light_below_epochs"):
        _optim(config, light_below_epochs=50.0, heavy_from_epochs=40.0)
    with pytest.raises(ValueError, match=">= 0"):
        _optim(config, heavy_from_epochs=-1.0)


def test_lighter_config_has_no_stochastic_depth_and_half_the_pad() -> None:
    config = tiny_config(Path("/unused"), "model.drop_path=0.1", "augment.pad=4")
    light = short_run.lighter(config)
    assert light.model.drop_path == 0.0 and light.augment.pad == 2
    assert dataclasses.replace(light, model=config.model, augment=config.augment) == config  # nothing else moves
    vit = dataclasses.replace(config.model, drop_path=0.1, patch_size=1)
    hybrid = dataclasses.replace(config, model=HybridConfig(vit=vit, resnet_layers=()))  # stride 4: 8 px works
    assert short_run.lighter(hybrid).model.vit.drop_path == 0.0
    heavy = short_run.heavier(config)
    assert heavy.model.drop_path == pytest.approx(0.2) and heavy.augment == config.augment
    assert dataclasses.replace(heavy, model=config.model) == config
    assert short_run.heavier(hybrid).model.vit.drop_path == pytest.approx(0.2)
    assert short_run.fitted(config, "configured") is config and short_run.fitted(config, None) is config


def test_a_lightened_run_trains_exactly_as_the_lighter_config(tmp_path: Path) -> None:
    """Stochastic depth 0.3 and pad 2 lightened in place == a run configured with 0 and pad 1 (same weights)."""
    common = ("data.steps=6", "model.dropout=0", "run.checkpoint_every=3")
    result = trainer.train(tiny_config(tmp_path / "rule", *common, "model.drop_path=0.3", "augment.pad=2",
                                       "optim.light_below_epochs=1000"))
    assert result["plan"]["regularisation"].startswith("lighter regularisation for a short run")
    assert "pad-and-crop (1 px)" in result["plan"]["augment"]
    trainer.train(tiny_config(tmp_path / "plain", *common, "model.drop_path=0", "augment.pad=1"))
    final = [_final(tmp_path / run) for run in ("rule", "plain")]
    assert final[0].keys() == final[1].keys()
    assert all(torch.equal(value, final[1][key]) for key, value in final[0].items())
    run = RunDir(tmp_path / "rule")
    assert RunDir.read_state(run.latest())["short_run"] == "light"  # stored: a resumed run keeps the decision
    configured = trainer.train(tiny_config(tmp_path / "configured", *common, "model.drop_path=0.3", "augment.pad=2",
                                           "optim.light_below_epochs=0.01"))
    assert configured["plan"]["regularisation"].startswith("regularisation as configured")
    assert not torch.equal(_final(tmp_path / "configured")["head.weight"], final[0]["head.weight"])


def test_a_heavier_run_trains_exactly_as_the_heavier_config(tmp_path: Path) -> None:
    """Stochastic depth 0.15 doubled in place == a run configured with 0.3 (same weights, same random draws)."""
    common = ("data.steps=6", "model.dropout=0", "augment.pad=2", "run.checkpoint_every=3")
    result = trainer.train(tiny_config(tmp_path / "rule", *common, "model.drop_path=0.15",
                                       "optim.heavy_from_epochs=0.01"))
    assert result["plan"]["regularisation"].startswith("heavier regularisation for a long run")
    assert result["plan"]["regularisation"].endswith("stochastic depth 0.3, pad-crop 2 px instead of "
                                                     "stochastic depth 0.15, pad-crop 2 px")
    trainer.train(tiny_config(tmp_path / "plain", *common, "model.drop_path=0.3"))
    trainer.train(tiny_config(tmp_path / "as-built", *common, "model.drop_path=0.15"))
    rule, plain, built = (_final(tmp_path / run) for run in ("rule", "plain", "as-built"))
    assert all(torch.equal(value, plain[key]) for key, value in rule.items())
    assert not torch.equal(rule["head.weight"], built["head.weight"])  # the rate made a difference
    assert RunDir.read_state(RunDir(tmp_path / "rule").latest())["short_run"] == "heavy"


def _final(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run / "checkpoints" / "final" / "model.safetensors"))


def test_under_a_budget_the_measured_epochs_decide(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(trainer, "time", FakeTime())
    budget = ("data.steps=1000000", "run.max_minutes=0.02", "model.drop_path=0.2")  # a million steps planned
    result = trainer.train(tiny_config(tmp_path / "few", *budget, "optim.light_below_epochs=50"))
    fit = result["plan"]["measured"]["fit_epochs"]
    assert fit < 50 < result["plan"]["epochs"] and "lighter" in result["plan"]["regularisation"]


def test_the_first_real_steps_check_the_estimate_and_decide_again(tmp_path: Path, monkeypatch, caplog) -> None:
    """A rehearsal that times forward + backward only (0.01 s a pass here) promises ~67 epochs in 30 s: heavy.
    Real steps take ~6x as long (the optimiser and the batch; here a slowed train_step): the check measures
    that, the estimate falls to what the run then trains, and the decision becomes light."""
    clock = FakeTime()
    monkeypatch.setattr(trainer, "time", clock)
    monkeypatch.setattr(estimate, "time", FakeTime())  # every rehearsed pass: one 0.01-s tick
    real_step = trainer.train_step

    def slow_step(*args, **kwargs):
        clock.now += 0.05
        return real_step(*args, **kwargs)

    monkeypatch.setattr(trainer, "train_step", slow_step)
    rule = ("optim.light_below_epochs=20", "optim.heavy_from_epochs=40", "model.drop_path=0.2", "run.log_every=1000")
    with caplog.at_level(logging.INFO, logger="vitkit.train.trainer"):
        result = trainer.train(tiny_config(tmp_path / "run", "data.steps=1000000", "run.max_minutes=0.5", *rule))
    measured, trained = result["plan"]["measured"], result["epoch"]
    assert measured["checked"]["rehearsal"]["fit_epochs"] >= 40  # the rehearsal alone: heavy
    assert measured["checked"]["steps"] == [5, 5 + 90]  # 3% of the budget (0.9 s) at 0.01 s a step
    assert measured["checked"]["overhead_ms"] > 40  # the 50 ms the slowed step adds, and the loop's own ticks
    assert trained < 20 and abs(measured["fit_epochs"] - trained) < 0.05 * trained  # the checked estimate: what ran
    assert result["plan"]["regularisation"].startswith("lighter regularisation for a short run")
    assert RunDir.read_state(RunDir(tmp_path / "run").latest())["short_run"] == "light"
    assert any(line.startswith("speed check over steps 5-95") for line in caplog.messages)
