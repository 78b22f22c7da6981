"""Fuzz targets of the data readers: webdataset shards (with and without dataset.json) and image files.

Each reader is `(make_seed, fuzz_one)`: `make_seed(workdir)` writes valid inputs and returns their
path; `fuzz_one(seed, rng, workdir)` reads one mutation of them and returns "ok" (read as valid) or
"handled" (refused with an error a user sees as one line), and raises on anything else: an exception
the CLI would show as a traceback, or an error message that does not name the file.
"""

from __future__ import annotations

import io
import json
import random
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from mutations import mutate_bytes, mutate_png, mutate_tar
from PIL import Image

from vitkit.data.images import BadImageError, decode_image
from vitkit.data.sources import load_split
from vitkit.data.stream import read_all, sample_problem

USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, PermissionError)  # what `vitkit` reports in one line


class Unhandled(AssertionError):
    """A fuzz input that broke a promise: an error a user would not understand, or none where one was due."""


def _encoded(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def _pixels(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.integers(0, 256, shape, dtype=np.uint8)


# ------------------------------------------------------------------------------ images
def make_image_seed(workdir: Path) -> Path:
    """One small file per format and awkward mode vitkit reads (PNG RGB/palette+transparency/16-bit, JPEG RGB/CMYK,
    GIF, BMP, WebP, TIFF, PPM)."""
    folder = workdir / "images"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(_pixels(rng, (12, 10, 3)))
    files = {
        "rgb.png": _encoded(rgb, "PNG"),
        "palette.png": _encoded(rgb.convert("P"), "PNG", transparency=0),
        "gray16.png": _encoded(Image.fromarray(rng.integers(0, 65536, (9, 7), dtype=np.uint16)), "PNG"),
        "rgb.jpg": _encoded(rgb, "JPEG"),
        "cmyk.jpg": _encoded(rgb.convert("CMYK"), "JPEG"),
        "anim.gif": _encoded(rgb.convert("P"), "GIF"),
        "rgb.bmp": _encoded(rgb, "BMP"),
        "rgba.webp": _encoded(rgb.convert("RGBA"), "WEBP"),
        "lzw.tif": _encoded(rgb, "TIFF", compression="tiff_lzw"),
        "gray.ppm": _encoded(rgb.convert("L"), "PPM"),
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def _named(error: Exception, name: str) -> str:
    if not str(error).startswith(f"{name}: "):
        raise Unhandled(f"the error does not begin with the file's name {name!r}: {error}") from error
    return "handled"


def fuzz_image(seed: Path, rng: random.Random, workdir: Path) -> str:
    """Decode one mutated image (PNG mutations keep their CRCs right half of the time)."""
    source = rng.choice(sorted(seed.iterdir()))
    data = source.read_bytes()
    data = mutate_png(data, rng) if source.suffix == ".png" and rng.random() < 0.5 else mutate_bytes(data, rng)
    name = f"mutant-{source.name}"
    try:
        decoded = decode_image(data, rng.choice([1, 3]), size=rng.choice([None, 16, 64]), name=name)
    except BadImageError as error:
        return _named(error, name)
    if decoded.dtype.is_floating_point or decoded.ndim != 3:
        raise Unhandled(f"{name} decoded to {decoded.dtype} {tuple(decoded.shape)}")
    return "ok"


# ------------------------------------------------------------------------------ shards
def make_shard_seed(workdir: Path) -> Path:
    """A shard of six samples (PNG and JPEG images, .cls and .json labels) and the dataset.json that lists it."""
    folder = workdir / "shards"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    with tarfile.open(folder / "train-000000.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(6):
            image = Image.fromarray(_pixels(rng, (8, 8, 3)))
            ext, data = ("png", _encoded(image, "PNG")) if i % 2 else ("jpg", _encoded(image, "JPEG"))
            label = (".cls", str(i % 3).encode()) if i % 3 else (".json", json.dumps({"label": i % 3}).encode())
            for member, payload in ((f"s{i:04d}.{ext}", data), (f"s{i:04d}{label[0]}", label[1])):
                info = tarfile.TarInfo(member)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    index = {
        "format": "vitkit-wds/1",
        "classes": ["a", "b", "c"],
        "channels": 3,
        "image_size": 8,
        "splits": {"train": [{"shard": "train-000000.tar", "count": 6}]},
    }
    (folder / "dataset.json").write_text(json.dumps(index))
    return folder


def _mutate_index(index: dict, rng: random.Random) -> str:
    entry = index["splits"]["train"][0]
    key, value = rng.choice(
        [
            (entry, "count"),
            (entry, "shard"),
            (index, "classes"),
            (index, "channels"),
            (index, "image_size"),
            (index, "splits"),
        ]
    )
    key[value] = rng.choice([-1, 0, 7, 10**12, "x", None, [], {}, True, 2.5, "../x.tar", ["a"] * 3, "train-000000.tar"])
    text = json.dumps(index)
    return mutate_bytes(text.encode(), rng, 1).decode("utf-8", "replace") if rng.random() < 0.2 else text


def _check_samples(data, case: Path) -> str:
    """Decode every sample as training would; every problem must name its shard."""
    verdict = "ok"
    for sample in read_all(data):
        if str(case) not in sample.key:
            raise Unhandled(f"sample key {sample.key!r} does not name its shard")
        problem = sample_problem(sample, data.num_classes)
        if not problem:
            try:
                decode_image(
                    sample.image, data.channels, size=data.load_size, max_pixels=data.max_pixels, name=sample.key
                )
                continue
            except BadImageError as error:
                _named(error, sample.key)
        verdict = "handled"
    return verdict


def fuzz_shard(seed: Path, rng: random.Random, workdir: Path) -> str:
    """Read one split of a mutated shard (its headers rewritten with valid checksums, or its bytes), with or without
    its index, streamed sample by sample or decoded into memory."""
    case = workdir / f"case-{rng.getrandbits(48):012x}"
    case.mkdir(parents=True)
    try:
        raw = (seed / "train-000000.tar").read_bytes()
        (case / "train-000000.tar").write_bytes(mutate_tar(raw, rng) if rng.random() < 0.7 else mutate_bytes(raw, rng))
        if rng.random() < 0.5:
            (case / "dataset.json").write_text(
                _mutate_index(json.loads((seed / "dataset.json").read_text()), rng)
                if rng.random() < 0.3
                else (seed / "dataset.json").read_text()
            )
        stream, split = rng.random() < 0.5, rng.choice(["train", "train", "test"])  # test: a hold-out of train
        try:
            data = load_split(
                f"wds:{case}", split, image_size=8, max_in_memory_bytes=0 if stream else 1 << 20, num_workers=1
            )
        except USER_ERRORS as error:
            if str(case) not in str(error):
                raise Unhandled(f"the error does not name the data set {case}: {error}") from error
            return "handled"
        return _check_samples(data, case) if stream else ("handled" if data.skipped else "ok")
    finally:
        shutil.rmtree(case, ignore_errors=True)


READERS: dict[str, tuple[Callable[[Path], Path], Callable[[Path, random.Random, Path], str]]] = {
    "shards": (make_shard_seed, fuzz_shard),
    "images": (make_image_seed, fuzz_image),
}
