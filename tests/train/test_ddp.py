"""Two gloo processes with B/2 each end with the same weights as one process with B (DDP + sharding), a
budget fitted on two processes ends annealed on both at the same step, and two processes stopped and resumed
end with the weights of an uninterrupted run (every rank's RNG resumes)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from helpers import FakeTime, tiny_config
from safetensors.torch import load_file

from vitkit.data.loader import IndexStream, micro_batches
from vitkit.runs import RunDir
from vitkit.train import distributed, trainer

# SGD: Adam would turn ~1e-10 all-reduce rounding in gradients that are zero in exact arithmetic
# (the key bias's) into steps of size lr, so it compares replicas, not the method.
# fp32: the comparison is of the method; bf16 rounds weight gradients per micro-batch shape.
ARGS = (
    "run.device=cpu",  # gloo processes, also on a machine with a GPU (the CUDA variant below overrides it)
    "run.precision=fp32",
    "optim.name=sgd",
    "optim.lr=0.05",
    "data.steps=4",
    "data.batch_size=16",
    "model.dropout=0.0",
    "augment.crop=none",
    "augment.flip=false",
    "run.checkpoint_every=100",
    "optim.warmup_steps=1",
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str, *extra: str) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    lrs: list[float] = []
    if extra:  # a budgeted run: each process reads its own fake clock, which runs at its own pace, so the
        trainer.time = FakeTime(tick=0.01 + 0.005 * rank)  # start-up each measures, and its elapsed time, differ
        real_step = trainer.train_step

        def step(state, batch, spec, loss_of):  # the learning rate of every step this process takes
            lrs.append(spec.lr)
            return real_step(state, batch, spec, loss_of)

        trainer.train_step = step
    result = {**trainer.train(tiny_config(Path(out), *ARGS, *extra)), "lrs": lrs}
    (Path(out).parent / f"result_{rank}.json").write_text(json.dumps(result, default=str))
    distributed.leave(0)  # as the command line ends a torchrun process (a finalizing interpreter can abort)


def _stopped_worker(rank: int, world: int, port: int, out: str, stop_at: int, *extra: str) -> None:
    """Train as `_worker` does (without a fake clock), sending SIGTERM to rank 1 after step `stop_at` (0: never),
    as a scheduler's preemption of one process would: every process stops there."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    real_step = trainer.train_step

    def step(state, batch, spec, loss_of):
        out = real_step(state, batch, spec, loss_of)
        if state.step == stop_at and rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    trainer.train_step = step
    result = trainer.train(tiny_config(Path(out), *ARGS, *extra))
    (Path(out).parent / f"result_{rank}.json").write_text(json.dumps(result, default=str))
    distributed.leave(0)


def _sweep_worker(rank: int, world: int, port: int, out: str) -> None:
    """An LR sweep of three trials and its final run on every process, one process group for all of them."""
    from vitkit.train.sweep import train_with_sweep

    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    config = tiny_config(Path(out), *ARGS, "data.val_fraction=0.2", "optim.lr_sweep=0.01,0.05,0.1")
    result = train_with_sweep(config)
    (Path(out).parent / f"result_{rank}.json").write_text(json.dumps(result, default=str))
    distributed.leave(0)


def _disagreeing_worker(rank: int, world: int, port: int, out: str) -> None:
    """Rank 1 launched with another learning rate and a smaller data set than rank 0: each writes its error."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    own = ["optim.lr=0.5", "data.train_fraction=0.5"] if rank else []
    try:
        trainer.train(tiny_config(Path(out), *ARGS, *own))
        said = "trained"
    except ValueError as error:
        said = str(error)
    (Path(out).parent / f"result_{rank}.json").write_text(json.dumps(said))
    distributed.leave(0)


def _locked_out_worker(rank: int, world: int, port: int, out: str) -> None:
    """Both ranks launched on a run directory another vitkit process holds: each writes its error."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    try:
        trainer.train(tiny_config(Path(out), *ARGS))
        said = "trained"
    except ValueError as error:
        said = str(error)
    (Path(out).parent / f"result_{rank}.json").write_text(json.dumps(said))
    distributed.leave(0)


