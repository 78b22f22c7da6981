"""folder:DIR sources and decode_image: Pillow modes, bad files skipped and counted, strict mode, bombs."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.data.images import BadImageError, DecompressionBombError, decode_image
from vitkit.data.sources import describe, load_split

RED = (200, 30, 40)


def _png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def make_folder(base: Path) -> dict[str, Path]:
    """base/train: two classes with every awkward kind of file, 6 decodable, 3 bad; base/test: one image each."""
    for name in ("cat", "dog"):
        (base / "test" / name).mkdir(parents=True)
        Image.new("RGB", (8, 8), RED).save(base / "test" / name / "x.png")
    root = base / "train"
    (root / "cat").mkdir(parents=True)
    (root / "dog").mkdir()
    files = {
        "rgb": root / "cat" / "a_rgb.jpg",
        "gray": root / "cat" / "b_gray.jpg",
        "corrupt": root / "cat" / "c_corrupt.jpg",
        "alpha": root / "dog" / "a_alpha.png",
        "tiny": root / "dog" / "b_tiny.png",
        "truncated": root / "dog" / "c_truncated.png",
        "empty": root / "dog" / "d_empty.jpg",
        "wide": root / "dog" / "e_wide.png",
        "gray16": root / "dog" / "f_gray16.png",
    }
    Image.new("RGB", (40, 30), RED).save(files["rgb"], quality=95)
    Image.new("L", (24, 24), 77).save(files["gray"], quality=95)
    files["corrupt"].write_bytes(b"\xff\xd8\xff\xe0 this is not really a jpeg" * 10)
    alpha = Image.new("RGBA", (16, 16), (10, 20, 30, 0))
    alpha.save(files["alpha"])
    Image.new("RGB", (1, 1), (0, 255, 0)).save(files["tiny"])
    noise = Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8))
    files["truncated"].write_bytes(_png_bytes(noise)[:2000])
    files["empty"].write_bytes(b"")
    wide = np.zeros((8, 32, 3), np.uint8)
    wide[:, 12:20] = 255  # a white band in the middle third of a wide image
    Image.fromarray(wide).save(files["wide"])
    Image.fromarray(np.full((8, 8), 65535, np.uint16)).save(files["gray16"])
    (root / "dog" / "notes.txt").write_text("not an image")  # ignored: not an image extension
    return files


def test_folder_skips_and_counts_bad_files(tmp_path, caplog):
    make_folder(tmp_path)
    with caplog.at_level(logging.WARNING):
        train = load_split(f"folder:{tmp_path}", "train", image_size=8, num_workers=2)
    assert train.skipped == 3 and len(train) == 6
    assert train.class_names == ["cat", "dog"] and train.labels.tolist() == [0, 0, 1, 1, 1, 1]
    assert train.images.shape == (6, 3, 8, 8) and train.images.dtype == torch.uint8
    assert "skipped 3 of 9 image files" in caplog.text
    for name in ("c_corrupt.jpg", "c_truncated.png", "d_empty.jpg"):
        assert name in caplog.text  # each bad file is named in the log
    rgb, gray, alpha, tiny, wide, gray16 = train.images
    assert (rgb.float().mean((1, 2)) - torch.tensor(RED)).abs().max() < 3  # JPEG is lossy
    assert torch.equal(gray[0], gray[1]) and torch.equal(gray[1], gray[2]) and abs(int(gray[0, 0, 0]) - 77) <= 1
    assert alpha[:, 0, 0].tolist() == [10, 20, 30]  # alpha dropped, colour kept (as ImageFolder's convert("RGB"))
    assert (tiny == torch.tensor([0, 255, 0], dtype=torch.uint8)[:, None, None]).all()  # 1x1 upsampled
    # 32x8 -> shorter side 8 -> 32x8 is already 8 high, centre 8x8 crop = columns 12..19 = the white band.
    assert (wide == 255).all()
    assert (gray16 == 255).all()  # 16-bit white is scaled to 8-bit white, not clipped garbage


def test_folder_strict_raises_naming_the_file(tmp_path):
    make_folder(tmp_path)
    with pytest.raises(BadImageError, match=r"c_corrupt\.jpg"):
        load_split(f"folder:{tmp_path}", "train", image_size=8, strict=True)


def test_decode_image_modes_and_errors(tmp_path):
    files = make_folder(tmp_path)
    assert decode_image(files["rgb"]).shape == (3, 30, 40)
    assert decode_image(files["rgb"], channels=1).shape == (1, 30, 40)
    assert decode_image(files["alpha"].read_bytes(), channels=3).shape == (3, 16, 16)  # bytes work too
    assert decode_image(files["rgb"], size=10).shape == (3, 10, 10)
    for key in ("corrupt", "truncated", "empty"):
        with pytest.raises(BadImageError, match=files[key].name):
            decode_image(files[key])
    assert issubclass(BadImageError, ValueError)


def test_decompression_bomb_refused(tmp_path):
    path = tmp_path / "big.png"
    Image.new("L", (200, 100)).save(path)
    with pytest.raises(DecompressionBombError, match=r"big\.png.*200x100.*decompression bomb"):
        decode_image(path, max_pixels=10_000)
    assert decode_image(path, channels=1, max_pixels=20_000).shape == (1, 100, 200)
    for part in ("train", "test"):
        (tmp_path / part / "a").mkdir(parents=True)
    path.rename(tmp_path / "train" / "a" / "big.png")
    Image.new("L", (10, 10)).save(tmp_path / "train" / "a" / "small.png")
    Image.new("L", (10, 10)).save(tmp_path / "test" / "a" / "small.png")
    small = load_split(f"folder:{tmp_path}", "train", image_size=4, max_pixels=10_000)
    assert (len(small), small.skipped) == (1, 1)


def test_folder_file_based_when_large(tmp_path):
    files = make_folder(tmp_path)
    memory = load_split(f"folder:{tmp_path}", "train", image_size=8)
    lazy = load_split(f"folder:{tmp_path}", "train", image_size=8, max_in_memory_bytes=100)
    assert lazy.images is None and len(lazy.files) == 9 and lazy.load_size == 8
    assert torch.equal(lazy.read(0), memory.images[0])  # the same decode path as the in-memory set
    with pytest.raises(BadImageError, match="c_corrupt"):
        lazy.read(lazy.files.index(files["corrupt"]))
    part = lazy.subset(torch.tensor([1, 0]))
    assert part.files == [lazy.files[1], lazy.files[0]] and part.labels.tolist() == [0, 0]


def test_files_decoded_on_the_fly_name_each_unreadable_one_once_with_its_reason(tmp_path, caplog, monkeypatch):
    """Every epoch had named the file again, without saying why it was unreadable."""
    from vitkit.data import loader

    files = make_folder(tmp_path)
    lazy = load_split(f"folder:{tmp_path}", "train", image_size=8, max_in_memory_bytes=100)
    bad = [lazy.files.index(files[key]) for key in ("corrupt", "truncated", "empty")]
    monkeypatch.setattr(loader, "NAMED_SKIPS", 2)
    reader = loader._Files(lazy, strict=False)
    with caplog.at_level(logging.WARNING):
        assert [reader[i] for _ in range(3) for i in bad] == [None] * 9  # three epochs
    named = [r.message for r in caplog.records if "skipping unreadable image" in r.message]
    assert len(named) == 2 and str(files["corrupt"]) in named[0] and "not a readable image" in named[0]
    assert named[1].endswith("; more are counted, not named")


def test_folder_splits_and_errors(tmp_path):
    for split, count in (("train", 6), ("val", 2)):
        for cls in ("b", "A"):
            (tmp_path / split / cls).mkdir(parents=True)
            for i in range(count):
                Image.new("RGB", (5, 5), (i, 0, 0)).save(tmp_path / split / cls / f"{i}.png")
    uri = f"folder:{tmp_path}"
    val, test = load_split(uri, "val", image_size=4), load_split(uri, "test", image_size=4)
    assert len(val) == len(test) == 4 and val.class_names == ["A", "b"]  # sorted: capitals first
    held = load_split(uri, "val", image_size=4, val_fraction=0.5, seed=1)
    kept = load_split(uri, "train", image_size=4, val_fraction=0.5, seed=1)
    assert (len(held), len(kept)) == (6, 6) and torch.bincount(held.labels).tolist() == [3, 3]
    reds = lambda s: sorted(zip(s.labels.tolist(), s.images[:, 0, 0, 0].tolist()))  # noqa: E731
    assert set(reds(held)).isdisjoint(reds(kept))
    info = describe(uri)
    assert (info.num_train, info.num_classes, info.image_size, info.channels) == (12, 2, 5, 3)
    # a folder without test/ or val/ holds out a fixed, class-stratified 20% as its test split
    flat_test, flat_train = (
        load_split(f"folder:{tmp_path / 'train'}", part, image_size=4) for part in ("test", "train")
    )
    assert (len(flat_test), len(flat_train)) == (2, 10) and torch.bincount(flat_test.labels).tolist() == [1, 1]
    assert set(reds(flat_test)).isdisjoint(reds(flat_train)) and "hold-out" in flat_test.origin
    assert describe(f"folder:{tmp_path / 'train'}").num_train == 10
    with pytest.raises(ValueError, match="no val split"):
        load_split(f"folder:{tmp_path / 'train'}", "val")
    (tmp_path / "val" / "zebra").mkdir()
    with pytest.raises(ValueError, match="zebra"):
        load_split(uri, "val")


def test_an_empty_training_class_folder_is_refused_and_an_empty_test_one_is_not(tmp_path, caplog):
    """A class with no training images would be an output nothing teaches: an error naming the folder; in
    val/ it is only a class not tested (warned), and the others are read."""
    for split in ("train", "val"):
        for cls in ("cat", "dog"):
            (tmp_path / split / cls).mkdir(parents=True)
        Image.new("RGB", (5, 5), RED).save(tmp_path / split / "cat" / "0.png")
    Image.new("RGB", (5, 5), RED).save(tmp_path / "train" / "dog" / "0.png")
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        val = load_split(f"folder:{tmp_path}", "val", image_size=4)
    assert len(val) == 1 and val.class_names == ["cat", "dog"] and "not tested" in caplog.text
    (tmp_path / "train" / "dog" / "0.png").unlink()
    (tmp_path / "train" / "dog" / "notes.txt").write_text("not an image")
    with pytest.raises(ValueError, match=r"train/dog: class folder has no image files.*holds .txt 1.*cannot be learnt"):
        describe(f"folder:{tmp_path}")


def test_a_class_whose_every_training_file_fails_to_decode_is_refused(tmp_path):
    """It trained anyway: a 2-class model of which one class had no image, "top-1 100.00%" on the other's."""
    for cls, count in (("cat", 6), ("dog", 3)):
        (tmp_path / "train" / cls).mkdir(parents=True)
        (tmp_path / "test" / cls).mkdir(parents=True)
        Image.new("RGB", (5, 5), RED).save(tmp_path / "test" / cls / "0.png")
        for i in range(count):
            path = tmp_path / "train" / cls / f"{i}.jpg"
            if cls == "cat":
                Image.new("RGB", (5, 5), RED).save(path)
            else:
                path.write_bytes(b"not a JPEG at all %d" % i)
    with pytest.raises(ValueError, match=r"no training file of class 'dog' \(3 files\) decodes .*cannot be learnt"):
        load_split(f"folder:{tmp_path}", "train", image_size=4)
    assert len(load_split(f"folder:{tmp_path}", "test", image_size=4)) == 2  # the test split is read as before
    for cls in ("emu", "fox", "gnu", "hen", "ibis", "jay"):  # many lost: counted, five named
        (tmp_path / "train" / cls).mkdir()
        (tmp_path / "train" / cls / "0.jpg").write_bytes(cls.encode())
    with pytest.raises(ValueError, match=r"of 7 classes, 'dog' \(3 files\), 'emu' .*'hen' \(1 file\) and more decodes"):
        load_split(f"folder:{tmp_path}", "train", image_size=4)
    for cls in ("emu", "fox", "gnu", "hen", "ibis", "jay"):
        Image.new("RGB", (5, 5), RED).save(tmp_path / "train" / cls / "1.png")
    Image.new("RGB", (5, 5), RED).save(tmp_path / "train" / "dog" / "good.png")  # one decodes: trained, 3 skipped
    assert load_split(f"folder:{tmp_path}", "train", image_size=4).labels.tolist() == [0] * 6 + [1, 2, 3, 4, 5, 6, 7]


