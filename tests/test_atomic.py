"""Atomic writes: the file appears whole under its name, with the permissions the user's umask gives."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from safetensors.torch import save_file

from vitkit.atomic import atomic_write, atomic_write_text


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_written_files_get_the_umasks_permissions(tmp_path, umask):
    """As open() would create them (0o666 & ~umask): colleagues in a shared directory can read a checkpoint."""
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
        atomic_write(tmp_path / "b.bin", lambda tmp: tmp.write_bytes(b"x"))
        # safetensors re-creates the file it writes with mode 0o600: the permissions are set after the write
        atomic_write(tmp_path / "c.safetensors", lambda tmp: save_file({"w": torch.zeros(2)}, str(tmp)))
    finally:
        os.umask(old)
    for name in ("a.json", "b.bin", "c.safetensors"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    atomic_write_text(tmp_path / "a.json", "old")

    def fail(tmp):
        tmp.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(tmp_path / "a.json", fail)
    assert (tmp_path / "a.json").read_text() == "old" and os.listdir(tmp_path) == ["a.json"]


def test_a_resume_drops_metrics_lines_that_are_no_records(tmp_path) -> None:
    """A line `[1]`, a step of text, or nesting 100,000 deep in metrics.jsonl ended a resume in a traceback."""
    from vitkit.metrics_log import MetricsLog

    lines = ['{"step": 1, "loss": 2.0}', "[1]", '{"step": "x"}', "[" * 100_000, '{"step": 2}', '{"step": 9}', '{"st']
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    MetricsLog(tmp_path, enabled=True, tensorboard=False).truncate_after(5)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1, "loss": 2.0}\n{"step": 2}\n'


def test_tensorboard_that_cannot_write_is_said_and_the_log_goes_on(tmp_path, monkeypatch, caplog) -> None:
    """Any exception from TensorBoard's writer (a run directory it cannot write included) turned its logging off
    without a word, as if it were not installed."""
    import logging
    import sys
    import types

    from vitkit.metrics_log import MetricsLog

    def refuse(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", types.SimpleNamespace(SummaryWriter=refuse))
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        metrics = MetricsLog(tmp_path, enabled=True, tensorboard=True)
    assert metrics.writer is None and "TensorBoard logging is off: PermissionError: [Errno 13]" in caplog.text

    class Broken(types.ModuleType):  # an install whose import fails otherwise (old tensorboard, new protobuf)
        def __getattr__(self, name):
            raise TypeError("Descriptors cannot be created directly")

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", Broken("torch.utils.tensorboard"))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert MetricsLog(tmp_path, enabled=True, tensorboard=True).writer is None
    assert "TensorBoard logging is off: TypeError: Descriptors cannot be created directly" in caplog.text


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="no fork")
def test_a_killed_process_s_directory_lock_goes_with_it_not_with_its_children(tmp_path) -> None:
    """A run killed with kill -9 left its DataLoader workers, forked with a copy of its lock, alive for about 5 s,
    and a re-run in that time was refused: "in use by another vitkit process".  A forked child drops its copy."""
    import signal
    import subprocess
    import sys
    import textwrap

    from vitkit.atomic import lock_directory, unlock_directory

    script = textwrap.dedent(
        f"""
        import os, signal, sys, time
        from vitkit.atomic import lock_directory
        assert lock_directory({str(tmp_path)!r}) is not None
        child = os.fork()
        if child == 0:
            quiet = os.open(os.devnull, os.O_WRONLY)
            os.dup2(quiet, 1), os.dup2(quiet, 2)  # the test reads the parent's output to its end
            time.sleep(60)
            os._exit(0)
        print(child, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    child = int(done.stdout.split()[0])
    try:
        os.kill(child, 0)  # the child outlives its parent
        descriptor = lock_directory(tmp_path)
        assert descriptor is not None
        unlock_directory(descriptor)
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_written_file_reaches_the_disk_before_its_rename(tmp_path, monkeypatch) -> None:
    """Only directories were flushed: after a power cut the renamed name could stand on an empty file."""
    events = []
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", os.fstat(fd).st_ino)))
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", os.stat(a).st_ino)), real_replace(a, b)))
    atomic_write_text(tmp_path / "a.json", "{}")
    (_, flushed), (_, renamed) = events
    assert events[0][0] == "fsync" and flushed == renamed and (tmp_path / "a.json").read_text() == "{}"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="POSIX permissions, which root passes")
def test_a_file_its_owner_may_not_write_is_still_written(tmp_path) -> None:
    """Under a umask that leaves the owner no write, flushing through a writable descriptor was refused."""
    old = os.umask(0o277)
    try:
        atomic_write_text(tmp_path / "a.json", "{}")
    finally:
        os.umask(old)
    assert (tmp_path / "a.json").read_text() == "{}"


def test_a_full_disk_names_the_file_whoever_raised_it(tmp_path) -> None:
    """safetensors' own error on a full disk named no file ("Error while serializing: I/O error: No space left on
    device (os error 28)"), so a run's message could not say what it was writing."""
    import errno

    def full(tmp):
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    with pytest.raises(OSError) as raised:
        atomic_write(tmp_path / "model.safetensors", full)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(tmp_path / "model.safetensors")
    assert "(os error 28)" in str(raised.value.__cause__) and os.listdir(tmp_path) == []
