"""The Trainer's parts alone: schedule at a position, non-finite guard, checkpointer atomicity, stop policy,
ETA arithmetic; each with fakes (clock, signals, a second process) instead of waiting or forking."""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from vitkit.checkpoints import native
from vitkit.models import build_model
from vitkit.models.configs import ViTConfig
from vitkit.runs import LATEST, RunDir
from vitkit.train import stop as stop_module
from vitkit.train.checkpointer import Checkpointer
from vitkit.train.estimate import SpeedCheck, eta
from vitkit.train.guard import NonFiniteGuard, NonFiniteLossError
from vitkit.train.optim import build_optimizer
from vitkit.train.config import OptimConfig
from vitkit.train.plan import Plan
from vitkit.train.schedule import Schedule
from vitkit.train.state import TrainState
from vitkit.train.stop import SignalFlag, StopPolicy

TINY = ViTConfig(img_size=8, patch_size=4, in_chans=1, num_classes=3, hidden_size=8, depth=1, num_heads=2, mlp_dim=16)


# ------------------------------------------------------------------------------------- schedule
def test_schedule_at_a_position_golden_values() -> None:
    schedule = Schedule(total_steps=101, peak_lr=2.0, warmup_steps=10, kind="cosine", end_fraction=0.1,
                        patch_dropout=0.5, patch_until=0.8, resolutions=(16,), resolution_until=(0.3,), side=28,
                        ema_decay=0.99, ema_warmup=True)
    first = schedule.at(0)
    assert (first.lr, first.patch_dropout, first.side) == (2.0 * 1 / 10, 0.5, 16)  # warmup (step + 1) / 10
    assert first.ema_decay == pytest.approx(1 / 10)  # min(0.99, (1 + 0) / (10 + 0))
    middle = schedule.at(55)  # progress (55 - 10) / (100 - 10) = 0.5: the cosine is at half
    assert middle.lr == pytest.approx(2.0 * (0.1 + 0.9 * 0.5)) and (middle.patch_dropout, middle.side) == (0.5, 28)
    late = schedule.at(81)  # 81 / 101 >= 0.8: every patch from here
    assert late.patch_dropout == 0.0 and late.ema_decay == pytest.approx(min(0.99, 82 / 91))
    assert schedule.at(100).lr == pytest.approx(2.0 * 0.1) and schedule.at(101).lr == pytest.approx(2.0 * 0.1)
    assert schedule.at(100.5) == schedule.at(100.5)  # a pure function of the position
    assert schedule.spans() == [(0.0, 0.3, 16, 0.5), (0.3, 0.8, 28, 0.5), (0.8, 1.0, 28, 0.0)]


def test_stepped_patch_dropout_phases() -> None:
    schedule = Schedule(total_steps=100, peak_lr=1.0, patch_dropout=0.75, patch_until=0.5, patch_later=(0.5,),
                        patch_later_until=(0.9,), resolutions=(16,), resolution_until=(0.7,), side=32)
    assert [schedule.at(p).patch_dropout for p in (0, 49.9, 50, 89.9, 90, 100)] == [0.75, 0.75, 0.5, 0.5, 0.0, 0.0]
    assert schedule.spans() == [(0.0, 0.5, 16, 0.75), (0.5, 0.7, 16, 0.5), (0.7, 0.9, 32, 0.5), (0.9, 1.0, 32, 0.0)]
    assert schedule.phases(start=0.6) == [(0.5, 16), (0.5, 32), (0.0, 32)]  # one compiled graph per phase left


# ---------------------------------------------------------------------------------------- guard
def test_guard_accounts_deferred_flags_and_stops_after_patience() -> None:
    counters = SimpleNamespace(nan_streak=0, skipped_steps=0)
    reports: list[dict] = []
    guard = NonFiniteGuard(counters, patience=3, report=reports.append, last_good=lambda: "run/step_0000002")
    for step, flag in ((1, torch.tensor(False)), (2, torch.tensor(True)), (3, False)):
        guard.observe(step, flag)  # tensors are not read until flush
    assert guard.pending and guard.flush() == [2] and not guard.pending
    assert (counters.nan_streak, counters.skipped_steps) == (0, 1)
    assert reports == [{"step": 2, "split": "train", "skipped": True, "nan_streak": 1}]
    for step in (4, 5):
        guard.observe(step, torch.tensor(True))
    assert guard.flush() == [4, 5] and counters.nan_streak == 2
    guard.observe(6, True)
    with pytest.raises(NonFiniteLossError, match=r"3 consecutive steps, the last at step 6.*run/step_0000002"):
        guard.flush()
    assert counters.skipped_steps == 4


