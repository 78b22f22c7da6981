"""The Trainer's parts alone: schedule at a position, non-finite guard, checkpointer atomicity, stop policy,
the warm-up's estimate; each with fakes (clock, signals, a second process) instead of waiting or forking."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import tiny_config

from vitkit.checkpoints import native
from vitkit.models import build_model
from vitkit.models.configs import ViTConfig
from vitkit.runs import LATEST, RunDir
from vitkit.train.budget import steps_that_fit
from vitkit.train.checkpointer import Checkpointer
from vitkit.train.config import OptimConfig, apply_overrides
from vitkit.train.guard import NonFiniteGuard, NonFiniteLossError
from vitkit.train.optim import build_optimizer
from vitkit.train.plan import augment_seed, init_seed, make_plan, micro_batch_size, resumed_seeds
from vitkit.train.plan_text import plan_lines
from vitkit.train.schedule import Schedule
from vitkit.train.state import TrainState

TINY = ViTConfig(img_size=8, patch_size=4, in_chans=1, num_classes=3, hidden_size=8, depth=1, num_heads=2, mlp_dim=16)


# ------------------------------------------------------------------------------------- schedule
def test_schedule_at_a_position_golden_values() -> None:
    schedule = Schedule(
        total_steps=101,
        peak_lr=2.0,
        warmup_steps=10,
        kind="cosine",
        end_fraction=0.1,
        patch_dropout=0.5,
        patch_until=0.8,
        side=28,
        ema_decay=0.99,
    )
    first = schedule.at(0)
    assert (first.lr, first.patch_dropout, first.side, first.ema_decay) == (
        2.0 * 1 / 10,
        0.5,
        28,
        0.99,
    )  # (step + 1) / 10
    middle = schedule.at(55)  # progress (55 - 10) / (100 - 10) = 0.5: the cosine is at half
    assert middle.lr == pytest.approx(2.0 * (0.1 + 0.9 * 0.5)) and middle.patch_dropout == 0.5
    late = schedule.at(81)  # 81 / 101 >= 0.8: every patch from here
    assert late.patch_dropout == 0.0
    assert schedule.at(100).lr == pytest.approx(2.0 * 0.1) and schedule.at(101).lr == pytest.approx(2.0 * 0.1)
    assert schedule.at(100.5) == schedule.at(100.5)  # a pure function of the position
    assert schedule.spans() == [(0.0, 0.8, 0.5), (0.8, 1.0, 0.0)]
    assert schedule.phases(start=0.0) == [(0.5, 28), (0.0, 28)] and schedule.phases(start=0.85) == [(0.0, 28)]
    plain = Schedule(total_steps=10, peak_lr=1.0, side=8)  # no PatchDropout: one phase, one graph
    assert plain.spans() == [(0.0, 1.0, 0.0)] and plain.phases() == [(0.0, 8)]


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
    with pytest.raises(NonFiniteLossError, match=r"3 consecutive steps, the last at step 6.*run/step_0000002") as stop:
        guard.flush()
    assert "in a new run (another --out: a re-run of this one resumes its own config" in str(stop.value)  # a re-run
    # with a lower --lr resumed the stored one, and its NaN
    assert counters.skipped_steps == 4
    unsaved = NonFiniteGuard(SimpleNamespace(nan_streak=0, skipped_steps=0), patience=1)
    unsaved.observe(1, True)
    with pytest.raises(NonFiniteLossError, match="none \\(no checkpoint yet\\)") as stop:
        unsaved.flush()  # nothing saved: a re-run of the same command with a lower --lr starts over with it
    assert str(stop.value).endswith("then re-run: with no checkpoint, the same --out starts over with the new settings")


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
    checkpointer = Checkpointer(
        run, every=3, meta={"class_names": ["a", "b", "c"]}, main=True, extra=lambda: {"data": {"step": 3}}
    )
    assert checkpointer.due(3) and not checkpointer.due(4)
    first = checkpointer.save(saved)
    assert first == run.checkpoints / "step_0000003" and (run.checkpoints / LATEST).read_text() == "step_0000003\n"
    restored, payloads = _state(1), []
    assert checkpointer.restore(restored, load_extra=payloads.append) == first
    assert restored.step == 3 and payloads[0]["data"] == {"step": 3}
    assert all(
        torch.equal(a, b) for a, b in zip(saved.module.state_dict().values(), restored.module.state_dict().values())
    )
    assert restored.optimizer.state_dict()["state"][0]["exp_avg"].equal(
        saved.optimizer.state_dict()["state"][0]["exp_avg"]
    )
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


# -------------------------------------------------------------------------------- the estimate
def test_the_warm_up_estimate_weighs_each_phase_by_its_share() -> None:
    config = apply_overrides(
        tiny_config(Path("/unused"), "data.steps=100", "data.batch_size=100", "data.micro_batch_size=50"),
        ["model.patch_dropout=0.5", "model.patch_dropout_until=0.6"],
    )
    timings = {(0.5, 8): 0.1, (0.0, 8): 0.2}  # seconds per micro-batch of 50 images
    plan = make_plan(config, num_train=1000, timings=timings, eval_images=300)
    step_s = 0.6 * 2 * 0.1 + 0.4 * 2 * 0.2  # 60% of the steps at PatchDropout, 2 micro-batches each
    assert plan.measured["step_seconds"] == pytest.approx(step_s, abs=1e-4)
    assert plan.measured["images_per_s"] == pytest.approx(100 / step_s, abs=0.1)
    eval_s = 300 * (0.2 / 50) / 3  # one final evaluation, forward only
    assert plan.measured["eta_minutes"] == pytest.approx((100 * step_s + eval_s) / 60, abs=0.01)
    assert plan.steps_given and plan.steps == 100


def test_a_resumed_run_estimates_the_steps_it_has_left() -> None:
    config = tiny_config(Path("/unused"), "data.steps=100", "data.batch_size=100")
    timings = {(0.0, 8): 0.2}  # seconds a step (one micro-batch)
    whole = make_plan(config, num_train=1000, timings=timings, eval_images=300)
    resumed = make_plan(config, num_train=1000, timings=timings, eval_images=300, start_step=75)
    eval_s = whole.measured["eval_seconds"]
    assert resumed.start_step == 75 and resumed.steps == whole.steps == 100
    assert resumed.measured["eta_minutes"] == pytest.approx((25 * 0.2 + eval_s) / 60, abs=0.01)
    assert "the remaining 25 of 100 steps (resuming at step 75)" in "\n".join(plan_lines(resumed))
    assert "for 100 steps" in "\n".join(plan_lines(whole))
    cut = tiny_config(Path("/unused"), "data.steps=100", "data.batch_size=100", "run.max_minutes=0.05")
    cut = apply_overrides(cut, ["run.budget_schedule=cut"])
    text = "\n".join(plan_lines(make_plan(cut, num_train=1000, timings=timings, eval_images=300)))
    assert "for 100 steps" in text  # a cut budget had said nothing of itself: a 0.3-min run read as planned whole
    assert "time budget 0.05 min, the schedule cut by it: this invocation stops when it is spent" in text


@pytest.mark.parametrize("flip_views", [False, True])
def test_the_final_evaluation_is_reserved_at_its_measured_time(flip_views: bool) -> None:
    # a BiT ResNet evaluated 10,000 64-px images in 91 s where a third of its training pass gave ~50 s: the reserve
    # is the measured seconds per image of the evaluation itself (flip views included in the measurement); without
    # a measurement, a third of a training pass per view
    config = tiny_config(Path("/unused"), "data.steps=100", "data.batch_size=100", f"eval.flip_views={flip_views}")
    timings = {(0.0, 8): 0.2}  # a micro-batch of 100: 2 ms an image
    plan = make_plan(config, num_train=1000, timings=timings, eval_images=300, eval_image_s=0.003)
    assert plan.measured["eval_seconds"] == pytest.approx(300 * 0.003, abs=0.05)
    assert plan.measured["eval_image_ms"] == pytest.approx(3.0)
    guessed = make_plan(config, num_train=1000, timings=timings, eval_images=300)
    views = 2 if flip_views else 1
    assert guessed.measured["eval_image_ms"] == pytest.approx(views * 2.0 / 3, abs=1e-3)


def test_a_budgeted_run_reserves_its_final_evaluation_from_a_timed_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vitkit.train import trainer

    timed: list[float] = []
    real = trainer.Trainer._eval_image_seconds

    def spy(self, count: int) -> float:
        timed.append(real(self, count))
        return timed[-1]

    monkeypatch.setattr(trainer.Trainer, "_eval_image_seconds", spy)
    plan = trainer.train(tiny_config(tmp_path / "run", "data.steps=2", "run.max_minutes=5"))["plan"]
    measured, images = plan["measured"], plan["splits"]["test"]["images"]
    assert len(timed) == 1 and timed[0] > 0 and images > 0  # timed once, before the clock
    assert measured["eval_image_ms"] == pytest.approx(1000 * timed[0], abs=1e-4)
    assert measured["eval_seconds"] == pytest.approx(images * timed[0], abs=0.05)


def test_the_final_evaluation_is_timed_after_an_untimed_pass_at_the_same_batch(tmp_path, monkeypatch) -> None:
    """Warmed by a micro-batch, the timed batch paid the CPU's first pass at its shape: the reserve kept 95 s
    for a Tiny-ImageNet evaluation that took 51 s (2-minute budget, no AVX2)."""
    from vitkit.train import objectives, trainer

    sizes: list[int] = []
    real = objectives.Classification.evaluate
    monkeypatch.setattr(
        objectives.Classification,
        "evaluate",
        lambda self, model, data, ctx: (sizes.append(len(data)), real(self, model, data, ctx))[1],
    )
    config = tiny_config(tmp_path / "run", "data.steps=2", "run.max_minutes=5", "eval.batch_size=64")
    trainer.train(config)
    assert sizes[:2] == [64, 64]  # untimed, then timed: the same shape
    assert sizes[2:] == [359]  # the final evaluation itself


def test_a_budget_alone_gives_each_phase_its_share_of_the_time() -> None:
    config = apply_overrides(
        tiny_config(
            Path("/unused"),
            "data.batch_size=100",
            "data.micro_batch_size=50",
            "run.max_minutes=1",
            "data.epochs=0",
            "data.steps=0",
        ),
        ["model.patch_dropout=0.5", "model.patch_dropout_until=0.6"],
    )
    timings = {(0.5, 8): 0.1, (0.0, 8): 0.2}
    plan = make_plan(config, num_train=1000, timings=timings, budget_s=10.0)
    fit = 0.6 * 10.0 / (2 * 0.1) + 0.4 * 10.0 / (2 * 0.2)  # 60% of the time at 0.2 s a step, 40% at 0.4 s
    assert steps_that_fit([(0.0, 0.6, 0.2), (0.6, 1.0, 0.4)], 10.0) == round(fit) == 40
    assert not plan.steps_given and plan.steps == 40 and plan.measured["fit_epochs"] == pytest.approx(4.0)
    assert plan.warmup == round(0.05 * 40) and plan.epochs == pytest.approx(4.0)  # the recipe's warmup fraction


def test_a_budget_too_small_for_its_final_evaluation_is_warned_about() -> None:
    from vitkit.train.plan_text import plan_lines

    config = tiny_config(Path("/unused"), "data.steps=0", "data.epochs=0", "run.max_minutes=1")
    timings = {(0.0, 8): 0.2}

    def plan_with(eval_s: float):
        return make_plan(
            config, num_train=1000, timings=timings, budget_s=50.0, eval_images=1000, eval_image_s=eval_s / 1000
        )

    tight, ample = plan_with(45.0), plan_with(5.0)  # 50 s left after start-up, 45 or 5 of them evaluating
    assert tight.measured["train_seconds"] == pytest.approx(5.0) and ample.measured["train_seconds"] == 45.0
    # the epochs that fit are those of the seconds left to train: "about 0.6 epochs fit" had stood beside
    # "0 s are left to train", counted in the whole budget
    for plan, steps in ((tight, 5.0 / 0.2), (ample, 45.0 / 0.2)):
        assert plan.measured["fit_epochs"] == round(steps * plan.global_batch / 1000, 1)
        # the length line gave the steps of the whole budget ("about 250") beside "0.8 epochs fit" of its 25
        said = f"as many steps as the budget holds (about {steps:,.0f}, {plan.measured['fit_epochs']:.1f} epochs"
        assert said in "\n".join(plan_lines(plan))
    warned = [line for line in plan_lines(tight) if line.startswith("warning:")]
    assert warned and "5 s" in warned[0] and "45 s" in warned[0] and "--max-minutes" in warned[0]
    assert not any(line.startswith("warning:") for line in plan_lines(ample))
    # --max-minutes 0.2 whose start-up took 30 s: the run got the 1 s floor, and was told only that little was left
    spent = make_plan(apply_overrides(config, ["run.max_minutes=0.2"]), num_train=1000, timings=timings, budget_s=1.0)
    spent = dataclasses.replace(spent, measured={**spent.measured, "startup_seconds": 30.0})  # as the trainer adds
    warned = [line for line in plan_lines(spent) if line.startswith("warning:")]
    assert len(warned) == 1 and "the start-up took 30 s of the 12-s budget" in warned[0] and "ends late" in warned[0]
    slow = dataclasses.replace(tight, measured={**tight.measured, "startup_seconds": 10.0})  # the evaluation's fault
    assert "start-up took" not in "\n".join(plan_lines(slow)) and "45 s" in "\n".join(plan_lines(slow))
    assert "ends late" not in "\n".join(plan_lines(slow))  # 10 + 5 + 45 s: within the minute
    # an evaluation longer than what start-up left: a 0.4-min fine-tune ran 1.6 min, its warning silent on it
    over = plan_with(75.0)
    over = dataclasses.replace(over, measured={**over.measured, "startup_seconds": 10.0})
    warned = [line for line in plan_lines(over) if line.startswith("warning:")]
    assert warned and "(75 s): the run ends late, after about 1.4 min" in warned[0]


def test_a_budget_longer_than_the_runs_own_length_says_the_steps_end_it() -> None:
    """10 steps of its own in a 1-minute budget: the plan said "about 550.9 epochs fit", which never happen."""
    config = tiny_config(Path("/unused"), "data.steps=10", "data.batch_size=100", "run.max_minutes=1")
    timings = {(0.0, 8): 0.2}
    short = make_plan(config, num_train=1000, timings=timings, budget_s=50.0)
    lines = "\n".join(plan_lines(short))
    assert short.steps_given and short.measured["fit_epochs"] == pytest.approx(25.0)  # 250 steps of 0.2 s fit
    assert "its own 10 steps (1.0 epochs) end it first" in lines
    long = make_plan(apply_overrides(config, ["data.steps=1000"]), num_train=1000, timings=timings, budget_s=50.0)
    assert "end it first" not in "\n".join(plan_lines(long))  # the budget ends a 1,000-step run
    # a fine-tune's 100-epoch cap under a 1-minute budget read as its length: "46,875 steps (100.0 epochs)"
    assert "at most 1,000 steps (100.0 epochs), fewer where the budget ends first" in "\n".join(plan_lines(long))


def test_a_run_s_random_streams_share_no_seed() -> None:
    """Seed 0, the default, had seeded the weights, the augmentation and the first epoch's order alike: three
    copies of one Mersenne Twister stream, offset only by what each had drawn."""
    seeds = [
        value
        for seed in (0, 1, 2**32 - 1)
        for rank in (0, 1, 2)
        for value in (init_seed(seed, rank), augment_seed(seed, rank), *resumed_seeds(seed, rank, 7))
    ]
    orders = {seed * 1_000_003 + epoch for seed in (0, 1, 2**32 - 1) for epoch in range(1000)}  # data/loader.py's
    assert len(set(seeds)) == len(seeds) and not set(seeds) & orders
    assert all(0 <= value < 2**63 for value in seeds)
    weights = torch.rand(4, generator=torch.Generator().manual_seed(init_seed(0, 0)))
    augment = torch.rand(4, generator=torch.Generator().manual_seed(augment_seed(0, 0)))
    assert not torch.equal(weights, augment)


def test_a_budget_with_periodic_evaluations_still_reserves_the_final_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With an evaluation every few epochs planned, nothing was kept back for the final one until a periodic
    evaluation had run: a 1-minute run that ended before its first (9 steps of an evaluation every 27) trained
    for the whole budget, then evaluated past it (80 s in all).  The final evaluation is timed and kept back."""
    from vitkit.train import trainer

    budgets = []

    class Recorded(trainer.Budget):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            budgets.append(self)

    monkeypatch.setattr(trainer, "Budget", Recorded)
    lengths = ("data.steps=0", "data.epochs=0", "run.max_minutes=0.1")  # the budget alone: a few seconds
    config = tiny_config(tmp_path / "run", *lengths, "eval.every_epochs=100", "data.val_fraction=0.1")
    plan = trainer.train(config)["plan"]
    measured = plan["measured"]
    images = plan["splits"]["test"]["images"] + plan["splits"]["val"]["images"]
    assert plan["eval_every"] > plan["steps"] and images > plan["splits"]["test"]["images"]  # none periodic ran
    assert measured["final_eval_seconds"] == pytest.approx(images * measured["eval_image_ms"] / 1000, abs=0.05)
    assert budgets[0].reserve_s == measured["final_eval_seconds"] > 0


