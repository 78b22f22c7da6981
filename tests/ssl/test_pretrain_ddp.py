"""MPP pre-training under DDP: 2 CPU processes with gloo (marker `dist`)."""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file

from vitkit.data.sources import ImageSet
from vitkit.data.transforms import AugmentConfig
from vitkit.models import create_model
from vitkit.models.configs import ViTConfig
from vitkit.ssl.masked_patch import MPPConfig
from vitkit.train import distributed
from vitkit.train.assemble import Splits
from vitkit.train.config import DataConfig, RunConfig, TrainConfig
from vitkit.train.objectives import mpp_train_config
from vitkit.train.trainer import Trainer

TINY = {"hidden_size": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64}


def _config(out: str) -> TrainConfig:
    return mpp_train_config(
        TrainConfig(
            model=ViTConfig(img_size=32, patch_size=8, num_classes=0, **TINY),
            data=DataConfig(uri="npz:unused", batch_size=8, epochs=1, workers=0),
            augment=AugmentConfig(crop="none", flip=True),
            run=RunConfig(out=out, log_every=1, progress=False, tensorboard=False, device="cpu"),
        ),
        MPPConfig(eval_images=0),
    )


def _initial_parameters() -> torch.Tensor:
    torch.manual_seed(0)  # pretrain seeds the encoder init with run.seed = 0 on every rank
    encoder = create_model("vit_ti16", img_size=32, patch_size=8, num_classes=0, in_chans=3, **TINY)
    return torch.cat([p.detach().flatten() for p in encoder.parameters()])


def _worker(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        images = torch.randint(0, 256, (16, 3, 32, 32), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
        train = ImageSet(images=images, labels=torch.zeros(16, dtype=torch.int64), class_names=["x"])
        trainer = Trainer(
            _config(out),
            distributed.current(),
            torch.device("cpu"),
            time.monotonic(),
            data=Splits(train=train, test=None),
        )
        summary = trainer.fit()
        model = trainer.state.model.module  # the MPP wrapper inside DDP
        assert summary["status"] == "finished" and summary["step"] == 2
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(2)]
        dist.all_gather(gathered, flat)
        assert torch.equal(gathered[0], gathered[1])  # DDP kept the replicas identical
        trained = torch.cat([p.detach().flatten() for p in model.encoder.parameters()])
        assert trained.shape == _initial_parameters().shape and not torch.equal(trained, _initial_parameters())
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.dist
def test_two_process_run_writes_one_checkpoint(tmp_path):
    # fork: the children inherit the imported modules (spawn would re-import torch in each, ~10 s on 2 cores);
    # where CUDA is present an earlier test's backward may have started autograd's device threads, which fork
    # cannot carry (torch refuses), so spawn
    method = "spawn" if torch.cuda.is_available() else "fork"
    mp.start_processes(_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True, start_method=method)
    final = load_file(str(tmp_path / "checkpoints" / "final" / "model.safetensors"))
    assert "patch_embed.proj.weight" in final and "mask_token" not in final
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2  # only rank 0 logs
