"""Large folders start fast (listing, no decoding up front past MAX_FILES_IN_MEMORY); the optional fast JPEG
decoder gives Pillow's pixels exactly."""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.data import images, imageset
from vitkit.data.images import decode_image
from vitkit.data.listing import FileList, scan_folder
from vitkit.data.sources import describe, load_split


def test_scan_keeps_sorted_path_order_with_nested_folders(tmp_path: Path) -> None:
    names = ["a/b.png", "a-c.png", "a/a/z.png", "B.png", "a.png", "x.txt"]
    for name in names:
        (tmp_path / "cls" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "cls" / name).write_bytes(b"")
    files, labels = scan_folder(tmp_path, ["cls"])
    expected = sorted(p for p in (tmp_path / "cls").rglob("*") if p.suffix == ".png")
    assert list(files) == expected and files == expected and labels == [0] * 5


def test_a_symlinked_sub_folder_is_read_once_and_a_broken_link_counted(tmp_path: Path, caplog) -> None:
    """A class folder holding `batch2 -> /store/zero` was read without the linked images, and without a word;
    a link back up the tree is not followed twice, and a broken link is counted among the files not read."""
    store = tmp_path / "store"
    store.mkdir()
    for name in ("s1.png", "s2.png"):
        (store / name).write_bytes(b"")
    root = tmp_path / "data"
    (root / "cls").mkdir(parents=True)
    (root / "cls" / "own.png").write_bytes(b"")
    (root / "cls" / "batch2").symlink_to(store, target_is_directory=True)
    (root / "cls" / "again").symlink_to(store, target_is_directory=True)  # the same folder twice: read once
    (store / "up").symlink_to(root, target_is_directory=True)  # a loop
    (root / "cls" / "broken.png").symlink_to(tmp_path / "gone.png")
    with caplog.at_level("WARNING"):
        files, labels = scan_folder(root, ["cls"])
    assert [Path(f).relative_to(root / "cls").as_posix() for f in files] == ["again/s1.png", "again/s2.png", "own.png"]
    assert labels == [0, 0, 0] and "1 file not read" in caplog.text and "broken link 1" in caplog.text


def test_a_link_up_the_tree_or_to_another_class_is_not_followed(tmp_path: Path) -> None:
    """cat/parent -> .. walked the data set's root and labelled the dog images as cats too."""
    for name in ("cat/c.png", "dog/d1.png", "dog/d2.png"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "cat" / "parent").symlink_to(tmp_path, target_is_directory=True)
    (tmp_path / "cat" / "dogs").symlink_to(tmp_path / "dog", target_is_directory=True)
    (tmp_path / "cat" / "self").symlink_to(tmp_path / "cat" / "self")  # a link to itself: ELOOP
    files, labels = scan_folder(tmp_path, ["cat", "dog"])
    assert [Path(f).relative_to(tmp_path).as_posix() for f in files] == ["cat/c.png", "dog/d1.png", "dog/d2.png"]
    assert labels == [0, 1, 1]


def test_file_list_takes_pickles_and_names(tmp_path: Path) -> None:
    files = FileList.of([tmp_path / "a.jpg", tmp_path / "ü.png", tmp_path / "c.png"])
    assert files[1] == tmp_path / "ü.png" and files.name(2) == str(tmp_path / "c.png")
    assert list(files.take(torch.tensor([2, 0]))) == [tmp_path / "c.png", tmp_path / "a.jpg"]
    assert list(files[1:]) == [tmp_path / "ü.png", tmp_path / "c.png"]
    assert pickle.loads(pickle.dumps(files)) == files and files.index(tmp_path / "c.png") == 2


def test_many_files_are_not_decoded_up_front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in range(2):
        (tmp_path / f"c{k}").mkdir()
        for i in range(6):
            Image.new("RGB", (5, 5), (40 * i, k, 0)).save(tmp_path / f"c{k}" / f"{i}.png")
    small = load_split(f"folder:{tmp_path}", "train", image_size=4)
    assert small.access == "memory" and describe(f"folder:{tmp_path}", image_size=4).in_memory
    monkeypatch.setattr(imageset, "MAX_FILES_IN_MEMORY", 5)  # 10 training files: "many", however small decoded
    lazy = load_split(f"folder:{tmp_path}", "train", image_size=4)
    assert lazy.access == "files" and describe(f"folder:{tmp_path}", image_size=4).access == "files"
    assert torch.equal(torch.stack([lazy.read(i) for i in range(len(lazy))]), small.images)


def _jpegs() -> dict[str, bytes]:
    rng = np.random.default_rng(1)
    smooth = np.cumsum(rng.integers(0, 9, (97, 131, 3)), axis=1).clip(0, 255).astype(np.uint8)
    out = {}
    for name, image, options in [
        ("rgb420", Image.fromarray(smooth), {"quality": 85}),
        ("rgb444", Image.fromarray(smooth), {"quality": 90, "subsampling": 0}),
        ("progressive", Image.fromarray(smooth), {"progressive": True}),
        ("gray", Image.fromarray(smooth[..., 0]), {}),
        ("tiny", Image.fromarray(smooth[:3, :5]), {}),
        ("cmyk", Image.fromarray(smooth).convert("CMYK"), {}),
    ]:
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", **options)
        out[name] = buffer.getvalue()
    return out


def test_fast_jpeg_decoder_gives_pillows_pixels(monkeypatch: pytest.MonkeyPatch) -> None:
    fast = pytest.importorskip("simplejpeg")
    calls = {"n": 0}
    real = fast.decode_jpeg

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(images, "_simplejpeg", fast)
    monkeypatch.setattr(fast, "decode_jpeg", counting)
    cases = [(name, data, size) for name, data in _jpegs().items() for size in (None, 2, 8, 24, 48, 97, 200)]
    ours = [decode_image(data, 3, size=size) for _, data, size in cases]
    assert calls["n"] >= 30  # the fast path did the work (CMYK and tiny odd scales fall back)
    monkeypatch.setattr(images, "_simplejpeg", None)
    for (name, data, size), mine in zip(cases, ours):
        assert torch.equal(mine, decode_image(data, 3, size=size)), (name, size)
