"""The stop policy: signals, the time budget and checkpoints by the clock, and how processes agree on them."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from vitkit.train import stop as stop_module
from vitkit.train.stop import SignalFlag, StopPolicy, Verdict


# ---------------------------------------------------------------------------------- stop policy
class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_stop_policy_with_a_fake_clock_and_fake_signals() -> None:
    clock, signals = FakeClock(), SignalFlag()
    policy = StopPolicy(started=100.0, deadline_s=10.0, signals=signals, now=clock)
    assert policy.check() == Verdict(None, False)
    clock.now = 110.0
    assert policy.check() == Verdict("time_budget")
    signals.signum = signal.SIGTERM  # a signal wins over the budget
    assert policy.check().stop == "interrupted" and policy.signum == signal.SIGTERM
    assert StopPolicy(started=0.0, deadline_s=None, now=lambda: 1e9).check().stop is None  # no budget: never


def test_a_checkpoint_is_due_when_its_minutes_have_passed_since_the_last_one() -> None:
    clock = FakeClock()
    policy = StopPolicy(started=0.0, deadline_s=None, checkpoint_s=60.0, now=clock)
    assert policy.check(saved_at=41.0) == Verdict(None, False)  # 59 s since the last checkpoint
    assert policy.check(saved_at=40.0) == Verdict(None, True)  # 60 s
    assert policy.check(agree=False, saved_at=0.0) == Verdict(None, False)  # read at agreement steps alone
    assert not StopPolicy(started=0.0, deadline_s=None, now=clock).check(saved_at=0.0).save  # 0 minutes: off


def test_the_budget_and_the_checkpoint_minutes_are_judged_at_one_reading_of_the_clock() -> None:
    """One check reads the clock once: a reading that puts the checkpoint minutes behind it also puts the
    deadline behind it, so a step never saves for the clock yet trains on past the budget."""
    readings = iter([109.0, 110.0])
    policy = StopPolicy(started=100.0, deadline_s=10.0, checkpoint_s=10.0, now=lambda: next(readings))
    assert policy.check(saved_at=100.0) == Verdict(None, False)  # 9 s of both at the one reading
    assert policy.check(saved_at=100.0) == Verdict("time_budget", True)


class Peer:
    """The other process of two: its signal, pace and reasons, combined with this one's as `max_each` does."""

    def __init__(self) -> None:
        self.signum, self.pace, self.out_of_time, self.save = 0, 0.0, False, False
        self.asked: list[list[float]] = []

    def max_each(self, values: list[float], device: torch.device) -> list[float]:
        self.asked.append(list(values))
        theirs = [self.signum, self.pace, float(self.out_of_time), float(self.save)][: len(values)]
        return [max(mine, other) for mine, other in zip(values, theirs)]


def test_processes_agree_on_their_reasons_at_agreement_steps_in_one_collective(monkeypatch) -> None:
    peer, clock = Peer(), FakeClock()
    monkeypatch.setattr(stop_module.distributed, "max_each", peer.max_each)
    policy = StopPolicy(started=100.0, deadline_s=10.0, checkpoint_s=60.0, world=2, now=clock)
    peer.out_of_time = True  # the peer is out of time; this process is not
    assert policy.check(agree=True, saved_at=100.0) == Verdict("time_budget")  # at one, every process stops
    peer.out_of_time, peer.save = False, True  # the peer's clock has passed the checkpoint minutes; this one's not
    assert policy.check(agree=True, saved_at=100.0) == Verdict(None, True)  # both save at this step
    peer.signum = signal.SIGTERM
    assert policy.check(agree=True, saved_at=100.0).stop == "interrupted" and policy.signum == signal.SIGTERM
    assert len(peer.asked) == 3 and all(len(values) == 4 for values in peer.asked)  # one collective per step


