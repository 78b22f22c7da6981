"""Two gloo processes with B/2 each end with the same weights as one process with B (DDP + sharding)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from helpers import tiny_config
from vitkit.data.loader import IndexStream, micro_batches
from vitkit.train import trainer

# SGD: Adam would turn ~1e-10 all-reduce rounding in gradients that are zero in exact arithmetic
# (the key bias's) into steps of size lr, so it compares replicas, not the method.
# fp32: the comparison is of the method; bf16 rounds weight gradients per micro-batch shape.
ARGS = ("run.precision=fp32", "optim.name=sgd", "optim.lr=0.05", "data.steps=4", "data.batch_size=16", "model.dropout=0.0", "augment.crop=none", "augment.flip=false",
        "run.checkpoint_every=100", "optim.warmup_steps=1")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    trainer.train(tiny_config(Path(out), *ARGS))


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
    mp.start_processes(_worker, args=(2, _free_port(), str(double)), nprocs=2, join=True, start_method="spawn")
    ours = load_file(str(double / "checkpoints" / "step_0000004" / "model.safetensors"))
    theirs = load_file(str(single / "checkpoints" / "step_0000004" / "model.safetensors"))
    for key in theirs:
        torch.testing.assert_close(ours[key], theirs[key], rtol=0, atol=1e-5, msg=key)
    assert max((ours[k] - theirs[k]).abs().max().item() for k in ours) < 1e-5
    moved = max((theirs[k] - tiny_start()[k]).abs().max().item() for k in theirs)
    assert moved > 1e-3  # the weights did change, so the comparison means something


def tiny_start() -> dict[str, torch.Tensor]:
    from vitkit.models import build_model

    config = tiny_config(Path("unused"), *ARGS)
    torch.manual_seed(config.run.seed * 1000)
    return build_model(config.model).state_dict()
