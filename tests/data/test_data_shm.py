"""DataLoader workers hand their batches over in shared memory (/dev/shm).  Where it is full (Docker's 64 MB
default), the worker's queue thread only printed "unable to allocate shared memory" and dropped the batch, and
the main process waited for it forever, deaf to Ctrl-C; the worker now moves the batch there itself, so the
error reaches the main process.  A /dev/shm that is missing or read-only is said as such."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from shardkit import numbered_shards
from vitkit.data import workers

FULL = "unable to allocate shared memory(shm) for file </torch_1_0>: No space left on device (28)"


def _script(kind: str, root: Path) -> str:
    """Batches of 6 steps with 1 worker, every move into shared memory failing as a full /dev/shm fails."""
    return textwrap.dedent(
        f"""
        import sys, torch
        from pathlib import Path

        def full(*args, **kwargs):
            raise RuntimeError({FULL!r})

        torch.UntypedStorage._share_fd_cpu_ = full  # inherited by the forked workers
        torch.UntypedStorage._share_filename_cpu_ = full
        from vitkit.data.sources import load_split
        from vitkit.data.loader import FileBatches, IndexStream
        from vitkit.data.stream import ShardBatches
        cpu, root = torch.device("cpu"), Path({str(root)!r})
        if {kind!r} == "files":
            data = load_split(f"folder:{{root}}", "train", image_size=8, max_in_memory_bytes=0, val_fraction=0.0)
            batches = FileBatches(data, IndexStream(len(data), 0), start_step=0, total_steps=6, global_batch=4,
                                  rank=0, world=1, micro_batch=4, device=cpu, workers=1, strict=False)
        else:
            data = load_split(f"wds:{{root}}", "train", image_size=8, max_in_memory_bytes=0, val_fraction=0.0)
            batches = ShardBatches(data, seed=0, global_batch=4, rank=0, world=1, micro_batch=4, device=cpu,
                                   workers=1, strict=False)
        try:
            for _ in zip(range(6), batches):
                pass
        except RuntimeError as error:
            from vitkit.cli import _known_failure
            print("raised:", str(error).replace(chr(10), " "))
            print("said:", _known_failure(error))
        """
    )


@pytest.mark.skipif(not workers.TELLS_SENDER, reason="the patch reaches forked workers only (Linux)")
@pytest.mark.parametrize("kind", ["files", "shards"])
def test_a_full_shared_memory_is_an_error_not_a_hang(tmp_path: Path, kind: str) -> None:
    if kind == "files":
        for i in range(16):
            (tmp_path / "train" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((8, 8), i * 10, np.uint8)).save(tmp_path / "train" / f"c{i % 2}" / f"{i}.png")
    else:
        numbered_shards(tmp_path, [8, 8], classes=2)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _script(kind, tmp_path)], capture_output=True, text=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the loader waited for a batch its worker had dropped")
    assert done.returncode == 0, done.stderr
    raised, said = done.stdout.splitlines()
    assert raised.startswith("raised:") and "unable to allocate shared memory" in raised
    assert said.startswith(f"said: shared memory (/dev/shm) is full ({FULL}): DataLoader workers pass batches")
    assert "data.workers=0" in said


@pytest.mark.parametrize(
    ("errno", "strerror", "where"),
    [
        (30, "Read-only file system", "; /dev/shm is not writable?"),
        (2, "No such file or directory", "; /dev/shm is missing?"),
        (28, "No space left on device", "; /dev/shm is full?"),
        (24, "Too many open files", ""),  # says nothing of /dev/shm
    ],
)
def test_no_usable_shared_memory_is_said_before_the_workers_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errno: int, strerror: str, where: str
) -> None:
    """A read-only /dev/shm was called a read-only disk with advice to write elsewhere (--out), and a missing one
    "[Errno 2] No such file or directory" naming nothing: the workers' queue lock could not be made there."""
    import multiprocessing

    import torch

    from vitkit.data.loader import FileBatches, IndexStream
    from vitkit.data.sources import load_split

    def no_lock(self, *args, **kwargs):
        raise OSError(errno, strerror)

    monkeypatch.setattr(multiprocessing.context.BaseContext, "Lock", no_lock)
    for i in range(4):
        (tmp_path / "train" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8), i * 10, np.uint8)).save(tmp_path / "train" / f"c{i % 2}" / f"{i}.png")
    data = load_split(f"folder:{tmp_path}", "train", image_size=8, max_in_memory_bytes=0, val_fraction=0.0)
    batches = FileBatches(data, IndexStream(len(data), 0), start_step=0, total_steps=2, global_batch=2, rank=0,
                          world=1, micro_batch=2, device=torch.device("cpu"), workers=1, strict=False)  # fmt: skip
    said = f"no usable shared memory ({strerror}{where}): use --set data.workers=0"
    with pytest.raises(ValueError, match=re.escape(said)):
        next(iter(batches))


