"""`--split val` names a source's own validation split: where its val split is also its test split (a folder of
train/ and val/ only, val-* shards without test-*), scoring "val" would score the test images, so it is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitkit.data.shard import write_shards
from vitkit.eval.accuracy import AccuracyConfig
from vitkit.eval.commands import eval_command
from vitkit.inspect.report import sample_images


def _folder(root: Path, splits: dict[str, int]) -> Path:
    rng = np.random.default_rng(0)
    for split, count in splits.items():
        for name in ("cat", "dog"):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{i}.png")
    return root


@pytest.mark.parametrize("kind", ["folder", "wds"])
def test_val_that_stands_in_for_test_is_refused(tmp_path: Path, make_checkpoint, kind: str) -> None:
    checkpoint = make_checkpoint(tmp_path / "ckpt", num_classes=2)
    uri = f"folder:{_folder(tmp_path / 'images', {'train': 4, 'val': 3})}"
    if kind == "wds":
        write_shards(uri, tmp_path / "wds", 100)
        uri = f"wds:{tmp_path / 'wds'}"
    config = AccuracyConfig(batch_size=8)
    assert eval_command(checkpoint, uri, "test", config, tmp_path / "out")["num_images"] == 6  # val/ as test
    with pytest.raises(ValueError, match=r"its val split is also its test split .* use --split test"):
        eval_command(checkpoint, uri, "val", config, tmp_path / "out")
    with pytest.raises(ValueError, match="its val split is also its test split"):
        sample_images(uri, "val", 2, channels=3, size=32)


def test_val_beside_test_is_read(tmp_path: Path, make_checkpoint) -> None:
    checkpoint = make_checkpoint(tmp_path / "ckpt", num_classes=2)
    uri = f"folder:{_folder(tmp_path / 'images', {'train': 4, 'val': 3, 'test': 2})}"
    config = AccuracyConfig(batch_size=8)
    assert eval_command(checkpoint, uri, "val", config, tmp_path / "out")["num_images"] == 6
    assert eval_command(checkpoint, uri, "test", config, tmp_path / "out")["num_images"] == 4


def test_eval_says_which_images_it_scored_and_that_it_wrote_nothing(tmp_path: Path, make_checkpoint, capsys) -> None:
    """A folder of new photos without train/ or test/ is scored on its fixed 20% hold-out: "4 images" of 24, and
    nothing said why; a checkpoint file evaluated without --out wrote nothing, and did not say so."""
    from vitkit.cli import main

    checkpoint = make_checkpoint(tmp_path / "ckpt", num_classes=2)
    photos = tmp_path / "photos"
    for name in ("cat", "dog"):
        (photos / name).mkdir(parents=True)
        for i in range(12):
            Image.fromarray(np.full((32, 32, 3), 20 * i, np.uint8)).save(photos / name / f"{i}.png")
    assert main(["eval", str(checkpoint), "--data", f"folder:{photos}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    scored = next(line for line in lines if "images at" in line)
    assert scored.endswith(f"4 images at 32 px (a fixed 20% class-stratified hold-out of {photos}; --split train "
                           "scores the others)")  # fmt: skip
    assert lines[-1] == "wrote nothing (--out DIR keeps eval_test.json and its confusion matrix)"
    assert main(["eval", str(checkpoint), "--data", f"folder:{photos}", "--out", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("wrote ")
    uri = f"folder:{_folder(tmp_path / 'split', {'train': 4, 'test': 3})}"  # its own test split: nothing to add
    assert main(["eval", str(checkpoint), "--data", uri]) == 0
    assert any(line.endswith("6 images at 32 px") for line in capsys.readouterr().out.splitlines())
