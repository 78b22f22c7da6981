"""DataLoader workers outlive the stop signals their main process handles: SIGTERM to a process group
(torchrun, docker stop, systemd) or Ctrl-C reaches the workers too, and a worker that died of it had ended
the run with "DataLoader worker (pid N) is killed by signal: Terminated" before the main process saved."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

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


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_to_the_workers_does_not_end_the_loader(tmp_path: Path, stop: signal.Signals) -> None:
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
        os.kill(worker.pid, stop)
    time.sleep(0.5)  # the signal lands before the next batches are asked for
    seen += list(steps)
    assert len(seen) == 6 and all(worker.is_alive() or worker.exitcode == 0 for worker in workers)
