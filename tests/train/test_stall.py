"""The stall watch: a process of a multi-process run that waits far longer than its steps take says so, once,
while it waits inside a collective, and says when steps go on."""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from helpers import tiny_config

from vitkit.train import trainer
from vitkit.train.stall import MIN_WAIT_S, StallWatch
from vitkit.train.stop import StopPolicy


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_warning_comes_once_after_the_longer_of_the_minimum_and_twenty_longest_gaps(caplog) -> None:
    clock = Clock()
    watch = StallWatch(rank=1, world=2, timeout_minutes=30, now=clock)
    assert watch.overdue() is None  # no step yet: nothing to judge by (start-up, compilation)
    clock.t = 10 * MIN_WAIT_S
    assert watch.overdue() is None
    for t in (1000.0, 1001.0, 1003.0):  # steps of 1 s and 2 s
        clock.t = t
        watch.beat()
    assert watch.longest == 2.0
    clock.t = 1003.0 + MIN_WAIT_S - 0.1
    assert watch.overdue() is None
    clock.t = 1003.0 + MIN_WAIT_S
    message = watch.overdue()
    assert message is not None and message.startswith("process 1 of 2: no step for 5.0 min")
    assert "(the longest wait between two so far: 2.0 s)" in message and "30-minute timeout" in message
    clock.t += 100.0
    assert watch.overdue() is None  # said once
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit.train.stall"):
        watch.beat()
    assert [r.getMessage() for r in caplog.records] == ["process 1: goes on after 6.7 min without a step"]
    assert watch.longest == 2.0  # the stall is not learnt as a step's time
    clock.t += 1.0
    watch.beat()
    clock.t += MIN_WAIT_S
    assert watch.overdue() is not None  # a second stall is said again


def test_slow_steps_raise_the_wait_above_the_minimum() -> None:
    clock = Clock()
    watch = StallWatch(rank=0, world=4, timeout_minutes=30, now=clock)
    watch.beat()
    clock.t = 20.0  # one step of 20 s: the wait is 20 x 20 s = 6.7 min, not 5
    watch.beat()
    clock.t += 399.0
    assert watch.overdue() is None
    clock.t += 1.0
    assert "no step for 6.7 min" in watch.overdue()


def test_the_stop_policy_counts_its_checks_and_evaluation_batches_as_progress() -> None:
    clock = Clock()
    policy = StopPolicy(started=0.0, deadline_s=None, now=clock)
    policy.watch.now = clock
    clock.t = 5.0
    policy.check()
    clock.t = 7.0
    assert policy.pending_signal() == 0
    assert (policy.watch.last, policy.watch.longest) == (7.0, 2.0)


def test_one_long_gap_never_puts_the_warning_past_a_third_of_the_group_timeout() -> None:
    """A 90 s checkpoint write once made 20 x 90 s = the whole 30-minute timeout: no warning could come."""
    clock = Clock()
    watch = StallWatch(rank=1, world=2, timeout_minutes=30, now=clock)
    for t in (0.0, 1.0, 91.0, 92.0):
        clock.t = t
        watch.beat()
    assert watch.longest == 90.0 and watch.patience_s == 600.0
    clock.t = 92.0 + 599.0
    assert watch.overdue() is None
    clock.t += 1.0
    assert "no step for 10.0 min" in watch.overdue()


def test_a_wait_said_as_the_loop_ends_is_said_to_be_over(caplog) -> None:
    clock = Clock()
    with caplog.at_level(logging.WARNING, logger="vitkit.train.stall"):
        with StallWatch(rank=0, world=1, timeout_minutes=30, now=clock) as watch:
            watch.beat()
            clock.t = MIN_WAIT_S
            assert watch.overdue() is not None
            clock.t += 60.0
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2 and said[0].startswith("process 0 of 1: no step for 5.0 min")
    assert said[1] == "process 0: goes on after 6.0 min without a step"


def test_a_loop_that_ends_by_an_error_is_not_said_to_go_on(caplog) -> None:
    """A peer that never came: the collective raises after the group timeout, and the run ends, not goes on."""
    clock = Clock()
    with caplog.at_level(logging.WARNING, logger="vitkit.train.stall"), pytest.raises(RuntimeError):
        with StallWatch(rank=0, world=1, timeout_minutes=30, now=clock) as watch:
            watch.beat()
            clock.t = MIN_WAIT_S
            assert watch.overdue() is not None
            clock.t = 1800.0
            raise RuntimeError("gloo: timed out")
    assert [r.getMessage()[:27] for r in caplog.records] == ["process 0 of 1: no step for"]