# --------------------------------------------------------------------------------- checkpointer
def _state(seed: int = 0) -> TrainState:
    torch.manual_seed(seed)
    model = build_model(TINY)
    optimizer = build_optimizer(model, OptimConfig(), lr=1e-2)
    model(torch.randn(2, 1, 8, 8)).sum().backward()
    optimizer.step()  # an optimiser state worth saving
    return TrainState(model=model, module=model, optimizer=optimizer, generator=torch.Generator().manual_seed(seed))


def test_checkpointer_round_trip_and_crash_leaves_the_last_one(tmp_path: Path, monkeypatch) -> None:
    run = RunDir(tmp_path / "run")
    saved = _state(0)
    saved.step = 3
    checkpointer = Checkpointer(run, every=3, meta={"class_names": ["a", "b", "c"]}, main=True,
                                extra=lambda: {"data": {"step": 3}})
    assert checkpointer.due(3) and not checkpointer.due(4)
    first = checkpointer.save(saved)
    assert first == run.checkpoints / "step_0000003" and (run.checkpoints / LATEST).read_text() == "step_0000003\n"
    restored, payloads = _state(1), []
    assert checkpointer.restore(restored, load_extra=payloads.append) == first
    assert restored.step == 3 and payloads[0]["data"] == {"step": 3}
    assert all(torch.equal(a, b) for a, b in zip(saved.module.state_dict().values(), restored.module.state_dict().values()))
    assert restored.optimizer.state_dict()["state"][0]["exp_avg"].equal(saved.optimizer.state_dict()["state"][0]["exp_avg"])
    assert torch.equal(restored.generator.get_state(), saved.generator.get_state())

    saved.step = 6  # a crash in the middle of the next save: the rename never happens
    monkeypatch.setattr(os, "replace", lambda *args: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        checkpointer.save(saved)
    monkeypatch.undo()
    assert run.latest() == first and not (run.checkpoints / "step_0000006").exists()
    assert native.load(first).model.state_dict().keys() == saved.module.state_dict().keys()
    saved.step = 9  # the next save cleans the torn temporary directory up
    assert checkpointer.save(saved) == run.checkpoints / "step_0000009"
    assert not list(run.checkpoints.glob(".*.tmp")) and run.latest().name == "step_0000009"


# ---------------------------------------------------------------------------------- stop policy
class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_stop_policy_with_a_fake_clock_and_fake_signals() -> None:
    clock, signals = FakeClock(), SignalFlag()
    policy = StopPolicy(started=100.0, deadline_s=10.0, signals=signals, now=clock)
    assert policy.check() is None
    clock.now = 110.0
    assert policy.check() == "time_budget"
    signals.signum = signal.SIGTERM  # a signal wins over the budget
    assert policy.check() == "interrupted" and policy.signum == signal.SIGTERM
    assert StopPolicy(started=0.0, deadline_s=None, now=lambda: 1e9).check() is None  # no budget: never


def test_processes_agree_only_at_agreement_steps(monkeypatch) -> None:
    peer = {"signalled": False, "out_of_time": False}  # what the other process reports
    asked: list[bool] = []

    def any_true(flag: bool, device: torch.device) -> bool:  # check() asks about the signal, then the time
        asked.append(flag)
        return flag or peer["signalled" if len(asked) % 2 else "out_of_time"]

    monkeypatch.setattr(stop_module.distributed, "any_true", any_true)
    clock = FakeClock()
    policy = StopPolicy(started=100.0, deadline_s=10.0, world=2, now=clock)
    peer["out_of_time"] = True  # the peer is out of time; this process is not
    assert policy.check(agree=False) is None and not asked  # between agreement steps: no collective, no stop
    assert policy.check(agree=True) == "time_budget"  # at one, every process stops together
    peer.update(out_of_time=False, signalled=True)
    assert policy.check(agree=True) == "interrupted"


def test_real_sigterm_is_caught_while_installed_and_handlers_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with StopPolicy(started=0.0, deadline_s=None) as policy:
        os.kill(os.getpid(), signal.SIGTERM)
        assert policy.check() == "interrupted"
    assert signal.getsignal(signal.SIGTERM) == before


# ------------------------------------------------------------------------------------------ ETA
def _plan(**overrides) -> Plan:
    fields = dict(recipe="r", data="d", objective="classification", num_train=1000, params=1, img_size=28,
                  processes=1, global_batch=100, micro_batch=50, accumulation=2, steps=100, epochs=10.0, lr=1.0,
                  base_lr=1.0, base_batch=100, lr_scaling="none", optimizer="adamw", warmup=0, device="cpu",
                  precision="fp32", seed=0, eval_every=0, budget_minutes=0.0, budget_schedule="fit", augment=())
    return Plan(**{**fields, **overrides})


def test_eta_arithmetic_from_measured_phases() -> None:
    schedule = Schedule(total_steps=100, peak_lr=1.0, patch_dropout=0.5, patch_until=0.6, side=28)
    timings = {(0.5, 28): 0.1, (0.0, 28): 0.2}  # seconds per micro-batch of 50 images
    out = eta(_plan(), schedule, timings, eval_images=300)
    step_s = 0.6 * 2 * 0.1 + 0.4 * 2 * 0.2  # 60% of the steps at PatchDropout, 2 micro-batches each
    assert out["step_seconds"] == pytest.approx(step_s, abs=1e-4) and out["images_per_s"] == pytest.approx(100 / step_s, abs=0.1)
    eval_s = 300 * (0.2 / 50) / 3  # one final evaluation, forward only
    assert out["eta_minutes"] == pytest.approx((100 * step_s + eval_s) / 60, abs=0.01)
    fitted = eta(_plan(budget_minutes=1.0), schedule, timings, start_step=20, eval_images=300, budget_left_s=10.0)
    # From step 20 (20% of the schedule) the clock gives the PatchDropout phase (20%-60%) half the time left
    # and the all-patch phase (60%-100%) the other half, each at its own step time.
    usable = 10.0 - eval_s
    fit_steps = 0.5 * usable / (2 * 0.1) + 0.5 * usable / (2 * 0.2)
    assert fitted["fit_epochs"] == pytest.approx((20 + fit_steps) * 100 / 1000, abs=0.05)
    capped = eta(_plan(budget_minutes=1.0), schedule, timings, budget_left_s=3600.0)  # a fast machine: every step
    assert capped["fit_epochs"] == pytest.approx(10.0)
    assert fitted["eta_minutes"] == pytest.approx(10.0 / 60, abs=0.005)  # the budget left, rounded


def test_eta_adds_the_checked_overhead_to_every_phase_and_starts_at_the_clock() -> None:
    schedule = Schedule(total_steps=100, peak_lr=1.0, patch_dropout=0.5, patch_until=0.6, side=28)
    timings = {(0.5, 28): 0.1, (0.0, 28): 0.2}
    out = eta(_plan(), schedule, timings, overhead_s=0.05)
    step_s = 0.6 * (2 * 0.1 + 0.05) + 0.4 * (2 * 0.2 + 0.05)  # the same 0.05 s beyond the passes in each phase
    assert out["step_seconds"] == pytest.approx(step_s, abs=1e-4)
    # The clock (position 0.6) ahead of the steps (20): only the all-patch phase is left, all 10 s for it.
    fitted = eta(_plan(budget_minutes=1.0), schedule, timings, start_step=20, budget_left_s=10.0, position=0.6,
                 overhead_s=0.05)
    assert fitted["fit_epochs"] == pytest.approx((20 + 10.0 / (2 * 0.2 + 0.05)) * 100 / 1000, abs=0.05)
    faster = eta(_plan(), schedule, timings, overhead_s=-1.0)  # a step never counts less than half its passes
    assert faster["step_seconds"] == pytest.approx(0.6 * 0.1 + 0.4 * 0.2, abs=1e-4)


def test_speed_check_times_a_window_of_real_steps_in_one_phase() -> None:
    timings = {(0.5, 28): 0.1, (0.0, 28): 0.2}
    check = SpeedCheck(timings, accumulation=2, start_step=40, step_s=0.5, budget_s=1000.0, total_steps=10_000)
    assert (check.begin, check.end) == (45, 45 + 60)  # 3% of 1000 s = 30 s at 0.5 s a step: 60 steps
    assert SpeedCheck(timings, 1, 0, 0.5, None, 10_000).end == 5 + 120  # no budget: CHECK_SECONDS (60 s)
    assert SpeedCheck(timings, 1, 0, 100.0, None, 10_000).end == 5 + 10  # never fewer than 10 steps
    short = SpeedCheck(timings, 1, 0, 0.001, None, 405)  # a short run: a quarter of the steps after the first 5
    assert short.end == 5 + 100 and short.ends_in(405) and not SpeedCheck(timings, 1, 0, 0.5, None, 15).ends_in(15)
    now, found = 0.0, []
    for step in range(41, 120):  # each real step 0.25 s beyond its two passes of 0.1 s
        now += 2 * 0.1 + 0.25
        found.append(check.observe(step, lambda: now, (0.5, 28)))
    overheads = [value for value in found if value is not None]
    assert overheads == [pytest.approx(0.25)] and found[105 - 41] is not None
    crossing = SpeedCheck(timings, 2, 40, 0.5, 1000.0, 10_000)
    crossing.observe(45, lambda: 1.0, (0.5, 28))
    assert crossing.observe(105, lambda: 20.0, (0.0, 28)) is None  # the phase changed inside the window: no measurement