def _infinite_loss_worker(rank: int, world: int, port: int, out: str) -> None:
    """Rank 1's loss is infinite at step 2 while its gradients stay finite (a constant added): each process writes
    the steps it skipped and its replica's weights."""
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    real_step, skipped, replicas = trainer.train_step, [], []

    def step(state, batch, spec, loss_of):
        def infinite_once(model, micro):
            loss, metrics = loss_of(model, micro)
            return (loss + float("inf"), metrics) if rank == 1 and state.step == 1 else (loss, metrics)

        result = real_step(state, batch, spec, infinite_once if loss_of else None)
        skipped.append(bool(result["skipped"]))
        replicas.append(state.module)
        return result

    trainer.train_step = step
    trainer.train(tiny_config(Path(out), *ARGS))
    weights = torch.cat([p.detach().reshape(-1) for p in replicas[-1].parameters()])
    (Path(out).parent / f"result_{rank}.json").write_text(json.dumps({"skipped": skipped, "sum": weights.sum().item()}))
    distributed.leave(0)


def _spawn(world: int, out: Path, *extra: str | int, timeout_s: float = 240.0, worker=_worker) -> None:
    """Run `worker` on `world` gloo processes; a process that waits on a collective its peer never reaches
    (ranks disagreeing on when to stop) fails the test at the timeout instead of hanging it."""
    context = mp.start_processes(
        worker, args=(world, _free_port(), str(out), *extra), nprocs=world, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the {world} processes did not finish within {timeout_s:.0f} s")


@pytest.mark.dist
def test_an_lr_sweep_on_two_processes_runs_every_trial_and_its_final_run(tmp_path: Path) -> None:
    """Each trial had left the process group and joined it again: the next trial's DDP hung in its first
    broadcast under torchrun."""
    _spawn(2, tmp_path / "sweep", worker=_sweep_worker, timeout_s=180.0)
    results = [json.loads((tmp_path / f"result_{rank}.json").read_text()) for rank in (0, 1)]
    assert [sorted(r["sweep"]) for r in results] == [["0.01", "0.05", "0.1"]] * 2
    assert results[0]["best_lr"] == results[1]["best_lr"] and results[0]["status"] == "finished"
    assert results[0]["test"] == results[1]["test"]  # one final run, the whole split's figures on both


@pytest.mark.dist
def test_a_run_directory_in_use_is_named_by_process_0_and_not_taken_for_a_dead_peer(tmp_path: Path) -> None:
    """Rank 1 waited for rank 0, which alone takes the lock, and said "another process of this torchrun job
    ended ... re-run the same command to resume it" when rank 0 left with the real reason."""
    run = RunDir(tmp_path / "run")
    run.create()
    descriptor = run.lock()  # another vitkit process training there
    try:
        _spawn(2, tmp_path / "run", worker=_locked_out_worker, timeout_s=120.0)
    finally:
        from vitkit.atomic import unlock_directory

        unlock_directory(descriptor)
    said = [json.loads((tmp_path / f"result_{rank}.json").read_text()) for rank in (0, 1)]
    assert "is in use by another vitkit process" in said[0]
    assert said[1] == "process 0 could not lock the run directory (its message says why); nothing was trained"


@pytest.mark.dist
def test_processes_launched_with_other_flags_or_data_are_refused_before_training(tmp_path: Path) -> None:
    """Rank 1 given another --lr trained a replica of its own beside rank 0's, and the run reported figures of no
    one model; given another data directory, it drew another hold-out.  Every process now says what differs."""
    _spawn(2, tmp_path / "run", worker=_disagreeing_worker, timeout_s=120.0)
    said = [json.loads((tmp_path / f"result_{rank}.json").read_text()) for rank in (0, 1)]
    assert said[0] == said[1] and said[0].startswith("the processes of this torchrun do not agree on what to train")
    assert "optim.lr (rank 1: 0.5, rank 0: 0.05)" in said[0] and "train images (rank 1: " in said[0]
    assert not (tmp_path / "run" / "config.json").exists()


@pytest.mark.dist
def test_an_infinite_loss_on_one_process_skips_the_step_on_every_process(tmp_path: Path) -> None:
    """The skip was decided from each process's own loss: rank 1 alone skipped the step and its replica drifted
    from rank 0's for the rest of the run, the saved model being rank 0's alone."""
    _spawn(2, tmp_path / "run", worker=_infinite_loss_worker, timeout_s=120.0)
    said = [json.loads((tmp_path / f"result_{rank}.json").read_text()) for rank in (0, 1)]
    assert said[0]["skipped"] == said[1]["skipped"] == [False, True, False, False]
    assert said[0]["sum"] == said[1]["sum"]  # one model on both


def test_shards_of_all_processes_make_the_global_batch() -> None:
    stream = IndexStream(37, seed=3)
    for step in range(5):
        whole = torch.cat(micro_batches(stream, step, 12, 0, 1, 12))
        parts = torch.cat([torch.cat(micro_batches(stream, step, 12, r, 2, 3)) for r in range(2)])
        assert torch.equal(whole, parts)
    assert sorted(stream.take(0, 37).tolist()) == list(range(37))  # an epoch is a permutation
    assert torch.equal(stream.take(30, 45), torch.cat([stream.permutation(0)[30:], stream.permutation(1)[:8]]))


@pytest.mark.dist
def test_two_process_ddp_equals_one_process(tmp_path: Path) -> None:
    single = tmp_path / "single"
    trainer.train(tiny_config(single, *ARGS))
    double = tmp_path / "ddp"
    _spawn(2, double)
    ours = load_file(str(double / "checkpoints" / "step_0000004" / "model.safetensors"))
    theirs = load_file(str(single / "checkpoints" / "step_0000004" / "model.safetensors"))
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=1e-5, msg=key)
    assert max((ours[k] - theirs[k]).abs().max().item() for k in ours) < 1e-5
    moved = max((theirs[k] - tiny_start()[k]).abs().max().item() for k in theirs)
    assert moved > 1e-3  # the weights did change, so the comparison means something


