"""What `vitkit shard` stores for each sample: the records of a split in the written order, each one's bytes
(a file's own, or downscaled to `max_side`; arrays as PNG) and extension; a file whose header does not open is
left out (None), named in the log."""

from __future__ import annotations

import io
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from vitkit.data import stream
from vitkit.data.images import BadImageError, check_file, open_image, upright
from vitkit.data.imageset import ImageSet
from vitkit.data.shardset import sample_problem

log = logging.getLogger(__name__)

FORMAT_EXT = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp", "GIF": "gif", "BMP": "bmp", "TIFF": "tif", "PPM": "ppm"}


def _png(pixels: torch.Tensor, max_side: int | None = None) -> bytes:
    """uint8 (C, H, W) -> lossless PNG bytes (C = 1: grayscale), downscaled to `max_side` when larger."""
    array = pixels.numpy()
    image = Image.fromarray(array[0], "L") if array.shape[0] == 1 else Image.fromarray(array.transpose(1, 2, 0), "RGB")
    if max_side is not None:
        image.thumbnail((max_side, max_side))  # as `_shrink` does a file, without re-opening what is in memory
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _shrink(data: bytes, max_side: int | None, name: str) -> tuple[bytes, str] | None:
    """(bytes, extension), downscaled to `max_side` when larger; None when the header does not open or claims
    more pixels than the readers accept (refused before any pixel is decoded)."""
    try:
        with open_image(data, name=name) as image:
            fmt = image.format
            if max_side is None or max(image.size) <= max_side:
                return data, FORMAT_EXT.get(fmt, "png" if fmt is None else fmt.lower())
            image.thumbnail((max_side, max_side))  # aspect kept; JPEGs are reduced in the DCT domain first
            image = upright(image)  # its EXIF orientation, which the new file does not carry
            if fmt == "JPEG":
                image = image.convert("L" if image.mode == "L" else "RGB")
            elif image.mode not in ("1", "L", "LA", "P", "RGB", "RGBA", "I;16"):
                image = image.convert("RGB")
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG" if fmt == "JPEG" else "PNG", **({"quality": 95} if fmt == "JPEG" else {}))
            return buffer.getvalue(), "jpg" if fmt == "JPEG" else "png"
    except BadImageError as error:  # the message names the file
        log.warning("leaving out an image that does not open: %s", error)
        return None
    except Exception as error:  # noqa: BLE001 - any undecodable file is left out and counted
        log.warning("leaving out an image that does not open: %s: %s", name, error)
        return None


def _read_bytes(source: Any) -> bytes:
    if isinstance(source, (bytes, bytearray)):
        return bytes(source)
    try:
        check_file(source, str(source))  # a regular file of an image's size: never a 7 GB one read whole
        return Path(source).read_bytes()
    except OSError as error:
        log.warning("leaving out %s: %s", source, error)
    except BadImageError as error:
        log.warning("leaving out an image that does not open: %s", error)
    return b""


def records(data: ImageSet | stream.ShardSet, seed: int) -> Iterator[tuple[int, Callable[[], Any], int]]:
    """(source index, a loader of the raw image, label) in the written order."""
    if isinstance(data, stream.ShardSet):  # front to back, one pass: epoch 0 of a single lane (window-shuffled)
        samples = stream.lane_samples(data, seed, 0, 1, 10 * stream.WINDOW, 0)
        for index in range(len(data)):
            sample = next(samples)
            if sample.absent:  # counted by a stale index, not in the shard: dropped as training drops it
                continue
            problem = sample_problem(sample, data.num_classes)  # a missing label is the reader's problem already
            if problem:  # named here: the encoder only counts it
                log.warning(
                    "leaving out sample %s", problem if problem.startswith(sample.key) else f"{sample.key}: {problem}"
                )
            yield index, (lambda s=sample, g=not problem: s.image if g else b""), -1 if problem else sample.label
        return
    order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed)).tolist()
    for index in order:
        if data.images is not None:
            yield index, (lambda i=index: data.images[i]), int(data.labels[index])
        else:
            yield index, (lambda i=index: data.files[i]), int(data.labels[index])


def encode(item: tuple[int, Callable[[], Any], int], max_side: int | None) -> tuple[int, bytes, str, int] | None:
    index, load, label = item
    raw = load()
    if isinstance(raw, torch.Tensor):
        return index, _png(raw, max_side), "png", label
    data = _read_bytes(raw)
    name = f"sample {index}" if isinstance(raw, (bytes, bytearray)) else str(raw)
    shrunk = _shrink(data, max_side, name) if data and label >= 0 else None
    return (index, *shrunk, label) if shrunk else None
