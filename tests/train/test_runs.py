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


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(tmp_path: Path, caplog) -> None:
    """LATEST naming a missing step, or one without its state, or a path outside the run: the resume stopped
    with "remove LATEST to start over", and following it pruned the intact older steps and the metrics.
    Resuming now takes the newest complete step, and the verbs that read a model read the final export."""
    import shutil

    from vitkit.runs import LATEST, STATE_FILE, RunDir

    run = tmp_path / "run"
    trainer.train(tiny_config(run, "data.steps=6", "run.checkpoint_every=2"))
    checkpoints = run / "checkpoints"
    (checkpoints / "step_0000006" / STATE_FILE).unlink()  # the newest, without its state
    directory = RunDir(run)
    with caplog.at_level(logging.WARNING):
        assert directory.latest() == checkpoints / "step_0000004"
        assert RunDir(run).latest() == checkpoints / "step_0000004"  # said once: a resume reads LATEST six times
    assert caplog.text.count("'step_0000006', which is missing or incomplete; using step_0000004") == 1
    for named in ("../../elsewhere/step_0000002", "", "step_9999999"):
        (checkpoints / LATEST).write_text(named + "\n")
        assert directory.latest() == checkpoints / "step_0000004"
        assert find_checkpoint(run) == checkpoints / "final"  # eval, predict and serve read the final model
    shutil.rmtree(checkpoints / "step_0000004")
    assert directory.latest() == checkpoints / "step_0000002"
    shutil.rmtree(checkpoints / "step_0000002")
    with pytest.raises(ValueError, match="no other step checkpoint is complete; remove .* to start over"):
        directory.latest()