def test_a_micro_batch_above_a_process_s_share_is_no_accumulation_not_an_error() -> None:
    """`torchrun --nproc-per-node 2 ... --recipe paper-pretrain-tiny --batch-size 16` failed with "per-process batch
    8 is not a multiple of data.micro_batch_size 16", a micro-batch the user never set; one process ran it."""
    config = tiny_config(Path("unused"), "data.batch_size=16", "data.micro_batch_size=16")
    assert [micro_batch_size(config, world) for world in (1, 2, 4, 16)] == [16, 8, 4, 1]
    config = tiny_config(Path("unused"), "data.batch_size=48", "data.micro_batch_size=16")
    assert micro_batch_size(config, 3) == 16
    with pytest.raises(ValueError, match="per-process batch 24 is not a multiple of data.micro_batch_size 16"):
        micro_batch_size(config, 2)  # 24 a process: the micro-batch does not divide it


def test_what_processes_must_share_is_named_as_a_user_sets_it() -> None:
    """The recipe, a field outside the groups, was named "recipe." in the processes' disagreement message."""
    from vitkit.train.parts import agreed_facts

    class Train(list):
        class_names = ["a", "b"]

    config = tiny_config(Path("/unused"), "optim.lr=0.5")
    facts = agreed_facts(config, SimpleNamespace(train=Train([0, 1, 1]), test=None))
    assert facts["recipe"] == config.recipe and "recipe." not in facts and facts["optim.lr"] == 0.5
    assert (facts["train images"], facts["classes"], facts["test images"]) == (3, ["a", "b"], 0)
    assert "run.progress" not in facts and "run.threads" not in facts and facts["data.uri"] == config.data.uri