def test_files_left_out_by_their_extension_are_counted_by_kind(tmp_path, caplog):
    """Photos from a phone (.heic) and notes beside the images are not read: one warning counts them by suffix
    so a folder whose images vitkit cannot read does not shrink unnoticed; hidden files are not counted."""
    for cls in ("cat", "dog"):
        (tmp_path / "train" / cls).mkdir(parents=True)
        Image.new("RGB", (5, 5), RED).save(tmp_path / "train" / cls / "0.png")
    for name in ("a.heic", "b.HEIC", "c.heic", "notes.txt", ".DS_Store"):
        (tmp_path / "train" / "cat" / name).write_bytes(b"x")
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        train = load_split(f"folder:{tmp_path}", "train", image_size=4)
        load_split(f"folder:{tmp_path}", "train", image_size=4)  # listed again (each split lists it): no repeat
    assert len(train) == 2
    [record] = [r for r in caplog.records if "not read" in r.getMessage()]
    assert "4 files not read, by extension (.heic 3, .txt 1)" in record.getMessage()
    for name in ("loose.jpg", "notes.txt"):  # beside the class folders: no class, and had gone unsaid
        (tmp_path / "train" / name).write_bytes(b"x")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        load_split(f"folder:{tmp_path}", "train", image_size=4)
    assert "2 files beside the class folders (.jpg 1, .txt 1) not read" in caplog.text