def test_a_newest_checkpoint_with_damaged_files_is_resumed_from_the_step_before(tmp_path: Path, caplog) -> None:
    """A newest step whose weights no longer match their SHA-256 (a truncated copy), or whose train state is
    cut short, stopped the resume with the reader's error, though the step before was intact.  The resume
    now takes the newest step that reads, says which it passed over, trains to the same weights, and writes
    the damaged step again."""
    from vitkit.runs import STATE_FILE

    run = tmp_path / "run"
    config = tiny_config(run, "data.steps=6", "run.checkpoint_every=2")
    trainer.train(config)
    final = run / "checkpoints" / "final" / "model.safetensors"
    expected = load_file(str(final))
    newest = run / "checkpoints" / "step_0000006"
    for damaged in (newest / "model.safetensors", newest / STATE_FILE):
        content = damaged.read_bytes()
        damaged.write_bytes(content[: len(content) // 2])
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert trainer.train(config)["status"] == "finished"
        assert "step_0000006 cannot be read" in caplog.text and "resuming from step_0000004" in caplog.text
        again = load_file(str(final))
        assert expected.keys() == again.keys() and all(torch.equal(expected[k], again[k]) for k in expected)
        assert vitkit.load(newest) is not None and len(damaged.read_bytes()) == len(content)  # written again
    off_cadence = run / "checkpoints" / "step_0000007"  # a signal's step, which no later save writes again
    shutil.copytree(newest, off_cadence)
    (off_cadence / STATE_FILE).write_bytes(b"cut")
    (run / "checkpoints" / "LATEST").write_text("step_0000007\n")
    assert trainer.train(config)["status"] == "finished"
    assert not off_cadence.exists() and (run / "checkpoints" / "step_0000004").is_dir()  # it had outlived 4
    assert (run / "checkpoints" / "unreadable-step_0000007" / "model.safetensors").is_file()  # set aside, not lost
    for step in run.glob("checkpoints/step_*"):
        (step / STATE_FILE).write_bytes(b"")
    with pytest.raises(ValueError, match="no step checkpoint of .* can be read.*Remove .*LATEST to start the run over"):
        trainer.train(config)


@pytest.mark.parametrize(
    ("error", "cure"),
    [
        (PermissionError(13, "Permission denied"), "give this user read access"),
        (OSError(errno.EIO, "Input/output error"), "once the storage reads it"),
        (OSError(errno.ESTALE, "Stale file handle"), "once the storage reads it"),
    ],
)
def test_a_newest_checkpoint_that_cannot_be_read_for_now_stops_the_resume(
    tmp_path: Path, monkeypatch, error: OSError, cure: str
) -> None:
    """A step whose files are intact but not readable now (this user's permissions; a storage error such as
    EIO on a failing disk or a network file system) was passed over like a damaged one: the run stepped back
    and trained again what it had, when the cure is a chmod or a retry."""
    from vitkit.runs import RunDir

    run = tmp_path / "run"
    config = tiny_config(run, "data.steps=6", "run.checkpoint_every=2")
    trainer.train(config)
    newest = run / "checkpoints" / "step_0000006"
    before = os.stat(newest / "model.safetensors").st_ino
    read_state = RunDir.read_state

    def denied(path: Path):
        if path.name == newest.name:
            raise type(error)(error.errno, error.strerror, str(path / "train_state.pt"))
        return read_state(path)

    monkeypatch.setattr(RunDir, "read_state", staticmethod(denied))
    with pytest.raises(ValueError, match=rf"step_0000006.*{error.strerror}.*{cure}"):
        trainer.train(config)
    assert os.stat(newest / "model.safetensors").st_ino == before  # not written again


def test_a_finished_run_re_run_does_not_write_its_last_step_again(tmp_path: Path) -> None:
    """Re-saving a step removed the complete copy before the new one took its name: a kill between the two
    left LATEST naming nothing.  The same step, already complete, is not written again."""
    run = tmp_path / "run"
    config = tiny_config(run, "data.steps=4", "run.checkpoint_every=2")
    trainer.train(config)
    weights = run / "checkpoints" / "step_0000004" / "model.safetensors"
    before = os.stat(weights).st_ino
    again = trainer.train(config)
    assert again["status"] == "finished" and os.stat(weights).st_ino == before


def test_a_resume_hashes_the_step_it_resumes_from_once(tmp_path: Path, monkeypatch) -> None:
    """The step a re-run resumed from was hashed when it was loaded and again when the run kept it (a second
    read of the whole weights file: about a second for a ViT-B)."""
    from vitkit.checkpoints import native

    run = tmp_path / "run"
    config = tiny_config(run, "data.steps=4", "run.checkpoint_every=2")
    trainer.train(config)
    hashed = []
    real = native._sha256

    def counting(path):
        hashed.append(Path(path).resolve())
        return real(path)

    monkeypatch.setattr(native, "_sha256", counting)
    assert trainer.train(config)["status"] == "finished"
    weights = (run / "checkpoints" / "step_0000004" / "model.safetensors").resolve()
    assert hashed.count(weights) == 1


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
        RunDir.unlock(held)
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


def test_a_kill_during_the_final_export_leaves_no_temporary_files_after_the_re_run(tmp_path: Path) -> None:
    """A kill while checkpoints/final was written left .model.safetensors.<hex>.tmp and a .tmpXXXX of 340 MB
    beside it, which no later run removed."""
    run = tmp_path / "run"
    config = tiny_config(run, "data.steps=2")
    trainer.train(config)
    final = run / "checkpoints" / "final"
    (final / ".model.safetensors.0123456789ab.tmp").write_bytes(b"\0" * 1000)
    (final / ".tmpzDsHAc").write_bytes(b"\0" * 1000)
    (final / "notes.txt").write_text("mine\n")  # not vitkit's: kept
    trainer.train(config)  # a re-run of the finished run exports again
    assert sorted(p.name for p in final.iterdir()) == ["config.json", "model.safetensors", "notes.txt"]


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


def test_a_damaged_step_is_written_again_by_a_later_process_too(tmp_path: Path) -> None:
    """The mark that a step was unreadable lived in one process: a run restarted over damaged steps (all of
    them, LATEST removed as the error says) kept them, SHA mismatch and all, and LATEST named one."""
    from vitkit.runs import LATEST, RunDir

    run = tmp_path / "run"
    config = tiny_config(run, "data.steps=4", "run.checkpoint_every=2")
    trainer.train(config)
    expected = load_file(str(run / "checkpoints" / "final" / "model.safetensors"))
    for step in run.glob("checkpoints/step_*"):
        weights = step / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    (run / "checkpoints" / LATEST).unlink()
    trainer.train(config)
    again = load_file(str(run / "checkpoints" / "final" / "model.safetensors"))
    assert all(torch.equal(expected[k], again[k]) for k in expected)
    assert all(RunDir._reads(step) for step in run.glob("checkpoints/step_*"))


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


def test_a_step_checkpoint_on_a_full_disk_is_named_and_leaves_nothing(tmp_path: Path, monkeypatch) -> None:
    """torch.save on a full disk raises "[enforce fail at inline_container.cc] unexpected pos": it reached the
    user as a traceback, and the step's temporary directory stayed on the full disk."""
    import errno
    from collections import namedtuple

    from vitkit import runs
    from vitkit.runs import RunDir

    def full(payload, path):
        Path(path).write_bytes(b"x" * 100)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 862528 vs 862416")

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(runs.torch, "save", full)
    monkeypatch.setattr(runs.shutil, "disk_usage", lambda path: usage(3 << 20, 3 << 20, 4096))
    directory = RunDir(tmp_path / "run")
    with pytest.raises(OSError) as raised:
        directory.save_step(2, lambda tmp: (tmp.mkdir(), (tmp / "model.safetensors").write_bytes(b"m")), {})
    assert raised.value.errno == errno.ENOSPC and "inline_container" in str(raised.value)
    assert not list((tmp_path / "run" / "checkpoints").glob(".step_*"))  # the temporary step is gone
    monkeypatch.setattr(runs.shutil, "disk_usage", lambda path: usage(3 << 30, 1 << 30, 2 << 30))
    with pytest.raises(RuntimeError, match="inline_container"):  # room on the disk: torch's own error
        directory.save_step(2, lambda tmp: (tmp.mkdir(), (tmp / "model.safetensors").write_bytes(b"m")), {})


def test_a_re_run_at_an_existing_step_still_keeps_only_the_newest_steps(tmp_path: Path) -> None:
    """A kill after a step's save and before its pruning left one step too many, which the re-run kept."""
    from vitkit.runs import KEEP

    run = tmp_path / "run"
    config = tiny_config(run, "data.steps=8", "run.checkpoint_every=2")
    trainer.train(config)
    checkpoints = run / "checkpoints"
    shutil.copytree(checkpoints / f"step_{8 - 2 * KEEP:07d}", checkpoints / f"step_{8 - 2 * (KEEP + 1):07d}")
    trainer.train(config)  # finished: it meets step 8 again
    assert len(list(checkpoints.glob("step_*"))) == KEEP + 1


def test_a_re_run_removes_what_a_kill_left_half_written_in_the_run_directory(tmp_path: Path) -> None:
    """A kill while the curves were drawn left plots/.curves.png.HEX.tmp, and no later run removed it."""
    run = tmp_path / "run"
    config = tiny_config(run, "data.steps=2")
    trainer.train(config)
    torn = [run / "plots" / ".curves.png.0123456789ab.tmp", run / ".metrics.jsonl.0123456789ab.tmp"]
    for path in torn:
        path.write_bytes(b"")
    trainer.train(config)
    assert not any(path.exists() for path in torn) and (run / "plots" / "curves.png").is_file()


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


def test_a_storage_error_on_the_newest_step_s_config_stops_the_resume(tmp_path: Path, monkeypatch) -> None:
    """EIO reading the newest step's config.json, the first file a resume reads, took the step for incomplete:
    the run stepped back and trained its steps again."""
    from vitkit.checkpoints import validate

    run = tmp_path / "run"
    config = tiny_config(run, "data.steps=6", "run.checkpoint_every=2")
    trainer.train(config)
    newest = run / "checkpoints" / "step_0000006"
    before = os.stat(newest / "model.safetensors").st_ino
    real_open = open

    def failing(path, *args, **kwargs):
        if Path(path) == newest / "config.json":
            raise OSError(errno.EIO, "Input/output error", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(validate, "open", failing, raising=False)
    with pytest.raises(ValueError, match=r"step_0000006 cannot be read \(Input/output error\): a storage error"):
        trainer.train(config)
    assert os.stat(newest / "model.safetensors").st_ino == before  # not written again


def test_a_finished_run_made_longer_in_its_config_trains_to_its_new_length(tmp_path: Path) -> None:
    """It had planned "the remaining 2 of 4 steps", taken none, and reported finished at 2/4."""
    run = tmp_path / "run"
    assert trainer.train(tiny_config(run, "data.steps=2"))["step"] == 2
    stored = json.loads((run / "config.json").read_text())
    stored["data"]["steps"] = 4
    (run / "config.json").write_text(json.dumps(stored))
    result = trainer.train(tiny_config(run, "data.steps=2"))
    assert (result["status"], result["step"], result["steps"]) == ("finished", 4, 4)


class _Payload:
    """What a hostile train state pickles: an object the weights-only unpickler must refuse, never build."""

    def __reduce__(self):
        return (print, ("unpickled",))


def test_a_train_state_of_pickled_objects_is_passed_over_without_torchs_advice(tmp_path: Path, caplog) -> None:
    """The warning had carried torch's "Re-running torch.load with weights_only set to False will likely
    succeed": advice to unpickle the file unrestricted."""
    from vitkit.runs import STATE_FILE

    run = tmp_path / "run"
    config = tiny_config(run, "data.steps=4", "run.checkpoint_every=2")
    trainer.train(config)
    torch.save({"step": _Payload()}, run / "checkpoints" / "step_0000004" / STATE_FILE)
    with caplog.at_level(logging.WARNING):
        assert trainer.train(config)["status"] == "finished"
    assert "step_0000004 cannot be read (it holds pickled objects other than tensors, refused unread" in caplog.text
    assert "weights_only" not in caplog.text and "likely succeed" not in caplog.text