@pytest.mark.dist
def test_two_processes_fit_a_budget_and_end_annealed_at_the_same_step(tmp_path: Path) -> None:
    # 1,000,000 planned steps, 0.02 min of fake time.  The clock is agreed (the max over processes) only at the
    # logging steps, every 5th; between them each process extrapolates it, and both must reach the same position.
    _spawn(
        2,
        tmp_path / "run",
        "data.steps=1000000",
        "run.max_minutes=0.02",
        "run.log_every=5",
        "optim.end_lr_fraction=0.1",
    )
    results = [json.loads((tmp_path / f"result_{rank}.json").read_text()) for rank in range(2)]
    assert [r["status"] for r in results] == ["finished", "finished"]
    assert results[0]["step"] == results[1]["step"] and 10 < results[0]["step"] < 1_000_000
    assert results[0]["lrs"] == results[1]["lrs"]  # every step at the same schedule position on both
    assert results[0]["lrs"][-1] == pytest.approx(0.1 * results[0]["plan"]["lr"])  # the end value: annealed, not cut


@pytest.mark.dist
def test_two_processes_save_by_the_clock_at_the_same_steps(tmp_path: Path) -> None:
    # Each process's fake clock runs at its own pace, so each would pass run.checkpoint_minutes at its own step;
    # a save is collective (every rank's random streams are gathered), so a process saving alone would hang both.
    run = tmp_path / "run"
    _spawn(2, run, "data.steps=8", "run.log_every=2", "run.checkpoint_minutes=0.0005", timeout_s=90.0)
    results = [json.loads((tmp_path / f"result_{rank}.json").read_text()) for rank in range(2)]
    assert [(r["status"], r["step"]) for r in results] == [("finished", 8)] * 2
    saved = sorted(int(p.name.split("_")[1]) for p in (run / "checkpoints").glob("step_*"))
    assert len(saved) > 1 and saved[-1] == 8 and all(step % 2 == 0 for step in saved)  # by the clock, at log steps


@pytest.mark.dist
def test_two_processes_stopped_and_resumed_equal_an_uninterrupted_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # dropout and flips draw on every rank, so rank 1's RNG streams must continue across the stop as well
    random = ("model.dropout=0.1", "augment.flip=true", "data.steps=8", "run.log_every=1")
    _spawn(2, tmp_path / "reference" / "run", 0, *random, worker=_stopped_worker)
    stopped = tmp_path / "stopped" / "run"
    _spawn(2, stopped, 3, *random, worker=_stopped_worker)
    results = [json.loads((stopped.parent / f"result_{rank}.json").read_text()) for rank in range(2)]
    assert [(r["status"], r["step"]) for r in results] == [("interrupted", 3)] * 2
    assert [r["signal"] for r in results] == [signal.SIGTERM] * 2  # rank 0 had said "signal 0" and exited 128
    payload = RunDir.read_state(stopped / "checkpoints" / "step_0000003")  # torch.load(weights_only=True)
    assert len(payload["rng_ranks"]) == 2  # every rank's streams, rank 0's also under "rng"
    assert torch.equal(payload["rng_ranks"][0]["augment"], payload["rng"]["augment"])
    assert not torch.equal(payload["rng_ranks"][1]["augment"], payload["rng"]["augment"])
    shutil.copytree(stopped, tmp_path / "one" / "run")
    _spawn(2, stopped, 0, *random, worker=_stopped_worker)
    ours = load_file(str(stopped / "checkpoints" / "step_0000008" / "model.safetensors"))
    theirs = load_file(str(tmp_path / "reference" / "run" / "checkpoints" / "step_0000008" / "model.safetensors"))
    assert ours.keys() == theirs.keys()
    for key in theirs:
        assert torch.equal(ours[key], theirs[key]), key
    with caplog.at_level(logging.WARNING, logger="vitkit.train"):  # another world size: resumes, and says it differs
        assert trainer.train(tiny_config(tmp_path / "one" / "run", *ARGS, *random))["step"] == 8
    assert "holds the random streams of 2 process(es) and this run has 1: only rank 0's go on" in caplog.text
    shutil.copytree(stopped, tmp_path / "finished" / "run")  # ended with 2: a re-run with 1 draws nothing
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit.train"):
        assert trainer.train(tiny_config(tmp_path / "finished" / "run", *ARGS, *random))["step"] == 8
    assert "weights will differ" not in caplog.text


