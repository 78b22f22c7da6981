"""File-based sets: DataLoader workers decode, corrupt files are skipped (or stop the run with strict)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import tiny_config
from PIL import Image

from vitkit.data.sources import BadImageError, load_split
from vitkit.train import trainer


def _folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for split, count in (("train", 12), ("val", 4)):
        for label, name in enumerate(("cat", "dog")):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = (rng.integers(0, 80, (20, 24, 3)) + 120 * label).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    (root / "train" / "cat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    return root


def test_file_based_training_skips_corrupt_files(tmp_path: Path) -> None:
    root = _folder(tmp_path / "images")
    files = load_split(f"folder:{root}", "train", image_size=16, max_in_memory_bytes=0)
    assert files.images is None and len(files) == 25  # decoded lazily: the broken file is found later
    args = (
        "data.uri=folder:" + str(root),
        "data.max_in_memory_mb=0",
        "data.workers=1",
        "model.img_size=16",
        "model.patch_size=4",
        "model.num_classes=2",
        "model.in_chans=3",
        "data.mean=0.5,0.5,0.5",
        "data.std=0.5,0.5,0.5",
        "data.batch_size=8",
        "data.steps=8",
        "run.checkpoint_every=4",
    )
    result = trainer.train(tiny_config(tmp_path / "run", *args))
    assert result["status"] == "finished" and result["step"] == 8 and result["test"]["count"] == 8
    with pytest.raises(BadImageError, match="broken.png"):
        trainer.train(tiny_config(tmp_path / "strict", *args, "data.strict=true"))


def test_a_run_that_fails_before_writing_leaves_no_directory_it_created(tmp_path: Path) -> None:
    root = _folder(tmp_path / "images")
    args = ("data.uri=folder:" + str(root), "model.img_size=16", "model.patch_size=4", "model.num_classes=2")
    args += ("model.in_chans=3", "data.mean=0.5,0.5,0.5", "data.std=0.5,0.5,0.5", "data.strict=true")
    out = tmp_path / "runs" / "strict"
    with pytest.raises(BadImageError, match="broken.png"):  # read in memory: refused before anything is written
        trainer.train(tiny_config(out, *args))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"]  # runs/strict and runs/ both gone
    given = tmp_path / "given"
    given.mkdir()
    with pytest.raises(BadImageError, match="broken.png"):
        trainer.train(tiny_config(given, *args))
    assert given.is_dir()  # the caller's own empty directory stays
