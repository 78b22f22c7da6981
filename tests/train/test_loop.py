"""train(config): golden losses, time budget, NaN patience, signals, kill -9 + resume = uninterrupted."""

from __future__ import annotations

import json
import logging
import signal
import time
from pathlib import Path

import pytest
import torch
from helpers import metrics_records, sigterm_after, tiny_config, train_in_subprocess
from safetensors.torch import load_file

from vitkit.runs import LATEST, STATE_FILE
from vitkit.train import trainer
from vitkit.train.checkpointer import Checkpointer
from vitkit.train.config import to_dict

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "train_tiny_losses.json"
ROOT = Path(__file__).resolve().parents[2]


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(str(checkpoint / "model.safetensors"))


def test_tiny_recipe_first_losses_match_golden(tmp_path: Path) -> None:
    # the golden losses are the CPU's (CUDA's kernels sum in another order: 1e-3 apart after 5 steps) with the torch
    # release that recorded them (AVX2, AVX-512 and AMX hosts agree; torch 2.11's losses differ by up to 2e-3)
    golden = json.loads(GOLDEN.read_text())
    if ".".join(torch.__version__.split(".")[:2]) != golden["torch"]:
        pytest.skip(f"golden losses recorded with torch {golden['torch']}, this is {torch.__version__}")
    config = tiny_config(tmp_path / "run", "run.log_every=1", "data.steps=5", "run.device=cpu")
    result = trainer.train(config)
    losses = [r["loss"] for r in metrics_records(tmp_path / "run") if r["split"] == "train"][:5]
    assert golden["command"] and len(golden["losses"]) == 5
    assert losses == pytest.approx(golden["losses"], rel=1e-4, abs=1e-5)
    assert result["status"] == "finished" and result["step"] == 5


def test_run_directory_layout_and_final_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    trainer.train(tiny_config(run, "data.steps=6", "run.checkpoint_every=4"))
    expected = json.loads(json.dumps(to_dict(tiny_config(run, "data.steps=6", "run.checkpoint_every=4"))))
    assert json.loads((run / "config.json").read_text()) == expected
    last = metrics_records(run)[-1]
    assert last["split"] == "test" and last["final"] and last["step"] == 6
    assert set(last) >= {"step", "epoch", "split", "loss", "top1", "top5"}
    assert (run / "checkpoints" / LATEST).read_text().strip() == "step_0000006"
    assert (run / "plots" / "curves.png").stat().st_size > 1000
    assert (run / "checkpoints" / "final" / "model.safetensors").is_file()  # what `vitkit eval RUN` reads
    state = torch.load(run / "checkpoints" / "step_0000006" / STATE_FILE, weights_only=True)  # no pickled objects
    assert state["step"] == 6 and set(state["rng"]) >= {"torch", "augment"}


def test_max_minutes_cut_stops_evaluates_and_saves(tmp_path: Path) -> None:
    run = tmp_path / "run"  # budget_schedule=cut: the budget stops this invocation (a fitted one ends annealed)
    result = trainer.train(tiny_config(run, "data.steps=50", "run.max_minutes=0.000001", "run.budget_schedule=cut"))
    assert result["status"] == "time_budget" and result["step"] == 1
    assert result["test"]["count"] == 359
    assert metrics_records(run)[-1]["final"] and (run / "checkpoints" / "step_0000001").is_dir()


