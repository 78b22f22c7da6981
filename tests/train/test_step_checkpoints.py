"""Step checkpoints across kills and damage: a resume passes over a step that cannot be read for the one before,
stops on one it may not read now, keeps the step it resumed at, and leaves nothing half-written."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import tiny_config
from safetensors.torch import load_file

import vitkit
from vitkit.runs import RunDir, find_checkpoint
from vitkit.train import trainer


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


def test_a_huge_latest_is_not_read_whole(tmp_path: Path, caplog) -> None:
    """checkpoints/LATEST was read whole: a 5 GB file there (a sparse one costs no disk) ended every verb on the
    run in "out of memory"; it names no step, so the newest complete step is used, with a warning."""
    run = tmp_path / "run"
    trainer.train(tiny_config(run, "data.steps=4", "run.checkpoint_every=2"))
    latest = run / "checkpoints" / "LATEST"
    with open(latest, "r+b") as file:
        file.truncate(5 << 30)
    with caplog.at_level(logging.WARNING):
        assert RunDir(run).latest() == run / "checkpoints" / "step_0000004"
    assert "missing or incomplete" in caplog.text


def _forge_state(path: Path, change) -> None:
    """Rewrite a step's train state with `change(state)` applied, as torch.save writes it."""
    state = torch.load(path, weights_only=True)
    change(state)
    torch.save(state, path)


def _compressed(path: Path) -> None:
    """The same records, deflated: what a hostile train_state.pt of a few MB claiming gigabytes looks like."""
    import zipfile

    with zipfile.ZipFile(path) as source:
        records = [(info.filename, source.read(info)) for info in source.infolist()]
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as packed:
        for name, data in records:
            packed.writestr(name, data)


@pytest.mark.parametrize(
    ("forge", "said"),
    [
        (_compressed, "are compressed; torch.save writes them uncompressed"),
        (
            lambda p: _forge_state(p, lambda s: s["rng"].update(torch=s["rng"]["torch"].float())),
            "torch random stream is not one of this torch",
        ),
        (
            lambda p: _forge_state(p, lambda s: s["data"].update(step=10**9)),
            "data position 1000000000 is not its step 4",
        ),
        (lambda p: _forge_state(p, lambda s: s["data"].update(step=-3)), "data position -3 is not its step 4"),
        (lambda p: p.write_bytes(b""), "EOFError: the file is empty or ends early"),
    ],
)
def test_a_forged_train_state_is_passed_over_by_name(tmp_path: Path, caplog, forge, said: str) -> None:
    """A deflated record inflated whole (2.4 GB from a 2 MB file); a float RNG state ended in a TypeError
    traceback; a data position other than the step cut the run short or trained other batches; an empty file's
    warning gave no reason."""
    from vitkit.runs import STATE_FILE

    run = tmp_path / "run"
    config = tiny_config(run, "data.steps=4", "run.checkpoint_every=2")
    expected = trainer.train(config)["test"]["top1"]
    forge(run / "checkpoints" / "step_0000004" / STATE_FILE)
    (run / "checkpoints" / "final").rename(tmp_path / "final-before")
    with caplog.at_level(logging.WARNING):
        result = trainer.train(config)
    assert "step_0000004 cannot be read" in caplog.text and said in caplog.text, caplog.text
    assert result["status"] == "finished" and result["step"] == 4 and result["test"]["top1"] == expected
