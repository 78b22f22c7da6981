"""Schedules and optimiser settings match the paper's numbers (Tables 3-4, App. B.1, B.1.1)."""

from __future__ import annotations

import math

import pytest
import torch

from vitkit.data.sources import SourceInfo
from vitkit.models import build_model
from vitkit.train.assemble import LARGEST_RECIPE_BATCH
from vitkit.train.budget import Budget
from vitkit.train.optim import build_optimizer, is_kernel, param_groups
from vitkit.train.recipes import PAPER_LR_GRID, RECIPES, get_recipe
from vitkit.train.schedule import lr_multiplier, resolve_warmup, scaled_lr

INFO = SourceInfo(uri="digits", num_train=1438, num_classes=10, image_size=8, channels=1, in_memory=True)


def test_linear_warmup_then_linear_decay() -> None:
    # Table 3: 10k warmup steps, then linear decay to 0 at the last step.
    total, warm = 100_000, 10_000
    assert lr_multiplier(0, total, warm, "linear") == pytest.approx(1 / 10_000)
    assert lr_multiplier(4_999, total, warm, "linear") == pytest.approx(0.5)
    assert lr_multiplier(9_999, total, warm, "linear") == pytest.approx(1.0)
    assert lr_multiplier(10_000, total, warm, "linear") == pytest.approx(1.0)
    mid = 10_000 + (total - 1 - 10_000) / 2
    assert lr_multiplier(int(mid), total, warm, "linear") == pytest.approx(
        1 - (int(mid) - 10_000) / (total - 1 - 10_000)
    )
    assert lr_multiplier(total - 1, total, warm, "linear") == pytest.approx(0.0)


