"""DataLoader workers outlive the stop signals their main process handles: Ctrl-C (SIGINT) and torchrun's SIGTERM
reach the whole process group, and a worker that ended on them had ended the run ("DataLoader worker exited
unexpectedly") before the main process saved.  SIGTERM from the main process itself still ends a worker."""

from __future__ import annotations

import multiprocessing
import os
import signal
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.data import workers
from vitkit.data.imageset import ImageSet
from vitkit.data.loader import FileBatches, IndexStream


def _files(tmp_path: Path, count: int = 24) -> ImageSet:
    files = []
    for i in range(count):
        path = tmp_path / f"{i}.png"
        Image.fromarray(np.full((8, 8), i * 10, np.uint8)).save(path)
        files.append(path)
    labels = torch.arange(count) % 2
    return ImageSet(images=None, files=files, labels=labels, class_names=["a", "b"], load_size=8, channels=1)


def _loader_lines(tmp_path: Path, indent: str = "") -> str:
    """Script lines: a SIGTERM handler that notes the signal, and FileBatches of 6 steps with 2 workers."""
    lines = f"""stopped = []
signal.signal(signal.SIGTERM, lambda *_: stopped.append(1))
data = _files(Path({str(tmp_path)!r}))
loader = FileBatches(data, IndexStream(len(data), 0), start_step=0, total_steps=6, global_batch=4, rank=0,
                     world=1, micro_batch=4, device=torch.device("cpu"), workers=2, strict=False)"""
    return textwrap.indent(lines, indent)


def test_ctrl_c_to_the_workers_does_not_end_the_loader(tmp_path: Path) -> None:
    data = _files(tmp_path)
    loader = FileBatches(
        data,
        IndexStream(len(data), 0),
        start_step=0,
        total_steps=6,
        global_batch=4,
        rank=0,
        world=1,
        micro_batch=4,
        device=torch.device("cpu"),
        workers=1,
        strict=False,
    )
    steps = iter(loader)
    seen = [next(steps)]
    workers = multiprocessing.active_children()
    assert workers
    for worker in workers:
        os.kill(worker.pid, signal.SIGINT)
    time.sleep(0.5)  # the signal lands before the next batches are asked for
    seen += list(steps)
    assert len(seen) == 6 and all(worker.is_alive() or worker.exitcode == 0 for worker in workers)


def test_a_process_that_leaves_a_loader_running_still_exits(tmp_path: Path) -> None:
    """Workers that ignored SIGTERM held the process at exit forever: multiprocessing ends a worker still running
    (a loader left mid-iteration, as a budgeted run leaves its batches) with SIGTERM, then waits for it."""
    import subprocess
    import sys

    _files(tmp_path)
    script = f"""
import torch
from pathlib import Path
from tests_data_workers import _files
from vitkit.data.loader import FileBatches, IndexStream
data = _files(Path({str(tmp_path)!r}))
loader = FileBatches(data, IndexStream(len(data), 0), start_step=0, total_steps=6, global_batch=4, rank=0, world=1,
                     micro_batch=4, device=torch.device("cpu"), workers=1, strict=False)
steps = iter(loader)
next(steps)
print("left running")
"""
    (tmp_path / "tests_data_workers.py").write_text(Path(__file__).read_text())
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "left running" in done.stdout, done.stderr


@pytest.mark.parametrize("method", [None, "forkserver", "spawn", "a forked child"])
def test_a_stop_signal_to_the_process_group_leaves_the_workers_to_the_main_process(tmp_path: Path, method) -> None:
    """torchrun, systemd and `kill -TERM -PGID` signal the whole process group: the workers must go on serving the
    main process, which saves at the step and then ends them itself (SIGTERM from their parent still ends them).
    Under a forkserver default (Python 3.14's on Linux) the workers had threads the block did not reach; in a
    process forked from the one that imported vitkit, the workers were not taken for the main process's.  Spawned
    workers (chosen, as CUDA in a worker needs) kept torch's default."""
    import subprocess
    import sys

    if method not in (None, "a forked child") and method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {method} start method here")
    _files(tmp_path)
    script = f"""
import multiprocessing, signal, sys, time, torch
if {method!r} in ("spawn", "forkserver"):
    multiprocessing.set_start_method({method!r}, force=True)
from pathlib import Path
from tests_data_workers import _files
from vitkit.data.loader import FileBatches, IndexStream

def main():
{_loader_lines(tmp_path, "    ")}
    steps = iter(loader)
    seen = [next(steps)]
    print("ready", flush=True)
    while not stopped:
        time.sleep(0.05)
    time.sleep(0.5)  # the signal has reached the workers too
    seen += list(steps)
    print("read", len(seen), flush=True)

if {method!r} == "a forked child":  # the loader in a process forked after the import
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = multiprocessing.get_context("fork").Process(target=main)
    child.start()
    child.join()
    sys.exit(child.exitcode)
main()
"""
    (tmp_path / "tests_data_workers.py").write_text(Path(__file__).read_text())
    run = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert run.stdout is not None and run.stdout.readline().strip() == "ready"
    os.killpg(run.pid, signal.SIGTERM)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 0 and out.split() == ["read", "6"], err