def test_caltech101_10(shared_data):
    uri = f"folder:{shared_data / 'caltech101-10'}"
    train = load_split(uri, "train", image_size=16)
    val = load_split(uri, "val", max_in_memory_bytes=0)  # file-based: nothing decoded
    assert (len(train), train.skipped, len(val)) == (776, 0, 392)
    assert train.class_names[:2] == ["Leopards", "bonsai"] and train.num_classes == 10
    assert torch.bincount(train.labels).tolist() == [133, 85, 44, 66, 66, 53, 57, 56, 57, 159]
    assert torch.bincount(val.labels).tolist() == [67, 43, 23, 33, 34, 27, 29, 28, 28, 80]
    assert val.files[0].parent.name == "Leopards" and val.files[0].name == sorted(p.name for p in val.files[:67])[0]
    info = describe(uri)
    assert (info.num_train, info.num_classes, info.channels) == (776, 10, 3) and 114 <= info.image_size <= 300


def _tagged(image: Image.Image, orientation: int, fmt: str) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation  # the EXIF Orientation tag
    buffer = io.BytesIO()
    image.save(buffer, fmt, exif=exif, **({"quality": 95} if fmt == "JPEG" else {}))
    return buffer.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])  # JPEG: the fast simplejpeg path must not skip the tag