def test_after_one_step_the_warning_names_no_longest_wait() -> None:
    clock = Clock()
    watch = StallWatch(rank=0, world=2, timeout_minutes=30, now=clock)
    watch.beat()
    clock.t = MIN_WAIT_S
    assert watch.overdue().startswith("process 0 of 2: no step for 5.0 min: a process of this job may have stopped")


def test_a_watch_entered_again_watches_again_and_names_what_it_waits_for(caplog) -> None:
    """The loop's watch is entered once more for the final save and evaluation, whose batches are its beats."""
    clock = Clock()
    watch = StallWatch(rank=1, world=2, timeout_minutes=30, poll_s=0.01, now=clock)
    with watch:
        watch.beat()
    watch.activity = "final save or evaluation batch"
    with caplog.at_level(logging.WARNING, logger="vitkit.train.stall"), watch:
        assert watch._thread is not None and watch._thread.is_alive()
        clock.t = MIN_WAIT_S
        deadline = time.monotonic() + 30
        while not caplog.records and time.monotonic() < deadline:  # the thread, polling every 10 ms, says it
            time.sleep(0.01)
        clock.t += 1.0
        watch.beat()
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith("process 1 of 2: no final save or evaluation batch for 5.0 min")
    assert said[1:] == ["process 1: goes on after 5.0 min without a final save or evaluation batch"]


def test_a_wait_said_as_the_loop_ended_is_not_said_again_by_the_next_phase(caplog) -> None:
    """A warning standing as the loop ended (a slow last save) was said over: "goes on", then at once "no final
    save or evaluation batch for 6.8 min" from the same old beat."""
    clock = Clock()
    watch = StallWatch(rank=0, world=1, timeout_minutes=30, now=clock)  # no thread: the test asks
    with watch:
        watch.beat()
        clock.t = MIN_WAIT_S
        assert watch.overdue() is not None
        clock.t += 100.0
    watch.activity = "final save or evaluation batch"
    with watch:
        clock.t += 5.0
        assert watch.overdue() is None  # judged from the end of the loop
        clock.t += MIN_WAIT_S
        assert watch.overdue().startswith("process 0 of 1: no final save or evaluation batch for 5.1 min")


def test_a_run_beats_the_watch_at_every_batch_of_its_final_evaluation(tmp_path, monkeypatch) -> None:
    beats: list[str] = []
    real = StallWatch.beat
    monkeypatch.setattr(StallWatch, "beat", lambda watch: (beats.append(watch.activity), real(watch))[1])
    config = tiny_config(tmp_path / "run", "data.steps=3")
    result = trainer.train(config)
    final = [b for b in beats if b != "step"]
    assert result["test"]["count"] == 359 and beats[:3] == ["step"] * 3
    assert final == ["final save or evaluation batch"] * math.ceil(359 / config.eval.batch_size)


def test_one_process_is_not_watched() -> None:
    with StallWatch(rank=0, world=1, timeout_minutes=30) as watch:
        assert watch._thread is None


def _waiting_worker(rank: int, world: int, port: int, out: str) -> None:
    """Rank 1 sleeps before the collective; rank 0 waits in it, and its watch must speak meanwhile."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("vitkit.train.stall").addHandler(handler)
    with StallWatch(rank, world, timeout_minutes=30, min_wait_s=0.5, poll_s=0.05) as watch:
        watch.beat()
        if rank == 1:
            time.sleep(3.0)
        dist.all_reduce(torch.ones(1))
        during = list(said)
        watch.beat()
    Path(out, f"rank{rank}.json").write_text(json.dumps({"during": during, "after": said[len(during) :]}))
    dist.destroy_process_group()


def test_a_process_waiting_in_a_gloo_collective_says_so_while_it_waits(tmp_path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    context = mp.start_processes(
        _waiting_worker, args=(2, port, str(tmp_path)), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + 120
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise AssertionError("the two processes did not finish their collective")
    for rank in (0, 1):  # process 0 while it waited in gloo's all-reduce, process 1 while it slept
        said = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert len(said["during"]) == 1 and said["during"][0].startswith(f"process {rank} of 2: no step for")
        assert len(said["after"]) == 1 and said["after"][0].startswith(f"process {rank}: goes on after")