def tiny_start() -> dict[str, torch.Tensor]:
    from vitkit.models import build_model

    config = tiny_config(Path("unused"), *ARGS)
    torch.manual_seed(config.run.seed * 1000)
    return build_model(config.model).state_dict()


def _plain_and_under_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str):
    """Train the same tiny run plainly and under one process's torchrun variables: the wrapper types the second
    run's model got, and both runs' final weights."""
    plain = tmp_path / "plain"
    trainer.train(tiny_config(plain, *ARGS, *extra))
    wrapped: list[str] = []
    real_wrap = trainer.distributed.wrap

    def spy(model, info, device, parallel):
        out = real_wrap(model, info, device, parallel)
        wrapped.append(type(out).__name__)
        return out

    monkeypatch.setattr(trainer.distributed, "wrap", spy)
    env = dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    launched = tmp_path / "torchrun"
    trainer.train(tiny_config(launched, *ARGS, *extra))
    assert not torch.distributed.is_initialized()  # the run left the group it joined
    ours = load_file(str(launched / "checkpoints" / "step_0000004" / "model.safetensors"))
    theirs = load_file(str(plain / "checkpoints" / "step_0000004" / "model.safetensors"))
    assert ours.keys() == theirs.keys()  # no "module." prefix from the wrapper
    return wrapped, ours, theirs


@pytest.mark.dist
def test_torchrun_with_one_process_trains_through_ddp_and_equals_a_plain_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `torchrun --nproc_per_node 1` is how a multi-GPU setup is tried on one device: it must join a process group
    # and wrap the model (DDP here; FSDP2 on CUDA), not silently run as a plain process.
    wrapped, ours, theirs = _plain_and_under_torchrun(tmp_path, monkeypatch)
    assert wrapped == ["DistributedDataParallel"]
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=0, msg=key)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_torchrun_with_one_cuda_process_wraps_with_nccl_and_equals_a_plain_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parallel: str
) -> None:  # pragma: no cover - only where a GPU exists
    wrapped, ours, theirs = _plain_and_under_torchrun(
        tmp_path, monkeypatch, "run.device=cuda", f"run.parallel={parallel}", "optim.ema_decay=0"
    )
    assert len(wrapped) == 1  # FSDP2 makes the model's class FSDP<its class>
    assert wrapped[0] == "DistributedDataParallel" if parallel == "ddp" else wrapped[0].startswith("FSDP")
    for key in theirs:  # one process: the reductions are identities, up to the order of fp32 sums
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=1e-6, msg=key)