def test_cosine_values_and_end_fraction() -> None:
    total, warm = 1001, 0
    assert lr_multiplier(0, total, warm, "cosine") == pytest.approx(1.0)
    assert lr_multiplier(500, total, warm, "cosine") == pytest.approx(0.5)
    assert lr_multiplier(250, total, warm, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_multiplier(1000, total, warm, "cosine") == pytest.approx(0.0, abs=1e-12)
    assert lr_multiplier(1000, total, warm, "cosine", end_fraction=0.1) == pytest.approx(0.1)
    assert lr_multiplier(7, 10, 2, "constant") == 1.0


def test_warmup_resolution_and_scaling_rules() -> None:
    assert resolve_warmup(1000, 0, 0.05) == 50
    # never the whole run: the last step is the decay's, at its end value (a warm-up to the last step had left
    # it at the peak)
    for total in (2, 5, 1000):
        warm = resolve_warmup(total, 10_000, 0.0)
        assert warm == total - 2 and lr_multiplier(total - 1, total, warm, "linear", end_fraction=0.1) == 0.1
        assert lr_multiplier(total - 2, total, warm, "linear") == 1.0  # the peak is reached
    assert resolve_warmup(1, 10_000, 0.0) == 0
    assert scaled_lr(1e-3, 512, 4096, "linear") == pytest.approx(1.25e-4)
    assert scaled_lr(1e-3, 1024, 4096, "sqrt") == pytest.approx(5e-4)
    assert scaled_lr(1e-3, 512, 4096, "none") == 1e-3


def test_paper_pretrain_optimizer_groups() -> None:
    config = get_recipe("paper-pretrain-tiny", INFO)
    assert config.optim.name == "adamw" and config.optim.betas == (0.9, 0.999)
    assert config.optim.weight_decay == 0.1 and config.optim.clip_norm == 1.0
    assert config.optim.schedule == "linear" and config.model.dropout == 0.1
    assert config.model.representation_size == config.model.hidden_size  # pre-logits head (Sec. 3.1)
    assert config.data.batch_size == 4 * config.data.micro_batch_size  # accumulation
    full = get_recipe("paper-pretrain", INFO)
    assert full.data.batch_size == 4096 and full.optim.warmup_steps == 10_000 and full.optim.lr == 1e-3
    model = build_model(config.model)
    optimizer = build_optimizer(model, config.optim, lr=1e-3)
    assert isinstance(optimizer, torch.optim.AdamW)
    groups = {g["name"]: g for g in optimizer.param_groups}
    assert groups["decay"]["weight_decay"] == 0.1 and groups["decay"]["betas"] == (0.9, 0.999)
    assert groups["no_decay"]["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in groups["decay"]["params"]}
    plain = {names[id(p)] for p in groups["no_decay"]["params"]}
    assert "blocks.0.attn.qkv.weight" in decayed and "patch_embed.proj.weight" in decayed and "head.weight" in decayed
    for name in ("pos_embed", "blocks.0.norm1.weight", "blocks.0.attn.qkv.bias", "norm.bias"):
        assert name in plain
    assert decayed | plain == set(names.values()) and not decayed & plain


def test_adamw_equals_flax_adam_weight_decay_formula() -> None:
    # flax.optim.Adam(weight_decay=wd): p <- p - lr * m_hat / (sqrt(v_hat) + eps) - lr * wd * p
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(5, 3))
    grad = torch.randn(5, 3)
    lr, wd = 0.01, 0.1
    start = param.detach().clone()
    optimizer = torch.optim.AdamW([param], lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
    param.grad = grad.clone()
    optimizer.step()
    m_hat = (0.1 * grad) / (1 - 0.9)
    v_hat = (0.001 * grad**2) / (1 - 0.999)
    expected = start - lr * m_hat / (v_hat.sqrt() + 1e-8) - lr * wd * start
    torch.testing.assert_close(param.detach(), expected, rtol=0, atol=1e-6)


def test_paper_finetune_optimizer() -> None:
    config = get_recipe("paper-finetune", INFO)
    assert config.optim.name == "sgd" and config.optim.momentum == 0.9 and config.optim.weight_decay == 0.0
    assert config.optim.schedule == "cosine" and config.optim.clip_norm == 1.0
    assert config.data.batch_size == 512 and config.model.img_size == 384
    assert PAPER_LR_GRID == (0.001, 0.003, 0.01, 0.03)
    tiny = get_recipe("paper-finetune-tiny", INFO)
    optimizer = build_optimizer(build_model(tiny.model), tiny.optim, lr=0.01)
    assert isinstance(optimizer, torch.optim.SGD)
    assert all(g["momentum"] == 0.9 and g["weight_decay"] == 0.0 for g in optimizer.param_groups)


def test_decay_on_all_and_kernel_rule() -> None:
    model = build_model(get_recipe("small-8px-tiny", INFO).model)
    groups = param_groups(model, 0.1, "all")
    assert len(groups) == 1 and groups[0]["weight_decay"] == 0.1
    assert not is_kernel("pos_embed", torch.zeros(1, 5, 4)) and is_kernel("head.weight", torch.zeros(3, 4))


def test_every_recipe_is_complete_and_has_a_tiny_variant() -> None:
    for name in RECIPES:
        config = get_recipe(name, INFO)
        assert config.recipe == name and config.model.num_classes == 10
        assert config.data.batch_size <= LARGEST_RECIPE_BATCH  # a larger one is taken for a hand-edited config
        if not name.endswith("-tiny"):
            assert f"{name}-tiny" in RECIPES
            assert "Command:" in RECIPES[name].__doc__ and "Expected:" in RECIPES[name].__doc__


def test_budget_runs_the_schedule_by_the_clock() -> None:
    clock = Budget(100, 10.0)
    clock.observe(step=10, elapsed_s=1.0)  # steps ahead of the clock: the steps lead
    assert clock.position(10) == 10 and not clock.done(10)
    clock.observe(step=20, elapsed_s=5.0)  # the clock ahead: half the budget = half the schedule
    assert clock.position(20) == pytest.approx(50.0)
    assert clock.position(21) == pytest.approx(54.0)  # between observations: the clock's pace, 40 per 10 steps
    clock.observe(step=21, elapsed_s=0.0)  # never moves back
    assert clock.position(21) == pytest.approx(54.0)
    clock.reserve_s = 2.0  # the final evaluation's share: 8 s usable
    clock.observe(step=30, elapsed_s=6.0)
    assert clock.position(30) == pytest.approx(75.0)
    clock.observe(step=40, elapsed_s=8.0)  # the clock jumped past the end: this step is the last, at the end value
    assert not clock.done(40) and clock.position(40) == 99.0 and clock.done(41)
    assert lr_multiplier(99.0, 100, 0, "cosine") == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="positive"):
        Budget(100, 0.0)


def test_budget_keeps_no_memory_of_an_early_lead() -> None:
    # A slow start (2 s for 1 step) then fast steps: the position follows the clock, not step + the early
    # lead, so a phase mark at 80% of the schedule comes at 80% of the time.
    clock = Budget(100, 10.0)
    clock.observe(step=1, elapsed_s=2.0)
    assert clock.position(1) == pytest.approx(20.0)
    clock.observe(step=40, elapsed_s=4.0)  # 39 steps in 2 s, the clock gained 20: the clock still leads
    assert clock.position(40) == pytest.approx(40.0)  # (an early lead kept would say 59)
    clock.observe(step=60, elapsed_s=7.9)
    assert clock.position(60) == pytest.approx(79.0) and clock.position(60) / 100 < 0.8
    clock.observe(step=61, elapsed_s=8.0)
    assert clock.position(61) == pytest.approx(80.0)
    clock.observe(step=95, elapsed_s=9.0)  # a fast machine: the steps overtake the clock and lead
    assert clock.position(95) == 95 and not clock.done(96) and clock.position(99) == 99 and clock.done(100)
    unbudgeted = Budget(100)
    unbudgeted.observe(step=3, elapsed_s=50.0)
    assert unbudgeted.position(3) == 3 and not unbudgeted.done(4) and unbudgeted.position(99) == 99
    assert unbudgeted.done(100)
    finished = Budget(100, 10.0)  # a run resumed with its budget spent takes no step
    finished.observe(step=60, elapsed_s=10.5)
    assert finished.done(60)


def test_budget_runs_the_last_step_at_the_end_value_when_it_moves_more_than_a_step_per_step() -> None:
    clock = Budget(100, 10.0)
    clock.observe(step=6, elapsed_s=5.4)
    clock.observe(step=10, elapsed_s=9.5)  # ~10 positions a step: after 95, the next step would be at 105
    assert not clock.done(10) and clock.position(10) == 99.0 and clock.done(11)
    assert lr_multiplier(clock.position(10), 100, 0, "linear", end_fraction=0.1) == pytest.approx(0.1)
    steady = Budget(100, 10.0)  # a step per step or less: positions as before
    steady.observe(step=50, elapsed_s=5.0)
    assert steady.position(50) == 50.0 and steady.position(98) == 98.0 and steady.position(99) == 99.0


def test_a_budget_alone_runs_by_the_clock_however_fast_the_steps() -> None:
    """A budgeted run without a length of its own: the step count never leads, the time alone ends the run."""
    clock = Budget(100, 10.0, steps_count=False)
    clock.observe(step=500, elapsed_s=2.0)  # far more steps than the estimated length: still at 20% of the time
    assert clock.position(500) == pytest.approx(20.0) and not clock.done(500)
    clock.observe(step=2400, elapsed_s=9.9)
    assert clock.position(2400) == 99.0  # at the end value: the loop takes no step after it
    with pytest.raises(ValueError, match="length or a time budget"):
        Budget(100, None, steps_count=False)
