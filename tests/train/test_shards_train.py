"""Training from tar shards: kill -9 mid-epoch resumes bit-exactly, skipped samples are totalled, and two
gloo processes read disjoint shares of the split and finish on uneven shards."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from helpers import metrics_records, tiny_config, train_in_subprocess
from safetensors.torch import load_file

from shardkit import image_ids, numbered_shards, write_tar
from vitkit.runs import LATEST, STATE_FILE
from vitkit.train import distributed, objectives, trainer

ROOT = Path(__file__).resolve().parents[2]
STREAM = ("data.max_in_memory_mb=0", "data.batch_size=16", "data.micro_batch_size=8", "run.log_every=1")


def _shards(root: Path) -> Path:
    """5 train shards (20 numbered 8x8 samples each, one corrupt), a val and a test shard."""
    numbered_shards(root, [20, 20, 19, 20, 20])
    write_tar(root / "train-000005.tar", [("bad.png", b"\x89PNG broken"), ("bad.cls", b"3")])
    numbered_shards(root, [30], prefix="test", start=100)
    numbered_shards(root, [10], prefix="val", start=130)
    return root


@pytest.mark.parametrize("workers", [2])  # 0 workers: tests/data/test_data_shards.py resumes that stream
def test_kill_9_mid_epoch_on_shards_resumes_bit_exact(tmp_path: Path, workers: int) -> None:
    uri = f"data.uri=wds:{_shards(tmp_path / 'wds')}"
    args = (uri, *STREAM, f"data.workers={workers}", "data.steps=16", "run.checkpoint_every=5")
    reference = tmp_path / "reference"
    trainer.train(tiny_config(reference, *args))
    run = tmp_path / "killed"
    config = tiny_config(run, *args)
    killed = train_in_subprocess(config, 12)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert (run / "checkpoints" / LATEST).read_text().strip() == "step_0000010"  # step 10 x 16 = 1.6 epochs
    state = torch.load(run / "checkpoints" / "step_0000010" / STATE_FILE, weights_only=True)
    assert state["data"]["step"] == 10 and state["data"]["lanes_per_process"] == max(1, workers)
    resumed = train_in_subprocess(config, 0)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    ours = load_file(str(run / "checkpoints" / "step_0000016" / "model.safetensors"))
    theirs = load_file(str(reference / "checkpoints" / "step_0000016" / "model.safetensors"))
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    strip = lambda rs: [{k: v for k, v in r.items() if k != "images_per_s"} for r in rs]  # noqa: E731
    # skipped_samples too: the total survives the restart
    assert strip(metrics_records(run)) == strip(metrics_records(reference))
    skips = [r.get("skipped_samples", 0) for r in metrics_records(reference) if r["split"] == "train"]
    assert skips == sorted(skips) and 1 <= skips[-1] <= 3  # the corrupt sample, once per epoch read (1.6-2.6 epochs)
    assert metrics_records(reference)[-1]["count"] == 30  # the test shard, streamed through the evaluation


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str, args: tuple[str, ...]) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    seen: list[int] = []
    real = objectives.train_transform

    def recording(images, *rest, **kwargs):
        if images.any():  # not the rehearsal's blank batch
            seen.extend(image_ids(images))
        return real(images, *rest, **kwargs)

    objectives.train_transform = recording
    result = trainer.train(tiny_config(Path(out), *args, "run.device=cpu"))  # gloo, also where a GPU is
    Path(out, f"seen-{rank}.json").write_text(
        json.dumps({"seen": seen, "status": result["status"], "step": result["step"]})
    )
    distributed.leave(0)  # as the command line ends a torchrun process (a finalizing interpreter can abort)


def _two_processes(out: Path, args: tuple[str, ...], timeout: float = 240.0) -> list[dict]:
    context = mp.start_processes(
        _worker, args=(2, _free_port(), str(out), args), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1.0):  # a rank waiting for ever would fail here instead of hanging the suite
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"2-process run did not finish within {timeout:.0f} s")
    return [json.loads((out / f"seen-{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.dist
def test_two_processes_read_disjoint_shares_whose_union_is_the_split(tmp_path: Path) -> None:
    ids = numbered_shards(tmp_path / "wds", [10] * 8)  # 8 shards over 2 processes x 2 workers: 2 shards a lane
    numbered_shards(tmp_path / "wds", [6], prefix="test", start=80)
    args = (
        f"data.uri=wds:{tmp_path / 'wds'}",
        "data.max_in_memory_mb=0",
        "data.workers=2",
        "data.batch_size=8",
        "data.micro_batch_size=2",
        "data.steps=10",
        "augment.crop=none",
        "eval.every_epochs=0",
        "run.checkpoint_every=100",
    )
    ranks = _two_processes(tmp_path / "run", args)  # 10 steps x 8 = 80 samples: exactly one epoch
    assert [r["status"] for r in ranks] == ["finished", "finished"]
    first, second = (set(r["seen"]) for r in ranks)
    assert len(ranks[0]["seen"]) == len(ranks[1]["seen"]) == 40
    assert not first & second and sorted(first | second) == ids


@pytest.mark.dist
def test_uneven_shards_over_two_processes_finish(tmp_path: Path) -> None:
    numbered_shards(tmp_path / "wds", [23, 5, 41])  # 3 shards of unequal sizes over 2 processes
    numbered_shards(tmp_path / "wds", [7], prefix="test", start=69)
    numbered_shards(tmp_path / "wds", [4], prefix="val", start=76)  # evaluated as it goes, on 1 shard of 2 ranks
    args = (
        f"data.uri=wds:{tmp_path / 'wds'}",
        "data.max_in_memory_mb=0",
        "data.workers=0",
        "data.batch_size=8",
        "data.steps=30",
        "eval.every_epochs=1",
        "run.checkpoint_every=7",
    )  # 240 samples: 3.5 epochs
    ranks = _two_processes(tmp_path / "run", args)
    assert [(r["status"], r["step"]) for r in ranks] == [("finished", 30), ("finished", 30)]
    assert all(len(r["seen"]) == 120 for r in ranks) and set(ranks[0]["seen"]) | set(ranks[1]["seen"]) == set(range(69))
    final = metrics_records(tmp_path / "run")[-1]
    assert final["final"] and final["count"] == 7