@pytest.mark.parametrize(
    ("each_mb", "lanes", "fit"),
    [
        (10, False, (2, 4)),  # 8 in flight and the one held: 90 MB of the 100 free
        (20, False, (2, 1)),  # 3 fit beside the one held: fewer prefetched first
        (40, False, (1, 1)),  # then fewer workers
        (60, False, (0, 1)),  # then none: decoded in the main process
        (25, True, (2, 1)),  # a stream's lanes are its order: only the prefetch shrinks
    ],
)
def test_workers_are_fitted_to_the_shared_memory_free(monkeypatch, caplog, each_mb: int, lanes: bool, fit) -> None:
    """Docker's 64-MB /dev/shm was found full at the first batch that did not fit (an error after start-up); the
    batches in flight are now fitted to the free space before the workers start, and the change is said."""
    monkeypatch.setattr(workers, "_free_bytes", lambda path: 100 * 2**20)
    assert workers.fitted(2, 4, each_mb * 2**20, lanes=lanes) == fit
    assert ("need 180 MB" in caplog.text) == (each_mb == 20)
    assert workers.fitted(2, 4, 10 * 2**20, lanes=lanes) == (2, 4)


def test_lanes_that_cannot_fit_are_refused_before_the_first_batch(monkeypatch) -> None:
    monkeypatch.setattr(workers, "_free_bytes", lambda path: 100 * 2**20)
    with pytest.raises(
        ValueError, match=re.escape("has 100 MB free, and 2 DataLoader worker(s) with 2 batches of 60.0")
    ):
        workers.fitted(2, 2, 60 * 2**20, lanes=True)
    monkeypatch.setattr(workers, "_free_bytes", lambda path: None)  # no /dev/shm to read (macOS): as asked
    assert workers.fitted(2, 2, 60 * 2**20, lanes=True) == (2, 2)


def test_a_small_shared_memory_decodes_the_same_batches_in_the_main_process(tmp_path: Path, monkeypatch) -> None:
    import torch

    from vitkit.data.loader import FileBatches, IndexStream
    from vitkit.data.sources import load_split

    for i in range(8):
        (tmp_path / "train" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8), i * 10, np.uint8)).save(tmp_path / "train" / f"c{i % 2}" / f"{i}.png")
    data = load_split(f"folder:{tmp_path}", "train", image_size=8, max_in_memory_bytes=0, val_fraction=0.0)

    def batches(count: int) -> tuple[int, list]:
        made = FileBatches(data, IndexStream(len(data), 0), start_step=0, total_steps=3, global_batch=4, rank=0,
                           world=1, micro_batch=4, device=torch.device("cpu"), workers=count, strict=False)  # fmt: skip
        return made.loader.num_workers, [(x.clone(), y.clone()) for step in made for x, y in step]

    monkeypatch.setattr(workers, "_free_bytes", lambda path: 300)  # a batch is 4 x 3 x 8 x 8 = 768 bytes
    fitted, got = batches(2)
    monkeypatch.undo()
    assert fitted == 0
    reference = batches(0)[1]
    assert len(got) == 3 and all(torch.equal(a, b) and torch.equal(c, d) for (a, c), (b, d) in zip(got, reference))


def test_torchruns_processes_on_a_machine_share_its_shared_memory(monkeypatch) -> None:
    """Each process took 90% of the free /dev/shm for itself, though its peers start their workers at once: two
    at 224 px in Docker's 64 MB kept 4 workers each, and both filled it at their first batch."""
    monkeypatch.setattr(workers, "_free_bytes", lambda path: 100 * 2**20)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert workers.fitted(2, 4, 10 * 2**20) == (2, 1)  # 90% of 50 MB each: 3 batches beside the one held
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert workers.fitted(2, 4, 10 * 2**20) == (2, 4)