class _Clock:
    """The trainer's clock, advancing `tick` seconds each time it is read: a schedule by the clock, made
    independent of the host's speed and load."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def monotonic(self) -> float:
        self.now += self.tick
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_fitted_schedule_ends_annealed_when_the_budget_is_spent(tmp_path: Path, monkeypatch) -> None:
    run = tmp_path / "run"  # far more steps than 3 s allow: the clock, not the step count, ends the decay
    monkeypatch.setattr(trainer, "time", _Clock(0.02))
    result = trainer.train(
        tiny_config(run, "data.steps=1000000", "run.max_minutes=0.05", "run.log_every=1", "optim.warmup_steps=5")
    )  # budget_schedule=fit is the default
    assert result["status"] == "finished" and 20 < result["step"] < 1_000_000
    lrs = [r["lr"] for r in metrics_records(run) if r["split"] == "train"]
    assert len(lrs) == result["step"] and max(lrs) == pytest.approx(result["plan"]["lr"], rel=0.05)
    assert all(later <= earlier for earlier, later in zip(lrs[5:], lrs[6:]))  # decays after warmup
    assert lrs[-1] < 0.02 * max(lrs)  # ended annealed, not cut at a high learning rate
    assert result["plan"]["budget_schedule"] == "fit" and result["plan"]["measured"]["fit_epochs"] > 0


def test_removed_options_fail_with_what_to_do_instead(tmp_path: Path) -> None:
    for key, words in (
        ("data.resolutions=4,6", "progressive resolution was removed"),
        ("data.patch_dropout_later=0.5", "stepped PatchDropout was removed"),
        ("optim.ema_warmup=true", "EMA warm-up was removed"),
        ("optim.light_below_epochs=50", "run-length regularisation rule was removed"),
    ):
        with pytest.raises(ValueError, match=words):
            tiny_config(tmp_path / "run", key)


def test_patch_dropout_is_switched_off_where_the_schedule_says(tmp_path: Path) -> None:
    def final(name: str, *overrides: str) -> dict[str, torch.Tensor]:
        trainer.train(tiny_config(tmp_path / name, "data.steps=6", *overrides))
        return _weights(tmp_path / name / "checkpoints" / "final")

    plain = final("plain")
    off = final("off", "model.patch_dropout=0.5", "model.patch_dropout_until=0")  # off from the first step
    on = final("on", "model.patch_dropout=0.5", "model.patch_dropout_until=0.5")
    assert all(torch.equal(plain[k], off[k]) for k in plain)
    assert max((plain[k] - on[k]).abs().max() for k in plain) > 1e-4
    shorter = final("shorter", "model.patch_dropout=0.5", "model.patch_dropout_until=0.2")
    assert max((on[k] - shorter[k]).abs().max() for k in on) > 1e-4


@pytest.mark.parametrize("nan_check", ["sync", "deferred"])
def test_nan_losses_skip_then_stop_with_last_good_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nan_check: str
) -> None:
    real = trainer.train_step

    def poisoned(state, batch, spec, loss_of=None):  # steps 3, 4, ... see NaN images
        if state.step >= 2:
            batch = [(images * float("nan"), targets) for images, targets in batch]
        return real(state, batch, spec, loss_of)

    monkeypatch.setattr(trainer, "train_step", poisoned)
    run = tmp_path / "run"
    with pytest.raises(trainer.NonFiniteLossError, match=r"5 consecutive steps, the last at step 7.*step_0000002"):
        trainer.train(tiny_config(run, "data.steps=20", "run.checkpoint_every=2", f"run.nan_check={nan_check}"))
    assert (run / "checkpoints" / LATEST).read_text().strip() == "step_0000002"  # not overwritten during the streak
    skipped = [r for r in metrics_records(run) if r.get("skipped")]
    assert [r["step"] for r in skipped] == [3, 4, 5, 6, 7]


def test_sigterm_saves_at_step_boundary_and_returns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trainer, "train_step", sigterm_after(3, trainer.train_step))
    run = tmp_path / "run"
    settings = ("data.steps=10", "run.checkpoint_every=100", "run.log_every=2")
    result = trainer.train(tiny_config(run, *settings))
    assert result["status"] == "interrupted" and result["step"] == 3 and result["signal"] == signal.SIGTERM
    assert (run / "checkpoints" / LATEST).read_text().strip() == "step_0000003"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))
    monkeypatch.undo()
    trainer.train(tiny_config(run, *settings))  # step 3 had been in no record: between a log step and the signal
    assert [r["step"] for r in metrics_records(run) if r["split"] == "train"] == [2, 3, 4, 6, 8, 10]


def test_kill_9_then_resume_equals_uninterrupted_bit_exact(tmp_path: Path) -> None:
    args = ("data.steps=16", "run.checkpoint_every=5", "run.log_every=3")  # dropout + pad-crop: RNG must resume
    reference = tmp_path / "reference"
    trainer.train(tiny_config(reference, *args))
    run = tmp_path / "killed"
    config = tiny_config(run, *args)
    killed = train_in_subprocess(config, 13)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (run / "checkpoints" / LATEST).read_text().strip() == "step_0000010"
    assert max(r["step"] for r in metrics_records(run)) == 12  # records past the checkpoint exist before resuming
    resumed = train_in_subprocess(config, 0)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    ours, theirs = _weights(run / "checkpoints" / "step_0000016"), _weights(reference / "checkpoints" / "step_0000016")
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    strip = lambda rs: [{k: v for k, v in r.items() if k != "images_per_s"} for r in rs]  # noqa: E731
    # the log was rewound to the checkpoint too, and step 10's output, saved with it, is in step 12's record again
    assert strip(metrics_records(run)) == strip(metrics_records(reference))


class _Killed(BaseException):
    """A process's death in the middle of training, raised in place of `kill -9`: nothing is saved on the way out."""


class _StepClock:
    """The trainer's clock, standing still but for `step_s` seconds per optimiser step taken: checkpoints by the
    clock fall on known steps, however fast the host."""

    def __init__(self, step_s: float) -> None:
        self.now, self.step_s = 0.0, step_s

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str):
        return getattr(time, name)