def test_between_agreement_steps_processes_agree_on_a_signal_every_few_seconds(monkeypatch) -> None:
    """torchrun kills its processes 30 s after its SIGTERM: a signal must not wait for the next log step."""
    peer, clock = Peer(), FakeClock()
    monkeypatch.setattr(stop_module.distributed, "max_each", peer.max_each)
    policy = StopPolicy(started=100.0, deadline_s=1.0, checkpoint_s=60.0, world=2, now=clock)
    peer.out_of_time = True  # a peer's deadline and clock checkpoints wait for agreement steps
    peer.pace = 0.5  # the peer is the slower: SIGNAL_AGREE_S / 0.5 steps between agreements
    checks = []
    for _ in range(25):
        clock.now += 0.25  # this process's own pace
        checks.append(len(peer.asked))
        assert policy.check(agree=False, saved_at=0.0) == Verdict()
    asked_at = [i for i in range(1, 25) if checks[i] > checks[i - 1]]  # the steps after which a collective ran
    every = int(stop_module.SIGNAL_AGREE_S / 0.5)
    assert asked_at == [1, 2, 2 + every, 2 + 2 * every] and all(len(values) == 2 for values in peer.asked)
    peer.signum = signal.SIGTERM
    verdicts = [policy.check(agree=False, saved_at=0.0) for _ in range(every)]
    assert [verdict.stop for verdict in verdicts].count("interrupted") == 1  # within one cadence, not a log step
    assert policy.signum == signal.SIGTERM and policy.signals.signum == 0


def test_real_sigterm_is_caught_while_installed_and_handlers_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with StopPolicy(started=0.0, deadline_s=None) as policy:
        os.kill(os.getpid(), signal.SIGTERM)
        assert policy.check().stop == "interrupted"
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_clock_that_does_not_move_between_steps_keeps_a_cadence(monkeypatch) -> None:
    """A clock coarser than a step reads 0 s a step: the cadence is then SIGNAL_AGREE_S a millisecond a step, not
    a million steps (a signal would have waited for a log step)."""
    peer, clock = Peer(), FakeClock()
    monkeypatch.setattr(stop_module.distributed, "max_each", peer.max_each)
    policy = StopPolicy(started=100.0, deadline_s=None, world=2, now=clock)
    for _ in range(2):  # the first agreement has no pace yet; the second measures 0 s a step
        policy.check(agree=False)
    assert policy._signal_every == int(stop_module.SIGNAL_AGREE_S / 1e-3)


def test_a_second_ctrl_c_stops_at_once_and_the_first_is_said_at_once(capfd) -> None:
    """The first stop signal is acknowledged when it lands (the save waits for the step's end); a Ctrl-C a second
    or more after it raises there and then, as a step that never ends would otherwise hold the run until SIGKILL.
    The same stop delivered twice (to the process and to its group) or a later SIGTERM does not escalate."""
    clock = FakeClock()
    flag = SignalFlag(escalate=True, said=stop_module.STOPPING, now=clock)
    with StopPolicy(started=0.0, deadline_s=None, signals=flag):
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.signum == signal.SIGTERM and "another Ctrl-C stops at once" in capfd.readouterr().err
        clock.now += 0.5
        os.kill(os.getpid(), signal.SIGINT)  # within a second: the same stop, forwarded
        clock.now += 5.0
        os.kill(os.getpid(), signal.SIGTERM)  # a scheduler's SIGTERM again: it waits for the save
        assert flag.signum == signal.SIGTERM and capfd.readouterr().err == ""
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    quiet = SignalFlag()  # a flag that does not escalate (the run's final record) keeps the last signal
    with quiet:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
    assert quiet.signum == signal.SIGTERM and capfd.readouterr().err == ""


def test_a_broken_stderr_does_not_cost_the_save(monkeypatch) -> None:
    """`vitkit train 2>&1 | tee log`: the terminal's Ctrl-C ends tee first, and the acknowledgement's write to the
    broken pipe raised out of the handler, ending the run without its checkpoint."""

    def broken(fd, data):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(stop_module.os, "write", broken)
    with StopPolicy(started=0.0, deadline_s=None) as policy:
        os.kill(os.getpid(), signal.SIGINT)
        assert policy.check().stop == "interrupted"


def test_another_process_escalates_without_saying_it(capfd) -> None:
    clock = FakeClock()
    with StopPolicy(started=0.0, deadline_s=None, world=2, rank=1) as policy:
        policy.signals.now = clock
        os.kill(os.getpid(), signal.SIGINT)
        assert policy.signals.signum == signal.SIGINT and capfd.readouterr().err == ""
        clock.now += 1.0
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