def test_an_exif_orientation_is_applied_as_a_viewer_shows_the_photo(fmt: str) -> None:
    """A phone's portrait photo stores its pixels sideways with an Orientation tag: it was trained on, predicted
    and explained sideways."""
    rng = np.random.default_rng(0)
    stored = Image.fromarray(rng.integers(0, 255, (24, 40, 3), dtype=np.uint8))  # 40 wide, 24 high
    plain = decode_image(_tagged(stored, 1, fmt))  # orientation 1: as stored
    turned = decode_image(_tagged(stored, 6, fmt))  # 6: the viewer turns it 90 degrees clockwise
    assert plain.shape == (3, 24, 40) and turned.shape == (3, 40, 24)
    assert torch.equal(turned, torch.rot90(plain, k=-1, dims=(1, 2)))
    mirrored = decode_image(_tagged(stored, 2, fmt))  # 2: mirrored left to right
    assert torch.equal(mirrored, plain.flip(2))
    square = decode_image(_tagged(stored, 6, fmt), size=16)  # resized and cropped as the viewer shows it
    upright = Image.fromarray(turned.permute(1, 2, 0).numpy())
    assert torch.equal(square, decode_image(_tagged(upright, 1, "PNG"), size=16))


def test_a_class_folder_named_train_is_named_as_the_clash(tmp_path: Path) -> None:
    """vehicles/{bus,car,train}: 'train' was read as the training split, and the error said it had no class
    sub-folders."""
    for name in ("bus", "car", "train"):
        (tmp_path / name).mkdir()
        for i in range(2):
            Image.new("RGB", (8, 8), (i, 0, 0)).save(tmp_path / name / f"{i}.png")
    with pytest.raises(ValueError, match=r"/train holds images, not class folders, beside the folders bus, car: a"):
        describe(f"folder:{tmp_path}")
    (tmp_path / "train").rename(tmp_path / "train_")
    assert describe(f"folder:{tmp_path}").num_classes == 3