def _clocked_run(monkeypatch, run: Path, step_s: float, *overrides: str, die_after: int = 0) -> list[int]:
    """Train the tiny run under a `_StepClock`, dying right after step `die_after` (0: never); the steps saved."""
    clock, real_step, real_save = _StepClock(step_s), trainer.train_step, Checkpointer.save
    saved: list[int] = []

    def step(state, batch, spec, loss_of=None):
        out = real_step(state, batch, spec, loss_of)
        clock.now += clock.step_s
        if state.step == die_after:
            raise _Killed
        return out

    def save(self, state):
        saved.append(state.step)
        return real_save(self, state)

    monkeypatch.setattr(trainer, "time", clock)
    monkeypatch.setattr(trainer, "train_step", step)
    monkeypatch.setattr(Checkpointer, "save", save)
    args = ("data.steps=10", "run.checkpoint_every=1000", "run.log_every=1", *overrides)
    try:
        trainer.train(tiny_config(run, *args))
    except _Killed:
        pass
    monkeypatch.undo()
    return saved


def test_checkpoints_by_the_clock_resume_exactly(tmp_path: Path, monkeypatch, caplog) -> None:
    """20 s a step and a checkpoint a minute: saved after steps 3, 6 and 9 (and the end), though checkpoint_every
    is 1000.  Killed after step 5, the run resumes from step 3 and ends with the uninterrupted run's weights."""
    reference = tmp_path / "reference"
    assert _clocked_run(monkeypatch, reference, 20.0, "run.checkpoint_minutes=0") == [10]  # 0: steps alone
    assert _clocked_run(monkeypatch, tmp_path / "timed", 20.0, "run.checkpoint_minutes=1") == [3, 6, 9, 10]
    assert sorted(p.name for p in (tmp_path / "timed" / "checkpoints").glob("step_*")) == [
        "step_0000006",  # pruned as step checkpoints are: the newest and two before it
        "step_0000009",
        "step_0000010",
    ]
    run = tmp_path / "killed"
    assert _clocked_run(monkeypatch, run, 20.0, "run.checkpoint_minutes=1", die_after=5) == [3]
    assert (run / "checkpoints" / LATEST).read_text().strip() == "step_0000003"
    with caplog.at_level(logging.INFO, logger="vitkit"):  # resumed with another cadence: a volatile key
        assert _clocked_run(monkeypatch, run, 20.0, "run.checkpoint_minutes=0.5") == [5, 7, 9, 10]
    assert "resuming" in caplog.text and "different config" not in caplog.text
    ours, theirs = _weights(run / "checkpoints" / "step_0000010"), _weights(reference / "checkpoints" / "step_0000010")
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "images_per_s"} for r in rs]  # noqa: E731
    assert strip(metrics_records(run)) == strip(metrics_records(reference))


def test_a_run_killed_before_its_first_checkpoint_says_it_starts_over(tmp_path: Path, monkeypatch, caplog) -> None:
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert _clocked_run(monkeypatch, run, 1.0, die_after=4) == []  # 4 s: no checkpoint yet
        assert "no checkpoint" not in caplog.text  # a new run directory: nothing to say
        assert (run / "config.json").is_file() and max(r["step"] for r in metrics_records(run)) == 3  # step 4 unlogged
        assert _clocked_run(monkeypatch, run, 1.0) == [10]
    assert f"no checkpoint in {run}: starting from step 0" in caplog.text
    assert [r["step"] for r in metrics_records(run) if r["split"] == "train"] == list(range(1, 11))