def test_a_stop_signal_during_a_workers_start_up_waits_for_its_init(tmp_path: Path) -> None:
    """A process-group SIGTERM between a worker's fork and its `worker_init_fn` ended the worker (torch's default)
    and with it the run ("DataLoader worker is killed by signal: Terminated"): seen under load, where one worker
    still started while the other had served the first batch.  Here a worker sends the group's SIGTERM itself,
    before its init runs; the workers are forked with the stop signals blocked, so it waits for the init."""
    import subprocess
    import sys

    if not workers.TELLS_SENDER:
        pytest.skip("no sigwaitinfo or no fork here: workers keep torch's default SIGTERM")
    _files(tmp_path)
    script = f"""
import os, signal, time, torch
from pathlib import Path
from tests_data_workers import _files
from vitkit.data import workers
from vitkit.data.loader import FileBatches, IndexStream

real = workers.outlive_stop_signals
def late(worker_id):
    if worker_id == 1:
        os.killpg(os.getpgid(0), signal.SIGTERM)  # the group's stop signal, before this worker's init
        time.sleep(0.3)
    real(worker_id)
workers.outlive_stop_signals = late

{_loader_lines(tmp_path)}
seen = list(loader)
time.sleep(0.1)
print("read", len(seen), "stopped", len(stopped), flush=True)
"""
    (tmp_path / "tests_data_workers.py").write_text(Path(__file__).read_text())
    run = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )
    assert run.returncode == 0 and run.stdout.split() == ["read", "6", "stopped", "1"], run.stderr


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_stop_signal_to_the_group_as_the_workers_start_waits_for_their_init(tmp_path: Path, method) -> None:
    """The group's SIGTERM, from another process, 0.2 s after the loader starts its workers, while a spawned worker
    still imports torch: spawned workers started with the signal unblocked and died of it.  (Forked workers
    start in milliseconds: for them it comes after the first batch.)"""
    import subprocess
    import sys

    if not workers.TELLS_SENDER or method not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no sigwaitinfo or no {method} here")
    _files(tmp_path)
    script = f"""
import multiprocessing, os, signal, subprocess, time, torch
multiprocessing.set_start_method({method!r}, force=True)
from pathlib import Path
from tests_data_workers import _files
from vitkit.data.loader import FileBatches, IndexStream

if __name__ == "__main__":
{_loader_lines(tmp_path, "    ")}
    subprocess.Popen(["sh", "-c", "sleep 0.2; kill -TERM -" + str(os.getpgid(0))])  # not the workers' parent
    steps = iter(loader)
    seen = [next(steps)]  # spawned: the signal came while the workers started; forked: it comes now
    deadline = time.monotonic() + 60
    while not stopped and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # the signal has reached the workers too
    seen += list(steps)
    print("read", len(seen), "stopped", len(stopped), flush=True)
"""
    (tmp_path / "tests_data_workers.py").write_text(Path(__file__).read_text())
    (tmp_path / "script.py").write_text(script)
    run = subprocess.run(
        [sys.executable, "script.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120, start_new_session=True
    )
    assert run.returncode == 0 and run.stdout.split() == ["read", "6", "stopped", "1"], run.stderr


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork here (Windows)")
def test_a_worker_that_cannot_tell_the_sender_leaves_the_process_group() -> None:
    """Where SIGTERM's sender cannot be told (macOS, a forkserver's workers), a signal to the group ended a
    worker at any time; it now leaves the group once started, and still takes SIGTERM (from its parent)."""
    context = multiprocessing.get_context("fork")
    answer = context.Queue()
    child = context.Process(target=_init_as_a_worker_that_cannot_tell, args=(answer,))
    child.start()
    pgid, ignored_sigint, blocked = answer.get(timeout=60)
    child.join(60)
    assert pgid == child.pid != os.getpgid(0) and ignored_sigint and not blocked and child.exitcode == 0


def _init_as_a_worker_that_cannot_tell(answer) -> None:
    workers.TELLS_SENDER = False  # in this child only
    signal.pthread_sigmask(signal.SIG_BLOCK, workers.STOP_SIGNALS)  # as `started` leaves a worker
    workers.outlive_stop_signals(0)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    answer.put((os.getpgid(0), signal.getsignal(signal.SIGINT) is signal.SIG_IGN, bool(mask & workers.STOP_SIGNALS)))
