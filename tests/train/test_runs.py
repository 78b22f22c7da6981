"""The run directory as every verb sees it: vitkit.load(RUN), one resume policy applied before the plan is
printed, and `vitkit pretrain-mpp` interrupted by SIGTERM then resumed bit-identically."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import tiny_config
from safetensors.torch import load_file

import vitkit
from vitkit.atomic import unlock_directory
from vitkit.cli import main
from vitkit.runs import find_checkpoint
from vitkit.train import trainer

ROOT = Path(__file__).resolve().parents[2]


def test_load_of_a_run_is_the_load_of_its_final_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    trainer.train(tiny_config(run, "data.steps=4", "run.checkpoint_every=3"))
    from_run, from_final = vitkit.load(run), vitkit.load(run / "checkpoints" / "final")
    assert from_run.config == from_final.config
    assert all(torch.equal(a, b) for a, b in zip(from_run.state_dict().values(), from_final.state_dict().values()))
    x = torch.rand(2, 1, 8, 8) * 2 - 1
    assert torch.equal(from_run.eval()(x), from_final.eval()(x))
    assert find_checkpoint(run / "checkpoints") == find_checkpoint(run)  # RUN/checkpoints names the run too


def test_a_copied_run_stands_for_its_final_model_whatever_its_files_times(tmp_path: Path) -> None:
    """`cp -r` (no -p), scp or unzip give a run's files the times of the copy, in its order: a final export
    copied before the last step checkpoint looked older than it, and every verb read the step checkpoint.  The
    export records the step it is of."""
    run = tmp_path / "run"
    trainer.train(tiny_config(run, "data.steps=4", "run.checkpoint_every=3"))
    final = run / "checkpoints" / "final"
    assert json.loads((final / "config.json").read_text())["provenance"]["step"] == 4
    latest = run / "checkpoints" / (run / "checkpoints" / "LATEST").read_text().strip()
    before = latest.joinpath("config.json").stat().st_mtime - 60
    os.utime(final / "config.json", (before, before))
    assert latest.name == "step_0000004" and find_checkpoint(run) == final
    # started over (LATEST removed): the new run's step 2 stands for it, not the earlier run's final of step 4
    for step in (run / "checkpoints").glob("step_*"):
        shutil.rmtree(step)
    trainer.train(tiny_config(tmp_path / "other", "data.steps=2", "run.checkpoint_every=2"))
    shutil.copytree(tmp_path / "other" / "checkpoints" / "step_0000002", run / "checkpoints" / "step_0000002")
    (run / "checkpoints" / "LATEST").write_text("step_0000002\n")
    assert find_checkpoint(run).name == "step_0000002"


def test_a_run_without_a_final_model_is_named_so_once(tmp_path: Path, caplog) -> None:
    """`convert RUN`, `export-onnx RUN` and `predict RUN` of an unfinished run (killed, or still training) took
    its last step checkpoint, an un-annealed model, without a word; the warning names it, once a process."""
    run = tmp_path / "run"
    trainer.train(tiny_config(run, "data.steps=4", "run.checkpoint_every=3"))
    shutil.rmtree(run / "checkpoints" / "final")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit.runs"):
        found = [find_checkpoint(run), find_checkpoint(run)]
    assert found[0] == found[1] and found[0].name.startswith("step_")
    (message,) = [r.getMessage() for r in caplog.records]
    assert f"{run} has no final model (its run has not finished, or is training now): using {found[0].name}" in message
    # a finished FSDP run writes no final export, and a final of an earlier step than LATEST's target: not said
    for other in ("fsdp", "copied"):
        again = tmp_path / other
        shutil.copytree(run, again)
        if other == "fsdp":
            stored = json.loads((again / "config.json").read_text())
            stored["run"]["parallel"] = "fsdp"
            (again / "config.json").write_text(json.dumps(stored))
        else:
            trainer.train(tiny_config(tmp_path / "whole", "data.steps=4", "run.checkpoint_every=3"))
            shutil.copytree(tmp_path / "whole" / "checkpoints" / "final", again / "checkpoints" / "final")
            stored = json.loads((again / "checkpoints" / "final" / "config.json").read_text())
            stored["provenance"]["step"] = 3  # of an earlier step than LATEST's step_0000004
            (again / "checkpoints" / "final" / "config.json").write_text(json.dumps(stored))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="vitkit.runs"):
            assert find_checkpoint(again).name.startswith("step_")
        assert not caplog.records


def test_resuming_prints_and_runs_the_stored_config(tmp_path: Path, capsys, caplog) -> None:
    out = tmp_path / "run"  # a budget that cuts the first invocation short: the re-run has steps to plan
    args = ["train", "--recipe", "small-8px-tiny", "--out", str(out), "--set", "run.threads=1", "--json"]
    args += ["--max-minutes", "0.000001", "--set", "run.budget_schedule=cut"]
    assert main([*args, "--lr", "0.002"]) == 0
    capsys.readouterr()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert main([*args, "--lr", "0.5", "--epochs", "2"]) == 0  # the same directory: the run keeps its own settings
    err = capsys.readouterr().err
    assert "optim.lr" in caplog.text and "resuming it with its own config" in caplog.text
    assert f"to train it longer, start a new run from its weights (--set run.init_from={out}" in caplog.text
    assert "learning rate: lr 0.002" in err and "lr 0.5" not in err  # what is printed is what runs
    assert json.loads((out / "config.json").read_text())["optim"]["lr"] == 0.002


def test_a_run_directory_of_other_data_or_another_model_is_not_continued(tmp_path: Path, capsys) -> None:
    """Another data set or model in the same --out would train the stored ones under the new name: refused."""
    out = tmp_path / "run"
    args = ["train", "--recipe", "small-8px-tiny", "--out", str(out), "--set", "run.threads=1"]
    assert main(args) == 0
    stored = (out / "config.json").read_text()
    capsys.readouterr()
    assert main([*args, "--data", f"npz:{_two_class_npz(tmp_path)}"]) == 2
    err = capsys.readouterr().err
    assert "data.uri" in err and "another --out" in err
    assert main([*args, "--set", "model.depth=3"]) == 2
    assert "model.depth" in capsys.readouterr().err
    assert (out / "config.json").read_text() == stored


def test_another_start_or_other_labels_in_the_same_out_is_refused(tmp_path: Path, capsys, monkeypatch) -> None:
    """Fine-tuning other weights, or a different subset of labels, into a directory that holds a run is another
    run: refused, as other data is.  The same checkpoint spelt as a relative path is the same run."""
    monkeypatch.chdir(tmp_path)
    for name, seed in (("a", "0"), ("b", "1")):
        args = ["train", "--recipe", "small-8px-tiny", "--out", name, "--seed", seed, "--set", "run.threads=1"]
        assert main(args) == 0

    def finetune(start: str, *extra: str) -> int:
        args = ["finetune", start, "--data", "digits", "--out", "ft", "--set", "data.steps=2", "--set", "run.threads=1"]
        return main([*args, *extra])

    assert finetune(str(tmp_path / "a")) == 0
    stored = (tmp_path / "ft" / "config.json").read_text()
    capsys.readouterr()
    assert finetune(str(tmp_path / "b")) == 2
    assert "run.init_from" in capsys.readouterr().err
    assert finetune(str(tmp_path / "a"), "--labels-per-class", "3") == 2
    assert "data.labels_per_class" in capsys.readouterr().err
    assert finetune("a") == 0  # the same checkpoint, relative: resumed (finished), nothing refused
    assert "different config" not in capsys.readouterr().err
    assert (tmp_path / "ft" / "config.json").read_text() == stored


def test_a_finished_budgeted_run_is_re_run_without_its_budget(tmp_path: Path, capsys) -> None:
    """A run whose length was its --max-minutes keeps that length when re-run without the flag."""
    out = tmp_path / "run"
    args = ["train", "--recipe", "small-8px", "--out", str(out), "--set", "run.threads=1", "--json"]
    assert main([*args, "--max-minutes", "0.05"]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(args) == 0, capsys.readouterr().err[-1500:]
    again = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert again["step"] == first["step"] and again["test"]["top1"] == first["test"]["top1"]


def _two_class_npz(tmp_path: Path) -> Path:
    import numpy as np

    labels = np.arange(40) % 2
    images = (np.random.default_rng(0).integers(0, 60, (40, 8, 8)) + labels[:, None, None] * 90).astype(np.uint8)
    np.savez(tmp_path / "two.npz", images=images, labels=labels)
    return tmp_path / "two.npz"


MPP_KILLER = """
import os, signal, sys
from vitkit.atomic import unlock_directory
from vitkit.cli import main
from vitkit.train import trainer
stop_at, argv = int(sys.argv[1]), sys.argv[2:]
real = trainer.train_step
def step(state, batch, spec, loss_of=None):
    out = real(state, batch, spec, loss_of)
    if state.step == stop_at:
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill PID` from a scheduler
    return out
trainer.train_step = step
sys.exit(main(argv))
"""


def test_pretrain_mpp_sigterm_saves_exits_and_resumes_bit_identically(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    data = tmp_path / "tiny.npz"
    np.savez(
        data,
        x_train=rng.integers(0, 256, (48, 16, 16, 3), dtype=np.uint8),
        y_train=np.arange(48) % 2,
        x_test=rng.integers(0, 256, (8, 16, 16, 3), dtype=np.uint8),
        y_test=np.arange(8) % 2,
    )

    def command(out: Path) -> list[str]:
        return [
            "pretrain-mpp",
            "--data",
            f"npz:{data}",
            "--recipe",
            "small-32px-tiny",
            "--img-size",
            "16",
            "--epochs",
            "2",
            "--batch-size",
            "8",
            "--set",
            "model.patch_size=4",
            "--set",
            "run.threads=1",
            "--set",
            "run.tensorboard=false",
            "--out",
            str(out),
            "--json",
        ]

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}

    def run(stop_at: int, out: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", MPP_KILLER, str(stop_at), *command(out)], env=env, capture_output=True, text=True
        )

    straight = run(0, tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr[-2000:]
    stopped = run(5, tmp_path / "resumed")
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-2000:]
    summary = json.loads(stopped.stdout.strip().splitlines()[-1])
    assert summary["status"] == "interrupted" and summary["step"] == 5
    assert (tmp_path / "resumed" / "checkpoints" / "LATEST").read_text().strip() == "step_0000005"
    resumed = run(0, tmp_path / "resumed")  # the same command again
    assert resumed.returncode == 0 and json.loads(resumed.stdout.strip().splitlines()[-1])["step"] == 12
    a = load_file(str(tmp_path / "straight" / "checkpoints" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "checkpoints" / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_run_directory_in_use_is_refused(tmp_path: Path) -> None:
    """Two processes on one --out both trained from step 0 and wrote every metrics record twice, or the second
    removed the first's checkpoint in the making and crashed: the directory is locked while a run trains."""
    import pytest

    from vitkit.runs import RunDir

    run = tmp_path / "run"
    config = tiny_config(run, "data.steps=2")
    run.mkdir()
    held = RunDir(run).lock()  # another process's run, as flock sees it (another open file description)
    try:
        with pytest.raises(ValueError, match="is in use by another vitkit process"):
            trainer.train(config)
    finally:
        unlock_directory(held)
    assert trainer.train(config)["status"] == "finished"
    assert trainer.train(config)["status"] == "finished"  # released at the end: the same command again


def test_a_run_config_that_is_no_json_object_is_named_damaged(tmp_path: Path, capsys) -> None:
    """[1, 2, 3] in a run's config.json (its checkpoints intact): an AttributeError traceback from reconcile."""
    run = tmp_path / "run"
    argv = ["train", "--out", str(run), "--set", "data.steps=2", "--set", "run.threads=1"]
    assert main(argv) == 0
    good = (run / "config.json").read_text()
    (run / "config.json").write_text("[1, 2, 3]\n")
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "config.json is not a JSON object" in err and "Traceback" not in err
    stored = json.loads(good)
    damaged = {  # each was a RecursionError, AttributeError or TypeError traceback
        "[" * 100_000 + "]" * 100_000: "is not valid JSON (RecursionError",
        json.dumps({**stored, "data": "digits"}): "is not a JSON object of field groups",
        json.dumps({**stored, "augment": [1, 2]}): "is not a JSON object of field groups",
        json.dumps({**stored, "data": {**stored["data"], "batch_size": "128"}}): "holds a value of the wrong type",
        json.dumps({**stored, "optim": {**stored["optim"], "lr": float("nan")}}): "optim.lr is nan, not a finite",
        json.dumps({**stored, "data": {**stored["data"], "batch_size": 10**15}}): "batch_size of 1,000,000,000,000,000 "
        "is larger than the 1,438 training images of digits",  # had asked for petabytes
    }
    for text, words in damaged.items():
        (run / "config.json").write_text(text)
        assert main(argv) == 2
        assert main(["eval", str(run), "--data", "digits"]) == (2 if "JSON" in words else 0)  # reads the model
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err, err


def test_an_out_that_holds_other_files_is_refused_before_anything_is_written(tmp_path: Path, capsys) -> None:
    """A directory without a run's config.json was taken as a new run: the user's metrics.jsonl and plots were
    replaced, and a data folder given as --out gained checkpoints/ that then failed as a class folder."""
    out = tmp_path / "mine"
    (out / "plots").mkdir(parents=True)
    (out / "metrics.jsonl").write_text("mine\n")
    assert main(["train", "--recipe", "small-8px-tiny", "--epochs", "1", "--out", str(out)]) == 2
    assert "holds files and is not a vitkit run" in capsys.readouterr().err
    assert (out / "metrics.jsonl").read_text() == "mine\n" and sorted(p.name for p in out.iterdir()) == [
        "metrics.jsonl",
        "plots",
    ]


def test_an_out_with_only_hidden_files_or_a_runs_checkpoints_is_taken(tmp_path: Path) -> None:
    """.DS_Store, a .git folder or lost+found made a fresh --out "hold files"; a run whose config.json was
    removed (as the damaged-config error says to) was refused though its checkpoints resume."""
    from vitkit.runs import RunDir

    fresh = tmp_path / "fresh"
    (fresh / ".git").mkdir(parents=True)
    (fresh / ".DS_Store").write_bytes(b"")
    (fresh / "lost+found").mkdir()
    RunDir(fresh).create()
    run = tmp_path / "run"
    trainer.train(tiny_config(run, "data.steps=2"))
    (run / "config.json").unlink()
    RunDir(run).create()


def test_a_run_directory_whose_checkpoints_cannot_be_written_is_refused_before_training(tmp_path: Path) -> None:
    """`checkpoints/` that cannot take a file failed only at the first save, minutes of training later: the
    run is refused at once.  Here it is a file where the directory should be; a read-only one (which root, as
    the tests run, writes through) fails the same probe.  (plots/ is drawn last, and a failure there warns.)"""
    where = "checkpoints"
    run = tmp_path / "run"
    config = tiny_config(run, "data.steps=2")
    trainer.train(config)
    shutil.rmtree(run / where)  # a run's config, no checkpoint: it starts over
    (run / "metrics.jsonl").unlink()
    (run / where).write_text("not a directory")
    with pytest.raises(ValueError, match=rf"{where} cannot be written.*Not a directory"):
        trainer.train(config)
    assert not (run / "metrics.jsonl").exists()  # refused before a step


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root writes in a read-only directory")
def test_a_read_only_checkpoints_directory_is_refused_before_training(tmp_path: Path) -> None:
    run = tmp_path / "run"
    config = tiny_config(run, "data.steps=2")
    trainer.train(config)
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").mkdir()
    (run / "checkpoints").chmod(0o555)
    try:
        with pytest.raises(ValueError, match="checkpoints cannot be written.*Permission denied"):
            trainer.train(config)
    finally:
        (run / "checkpoints").chmod(0o755)


def test_an_out_that_cannot_be_written_is_named_before_anything_is_written(tmp_path: Path, monkeypatch, capsys) -> None:
    """An immutable --out (chattr +i; root ignores permissions) was named by the temporary of its config.json,
    `.config.json.4049f1c36579.tmp: Operation not permitted`, once the data had loaded."""
    import vitkit.runs as runs

    def refused(directory):
        raise PermissionError(errno.EPERM, "Operation not permitted", str(Path(directory) / ".probe.tmp"))

    monkeypatch.setattr(runs.atomic, "check_writable", refused)
    out = tmp_path / "run"
    assert main(["train", "--recipe", "small-8px-tiny", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out} cannot be written (Operation not permitted); choose another --out" in err and ".tmp" not in err
