"""A `vitkit shard` killed part-way: the re-run starts it over, and the half-written directory is not read."""

from __future__ import annotations

from pathlib import Path

import pytest

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
    closed = []

    def dies_at_the_fourth(self) -> None:
        if len(closed) == 3:
            Path(self._temporary()).write_bytes(b"torn")  # the next shard's temporary, cut short
            raise Killed
        closed.append(self)
        close(self)

    monkeypatch.setattr(shard._Shards, "close", dies_at_the_fourth)
    out = tmp_path / "out"
    with pytest.raises(Killed):
        shard.write_shards("digits", out, samples_per_shard=200)
    assert len(list(out.glob("*.tar"))) == 3 and not (out / "dataset.json").exists()
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
