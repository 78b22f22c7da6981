"""`vitkit eval` on a split streamed from tar shards gives what the same split in memory gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitkit.data import imageset
from vitkit.data.shard import write_shards
from vitkit.eval.accuracy import AccuracyConfig
from vitkit.eval.commands import eval_command


def test_eval_of_a_streamed_split_matches_in_memory(
    tmp_path: Path, digits_checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_shards("digits", tmp_path / "wds", 100)
    config = AccuracyConfig(batch_size=64)
    memory = eval_command(digits_checkpoint, f"wds:{tmp_path / 'wds'}", "test", config, None)
    memory_some = eval_command(digits_checkpoint, f"wds:{tmp_path / 'wds'}", "test", config, None, max_images=10)
    monkeypatch.setattr(imageset, "MAX_FILES_IN_MEMORY", 0)  # every split is "large": streamed
    streamed = eval_command(digits_checkpoint, f"wds:{tmp_path / 'wds'}", "test", config, None)
    assert streamed["num_images"] == memory["num_images"] == 359
    assert streamed["top1"] == memory["top1"] and streamed["confusion"] == memory["confusion"]
    # --max-images draws the same images from shards as from memory (a streamed split refused it before)
    some = eval_command(digits_checkpoint, f"wds:{tmp_path / 'wds'}", "test", config, None, max_images=10)
    assert some == memory_some and some["num_images"] == 10
