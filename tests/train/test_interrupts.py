"""Ctrl-C and SIGTERM at the edges of a run: as it finishes, in the final evaluation, in start-up."""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path

from helpers import metrics_records

from signalkit import sigterm_on_first_call
from vitkit.train import trainer


def _tiny_cli_run(run: Path) -> list[str]:
    settings = ["data.steps=4", "run.precision=fp32", "run.threads=1"]
    return ["train", "--recipe", "small-8px-tiny", "--out", str(run), *(f"--set={s}" for s in settings), "--json"]


def test_ctrl_c_as_the_run_finishes_leaves_it_finished(tmp_path: Path, monkeypatch, capsys, caplog) -> None:
    """A Ctrl-C landing while the curves are drawn, after the final accuracy is out, exited 130 with no
    plot; the run had finished, and it now says so, exits 0 and draws them."""
    import os

    from vitkit.cli import main
    from vitkit.train import finish

    real = finish.plot_curves

    def interrupted(*args):
        os.kill(os.getpid(), signal.SIGINT)
        real(*args)

    monkeypatch.setattr(finish, "plot_curves", interrupted)
    run = tmp_path / "run"
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(_tiny_cli_run(run)) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["status"] == "finished"
    assert (run / "plots" / "curves.png").is_file() and metrics_records(run)[-1]["final"] is True
    assert f"signal {int(signal.SIGINT)} came as the run finished" in caplog.text


def test_ctrl_c_in_the_final_evaluation_names_the_saved_model(tmp_path: Path, monkeypatch, capsys, caplog) -> None:
    from vitkit.cli import main

    real = trainer.Trainer._evaluate

    def interrupted(self, split, data, **how):
        if split == "test":
            raise KeyboardInterrupt
        return real(self, split, data, **how)

    monkeypatch.setattr(trainer.Trainer, "_evaluate", interrupted)
    run = tmp_path / "run"
    assert main(_tiny_cli_run(run)) == 130
    assert "interrupted" in capsys.readouterr().err
    assert (
        f"the trained model is saved in {run / 'checkpoints' / 'final'}: evaluate it with `vitkit eval" in caplog.text
    )
    assert (run / "checkpoints" / "final" / "model.safetensors").is_file()


def test_sigterm_in_start_up_says_it_stopped_the_run(tmp_path: Path, monkeypatch, capsys) -> None:
    """SIGTERM outside the training loop (start-up, the final save, export or evaluation) ended the process
    without a word, where Ctrl-C said what it left; it is said now, and the exit status is 143."""
    import os

    from vitkit.cli import main
    from vitkit.train import plan_text

    real = plan_text.plan_lines

    def terminated(plan):
        os.kill(os.getpid(), signal.SIGTERM)
        return real(plan)

    monkeypatch.setattr(plan_text, "plan_lines", terminated)
    assert main(_tiny_cli_run(tmp_path / "run")) == 143
    assert "vitkit train: interrupted by SIGTERM" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_sigterm_in_a_periodic_evaluation_saves_at_once_and_the_run_resumes(tmp_path: Path, monkeypatch) -> None:
    """A SIGTERM during a periodic evaluation waited for the whole evaluation (a scheduler's SIGKILL comes 30 s
    after its SIGTERM); the evaluation now ends before its next batch, the run saves at that step, and the
    re-run evaluates that step before its first step."""
    from helpers import tiny_config

    from vitkit.eval import evaluator
    from vitkit.runs import RunDir

    terminated, calls = sigterm_on_first_call(evaluator.eval_transform)
    monkeypatch.setattr(evaluator, "eval_transform", terminated)
    overrides = ("data.steps=0", "data.epochs=2", "eval.every_epochs=1", "eval.batch_size=16")
    config = tiny_config(tmp_path / "run", *overrides)
    result = trainer.train(config)
    every = result["plan"]["eval_every"]
    assert result["status"] == "interrupted" and result["step"] == every and len(calls) == 1
    assert RunDir(tmp_path / "run").latest().name == f"step_{every:07d}"
    assert not [r for r in metrics_records(tmp_path / "run") if r.get("split") == "val"]  # the cut one: no record
    resumed = trainer.train(config)
    assert resumed["status"] == "finished" and resumed["step"] == result["steps"] > 2 * every
    assert [r["step"] for r in metrics_records(tmp_path / "run") if r.get("split") == "val"] == [every, 2 * every]


def test_a_second_ctrl_c_stops_a_step_that_never_ends(tmp_path: Path, monkeypatch, capfd) -> None:
    """The first Ctrl-C saves at the step's end; a step that does not end (a hung reader) held the run until
    SIGKILL whatever was pressed.  A second Ctrl-C now stops it at once, and the CLI says nothing was saved."""
    import os
    import threading
    import time

    from vitkit.cli import main

    def hung(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        threading.Timer(1.2, os.kill, (os.getpid(), signal.SIGINT)).start()  # pressed again, a second later
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.05)
        raise AssertionError("the second Ctrl-C did not stop the step")

    monkeypatch.setattr(trainer, "train_step", hung)
    run = tmp_path / "run"
    assert main(_tiny_cli_run(run)) == 130
    err = capfd.readouterr().err
    assert "SIGINT: saving a checkpoint before the next step; another Ctrl-C stops at once" in err
    assert "vitkit train: interrupted before its first checkpoint: a re-run starts it over" in err
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())