def test_processes_agree_on_one_data_folder_however_each_spells_it(tmp_path: Path, monkeypatch) -> None:
    """Spelt differently, one folder was refused as two; spelt the same in two working directories (two machines'
    processes), it is still one source: a path disagrees only where neither its spelling nor its real path agree."""
    from vitkit.train import parts
    from vitkit.train.parts import agreed_facts, real_paths

    class Train(list):
        class_names = ["a"]

    (tmp_path / "photos").mkdir()
    monkeypatch.chdir(tmp_path)
    spelt = ["folder:photos", "folder:./photos", f"folder:{tmp_path}/photos/", f"folder:{tmp_path}/x/../photos"]
    facts = [agreed_facts(tiny_config(Path(u[7:]), f"data.uri={u}"), SimpleNamespace(train=Train([0]), test=None))
             for u in spelt]  # fmt: skip
    assert [f["data.uri"] for f in facts] == spelt  # as spelt, for the message
    real = os.path.realpath(tmp_path / "photos")
    assert [real_paths(f) for f in facts] == [{"data.uri": f"folder:{real}", "run.out": real}] * 4
    monkeypatch.setattr(parts.distributed, "current", lambda: SimpleNamespace(world=2))
    cases = [  # (each process's spelling, each one's real path), refused
        (("folder:photos", "folder:/a/photos"), ("folder:/a/photos", "folder:/a/photos"), False),
        (("folder:photos", "folder:photos"), ("folder:/m1/photos", "folder:/m2/photos"), False),  # two machines
        (("folder:a", "folder:b"), ("folder:/a", "folder:/b"), True),
    ]
    for spellings, reals, refused in cases:

        def gathered(ours, spellings=spellings, reals=reals):  # rank 0's facts, then rank 1's
            text = json.dumps({"data.uri": spellings[1], "data.uri (real path)": reals[1]}).encode()
            return [ours, {"facts": torch.frombuffer(bytearray(text), dtype=torch.uint8)}]

        monkeypatch.setattr(parts.distributed, "all_gather_bytes", gathered)
        monkeypatch.setattr(parts, "real_paths", lambda facts, reals=reals: {"data.uri": reals[0]})
        monkeypatch.setattr(parts, "agreed_facts", lambda config, data, spellings=spellings: {"data.uri": spellings[0]})
        if refused:
            with pytest.raises(ValueError, match="do not agree on what to train: data.uri"):
                parts._check_every_process_agrees(None, None)
        else:
            parts._check_every_process_agrees(None, None)
