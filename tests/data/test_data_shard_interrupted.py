"""A `vitkit shard` killed part-way: the re-run starts it over, and the half-written directory is not read."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitkit.atomic import TORN_NAME
from vitkit.data import shard
from vitkit.data.sources import load_split


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs (no handler of the writer's catches a BaseException)."""


def test_a_killed_shard_run_is_started_over_and_its_leftovers_are_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after 3 of 8 shards: the same command said "already holds shards", and `wds:` trained on the 3
    shards with a new 20% test hold-out drawn from them."""
    close = shard._Shards.close
    closed, torn = [], []

    def dies_at_the_fourth(self) -> None:
        if len(closed) == 3:
            torn.append(Path(self._temporary()))
            torn[0].write_bytes(b"torn")  # the next shard's temporary, cut short
            raise Killed
        closed.append(self)
        close(self)

    monkeypatch.setattr(shard._Shards, "close", dies_at_the_fourth)
    out = tmp_path / "out"
    with pytest.raises(Killed):
        shard.write_shards("digits", out, samples_per_shard=200)
    assert len(list(out.glob("*.tar"))) == 3 and not (out / "dataset.json").exists()
    assert TORN_NAME.fullmatch(torn[0].name) and torn[0].exists()  # named as every temporary vitkit writes
    with pytest.raises(ValueError, match="interrupted `vitkit shard`.*run the shard command again"):
        load_split(f"wds:{out}", "train")
    monkeypatch.setattr(shard._Shards, "close", close)
    again = shard.write_shards("digits", out, samples_per_shard=200)
    fresh = shard.write_shards("digits", tmp_path / "fresh", samples_per_shard=200)
    assert again["splits"] == fresh["splits"]
    names = sorted(p.name for p in out.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "fresh").iterdir())  # no temporary, no mark left
    assert all((out / n).read_bytes() == (tmp_path / "fresh" / n).read_bytes() for n in names if n.endswith(".tar"))
    assert len(load_split(f"wds:{out}", "train")) == len(load_split(f"wds:{tmp_path / 'fresh'}", "train"))


def test_a_shard_run_still_writing_is_not_started_over_by_another(tmp_path: Path) -> None:
    """The mark is also there while a shard run writes: a second `vitkit shard` to the same --out removed the
    first's shards, and the first then failed renaming its next one."""
    from vitkit.atomic import lock_directory, unlock_directory
    from vitkit.data.tarshards import INCOMPLETE

    out = tmp_path / "out"
    out.mkdir()
    (out / INCOMPLETE).write_text("")
    (out / "train-000000.tar").write_bytes(b"the first run's")
    held = lock_directory(out)  # the first run, alive
    try:
        with pytest.raises(ValueError, match="in use by another vitkit shard"):
            shard.write_shards("digits", out, samples_per_shard=200)
    finally:
        unlock_directory(held)
    assert (out / "train-000000.tar").read_bytes() == b"the first run's"


def test_a_shrunk_photo_keeps_its_exif_orientation(tmp_path: Path) -> None:
    """--max-side re-encodes a photo without its EXIF block: a portrait photo was stored sideways."""
    import tarfile

    import numpy as np
    from PIL import Image

    from vitkit.data.images import decode_image

    exif = Image.Exif()
    exif[0x0112] = 6  # turned 90 degrees clockwise when shown
    for cls in ("a", "b"):
        (tmp_path / "photos" / cls).mkdir(parents=True)
        for i in range(3):
            pixels = np.random.default_rng(i).integers(0, 255, (40, 60, 3), dtype=np.uint8)  # stored 60 wide
            Image.fromarray(pixels).save(tmp_path / "photos" / cls / f"{i}.jpg", exif=exif)
    shard.write_shards(f"folder:{tmp_path / 'photos'}", tmp_path / "out", samples_per_shard=10, max_side=30)
    with tarfile.open(next((tmp_path / "out").glob("train-*.tar"))) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".jpg"))
        image = decode_image(tar.extractfile(member).read())
    assert image.shape == (3, 30, 20)  # upright: 20 wide, 30 high


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_shard_run_that_fails_removes_what_it_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure) -> None:
    """A full disk had left the shard being written (a third of a 300-KB disk) and the finished ones: the
    message said to free space, and vitkit's own leftovers held it.  A run that fails (or is stopped with
    Ctrl-C) removes its shards, its temporary and its mark; a re-run starts over as before."""
    close = shard._Shards.close
    closed = []

    def fails_at_the_third(self) -> None:
        if len(closed) == 2:
            Path(self._temporary()).write_bytes(b"x" * 1000)
            raise failure
        closed.append(self)
        close(self)

    monkeypatch.setattr(shard._Shards, "close", fails_at_the_third)
    (tmp_path / "kept").mkdir()
    for out in (tmp_path / "new" / "shards", tmp_path / "kept"):
        closed.clear()
        with pytest.raises(type(failure)):
            shard.write_shards("digits", out, samples_per_shard=200)
    assert not (tmp_path / "new").exists()  # made for the run, removed with it
    assert (tmp_path / "kept").is_dir() and not any((tmp_path / "kept").iterdir())  # the user's, as it was


def test_shard_writes_only_into_an_empty_or_new_directory(tmp_path: Path) -> None:
    """`--out` is "empty or new" (its help): a run directory or a folder of the user's files was written into."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match=r"run is not empty \(it holds metrics.jsonl\); shard into an empty or new"):
        shard.write_shards("digits", out, samples_per_shard=500)
    assert sorted(p.name for p in out.iterdir()) == ["metrics.jsonl"]
    (out / "metrics.jsonl").unlink()
    (out / ".DS_Store").write_text("")  # a hidden file of the desktop's is not the user's data
    assert shard.write_shards("digits", out, samples_per_shard=500)["splits"]["train"]["samples"] == 1438