def test_torchruns_variables_decide_the_process_group() -> None:
    from vitkit.train.distributed import DistInfo, from_env

    assert from_env({}) == DistInfo()  # a plain process
    assert from_env({"RANK": "0", "WORLD_SIZE": "1"}) == DistInfo()  # a scheduler's single task, no rendezvous
    launched = from_env({"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "LOCAL_RANK": "0"})
    assert launched.launched and launched.world == 1  # torchrun --nproc_per_node 1
    two = from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert two.launched and (two.rank, two.world, two.local_rank) == (1, 2, 1)
    with pytest.raises(ValueError, match="WORLD_SIZE is set but RANK is not"):
        from_env({"WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="RANK is set but WORLD_SIZE is not"):
        from_env({"RANK": "0"})
    # a shell template's empty variables are unset ("invalid literal for int() with base 10: ''" ended every verb)
    assert from_env({"RANK": "", "WORLD_SIZE": ""}) == DistInfo()
    from vitkit.train import distributed  # a joined group reads LOCAL_RANK by the same rule

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(distributed.dist, "is_initialized", lambda: True)
        patch.setattr(distributed.dist, "get_rank", lambda: 1)
        patch.setattr(distributed.dist, "get_world_size", lambda: 2)
        assert distributed.current({"LOCAL_RANK": ""}).local_rank == 1 % max(1, torch.cuda.device_count())
    with pytest.MonkeyPatch.context() as patch:  # a launcher without LOCAL_RANK on a 4-GPU machine: not all on GPU 0
        patch.setattr(distributed.torch.cuda, "device_count", lambda: 4)
        env = {"RANK": "6", "WORLD_SIZE": "8", "MASTER_ADDR": "n1"}
        assert from_env(env).local_rank == 2 and from_env({**env, "LOCAL_RANK": "3"}).local_rank == 3
    with pytest.raises(ValueError, match=r"WORLD_SIZE='x' is not a whole number \(torchrun sets it\)"):
        from_env({"RANK": "0", "WORLD_SIZE": "x"})
    for rank in ("2", "-1"):  # a process group would wait 30 minutes for the ranks that never come
        with pytest.raises(ValueError, match=rf"RANK={rank} is not in 0\.\.1 for WORLD_SIZE=2: launch with torchrun"):
            from_env({"RANK": rank, "WORLD_SIZE": "2", "MASTER_ADDR": "h"})
    with pytest.raises(ValueError, match="LOCAL_RANK=-3 is below 0"):
        from_env({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "-3"})


def test_leave_runs_the_exit_handlers_flushes_and_exits_with_the_code(tmp_path: Path) -> None:
    """distributed.leave skips only the interpreter's finalization: running threads are waited for, atexit
    handlers run, buffered output arrives, and the status is the one given."""
    marker = tmp_path / "atexit-ran"
    script = (
        "import atexit, sys, pathlib\n"
        "from vitkit.train import distributed\n"
        f"atexit.register(pathlib.Path({str(marker)!r}).write_text, 'yes')\n"
        "import threading, time\n"  # a thread still writing, as an exit waits for it
        f"threading.Thread(target=lambda: (time.sleep(0.5), pathlib.Path({str(marker)!r} + '-thread')"
        ".write_text('done'))).start()\n"
        "print('buffered, no newline', end='')\n"
        "sys.stderr.write('to stderr')\n"
        "distributed.leave(3)\n"
        "print('never')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr[-2000:]
    assert done.stdout == "buffered, no newline" and done.stderr == "to stderr"
    assert marker.read_text() == "yes" and Path(f"{marker}-thread").read_text() == "done"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_process_waiting_for_peers_that_never_start_says_so_and_stops_on_a_signal(tmp_path: Path, sig) -> None:
    """WORLD_SIZE=2 with one process started waited in the rendezvous, in C++, for 30 minutes: silent, and deaf
    to Ctrl-C and SIGTERM (only SIGKILL ended it).  The wait is now said, and either signal ends it at once."""
    script = (  # Ctrl-C as a terminal leaves it: a job a script started in the background inherits it ignored
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from vitkit.train import distributed; distributed.WAIT_SAID_S = 0.5; from vitkit.cli import main; "
        f"sys.exit(main(['train', '--recipe', 'small-8px-tiny', '--out', {str(tmp_path / 'run')!r}]))"
    )
    env = {**os.environ, "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1"}  # fmt: skip
    process = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(60, process.kill)  # a silent wait: killed, and failed below, not waited for
    guard.start()
    said = ""
    while "waiting at 127.0.0.1" not in said:
        line = process.stderr.readline()
        assert line, f"ended, or waited 60 s without a word: {said}"
        said += line
    guard.cancel()
    assert "for the other processes to join (each of the WORLD_SIZE=2 must start" in said
    process.send_signal(sig)
    try:
        code = process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("the rendezvous did not stop on the signal")
    assert code == (130 if sig == signal.SIGINT else 143)
    assert "vitkit train: interrupted" in process.stderr.read()


def test_a_join_is_refused_while_an_interrupted_one_still_waits(monkeypatch) -> None:
    """A library caller that catches the interrupt and goes on would have a second join race the first, which
    could still make the default group behind its back when the peers come."""
    waiting = threading.Event()
    left = threading.Thread(target=waiting.wait, daemon=True)
    left.start()
    monkeypatch.setattr(distributed, "_joining", left)
    info = distributed.DistInfo(rank=0, world=2, launched=True)
    with pytest.raises(RuntimeError, match="an earlier, interrupted join of the process group is still waiting"):
        distributed.setup(info, torch.device("cpu"))
    waiting.set()