def test_a_failing_final_evaluation_keeps_the_trained_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The final model is exported before the final evaluation: when that evaluation dies (as oneDNN's bf16
    kernels did on CPUs without native bf16), the run exits 1 naming the saved model and `vitkit eval`, and
    `vitkit eval` on it gives what the evaluation would have."""
    from vitkit.cli import main

    reference = trainer.train(tiny_config(tmp_path / "reference", "data.steps=6"))
    real = trainer.Trainer._evaluate

    def dies_on_test(self, split, data, **how):
        if split == "test":
            raise RuntimeError("could not create a primitive descriptor for the inner product forward propagation")
        return real(self, split, data, **how)

    monkeypatch.setattr(trainer.Trainer, "_evaluate", dies_on_test)
    run = tmp_path / "run"
    code = main(
        [
            "train",
            "--recipe",
            "small-8px-tiny",
            "--out",
            str(run),
            "--set",
            "data.steps=6",
            "--set",
            "model.dropout=0.1",
            "--set",
            "run.precision=fp32",
            "--set",
            "run.threads=1",
            "--json",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and "the final test evaluation failed (RuntimeError: could not create" in err
    assert f"saved in {run / 'checkpoints' / 'final'}" in err and f"`vitkit eval {run} --data digits`" in err
    saved, expected = (
        load_file(str(d / "checkpoints" / "final" / "model.safetensors")) for d in (run, tmp_path / "reference")
    )
    assert saved.keys() == expected.keys() and all(torch.equal(saved[k], expected[k]) for k in saved)
    monkeypatch.setattr(trainer.Trainer, "_evaluate", real)
    assert main(["eval", str(run), "--data", "digits", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["top1"] == pytest.approx(reference["test"]["top1"])


def test_a_train_state_that_does_not_fit_the_run_is_passed_over(tmp_path: Path, caplog) -> None:
    """An optimiser moment of the wrong shape crashed torch's fused Adam natively (SIGSEGV); a step count of
    1e15 ended the run "after 1000000000000000/675 steps".  Such a step is passed over for the one before."""
    run = tmp_path / "run"
    trainer.train(tiny_config(run, "data.steps=6", "run.checkpoint_every=2"))
    state_of = {step: run / "checkpoints" / f"step_000000{step}" / STATE_FILE for step in (4, 6)}
    for step, damage in ((6, "moment"), (4, "count")):
        state = torch.load(state_of[step], weights_only=True)
        if damage == "moment":
            state["optimizer"]["state"][0]["exp_avg"] = torch.zeros(7)
        else:
            state["step"] = 10**15
        torch.save(state, state_of[step])
    (run / "checkpoints" / LATEST).write_text("step_0000006\n")
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        result = trainer.train(tiny_config(run, "data.steps=6", "run.checkpoint_every=2"))
    assert result["status"] == "finished" and result["step"] == 6
    assert "optimizer exp_avg of parameter 0 has shape (7,)" in caplog.text
    assert "step is 1000000000000000, not a count" in caplog.text and "resuming from step_0000002" in caplog.text


def test_a_budget_already_spent_on_resume_is_said_and_ends_as_spent(tmp_path: Path, monkeypatch, caplog) -> None:
    """Re-run with a budget below what earlier invocations trained, a run took no step and reported itself
    "finished", its schedule cut at a high learning rate, without a word."""
    from helpers import sigterm_after

    run = tmp_path / "run"
    monkeypatch.setattr(trainer, "time", _Clock(0.02))
    monkeypatch.setattr(trainer, "train_step", sigterm_after(10, trainer.train_step))
    settings = ("data.steps=0", "run.log_every=1", "optim.warmup_steps=5")  # the budget alone: its length
    assert trainer.train(tiny_config(run, *settings, "run.max_minutes=1"))["status"] == "interrupted"
    monkeypatch.setattr(trainer.Trainer, "_usable_s", lambda self: 0.01)  # what is left of a budget below 0.5 min
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        result = trainer.train(tiny_config(run, *settings, "run.max_minutes=0.2"))
    assert result["status"] == "time_budget" and result["step"] == 10
    assert "the time budget of 0.2 min was spent before this invocation" in caplog.text
    assert "a larger --max-minutes trains it to its end" in caplog.text


def test_a_muon_run_resumes_and_its_parts_moments_are_checked(tmp_path: Path, caplog) -> None:
    """Muon runs save their optimisers as {"parts": [...]}, which the train-state check took for a damaged
    optimiser state: every Muon recipe (MNIST, Fashion-MNIST, CIFAR-10, Tiny-ImageNet) failed to resume after
    Ctrl-C or a kill, and a finished one to re-run.  Each part is now checked as an optimiser of its own."""
    run = tmp_path / "run"
    muon = ("optim.name=muon", "run.checkpoint_every=2")
    first = trainer.train(tiny_config(run, "data.steps=4", *muon))
    again = trainer.train(tiny_config(run, "data.steps=4", *muon))  # a finished run re-run: read, not retrained
    assert first["status"] == again["status"] == "finished" and again["step"] == 4
    state_file = run / "checkpoints" / "step_0000004" / STATE_FILE
    state = torch.load(state_file, weights_only=True)
    assert len(state["optimizer"]["parts"]) == 2
    moments = [entry for part in state["optimizer"]["parts"] for entry in part["state"].values()]
    assert moments and all(isinstance(entry, dict) for entry in moments)
    part = state["optimizer"]["parts"][0]
    index = next(iter(part["state"]))
    name = next(k for k, v in part["state"][index].items() if isinstance(v, torch.Tensor) and v.dim() > 0)
    part["state"][index][name] = torch.zeros(7)
    torch.save(state, state_file)
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        result = trainer.train(tiny_config(run, "data.steps=4", *muon))
    assert result["status"] == "finished" and f"optimizer {name} of parameter {index} has shape (7,)" in caplog.text
    assert "resuming from step_0000002" in caplog.text
