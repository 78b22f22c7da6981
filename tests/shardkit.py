"""Small shard data sets for the data and training tests: images that carry their own index."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image


def numbered_images(count: int, side: int = 8, classes: int = 10, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """uint8 (N, side, side) grayscale images whose first two pixels spell the index (i % 256, i // 256)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (count, side, side), dtype=np.uint8)
    images[:, 0, 0] = np.arange(count) % 256
    images[:, 0, 1] = np.arange(count) // 256
    return images, (np.arange(count) * 7 % classes).astype(np.int64)


def image_ids(images: torch.Tensor) -> list[int]:
    """The indices spelled by uint8 (B, C, H, W) numbered images."""
    return (images[:, 0, 0, 0].long() + 256 * images[:, 0, 0, 1].long()).tolist()


def numbered_npz(path: Path, count: int, classes: int = 10) -> Path:
    """npz:PATH with images/labels (a fixed 20 % test hold-out) of numbered 8x8 grayscale images."""
    images, labels = numbered_images(count, classes=classes)
    np.savez(path, images=images, labels=labels, class_names=np.array([f"c{k}" for k in range(classes)]))
    return path


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    """A tar of (name, bytes) members in this order."""
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def numbered_shards(
    directory: Path, sizes: list[int], prefix: str = "train", start: int = 0, classes: int = 10
) -> list[int]:
    """Shards {prefix}-00000k.tar holding `sizes[k]` numbered samples each (.png + .cls); returns all ids."""
    directory.mkdir(parents=True, exist_ok=True)
    images, labels = numbered_images(start + sum(sizes), classes=classes)
    ids, position = [], start
    for k, size in enumerate(sizes):
        members = []
        for i in range(position, position + size):
            members += [(f"s{i:06d}.png", png(images[i])), (f"s{i:06d}.cls", str(labels[i]).encode())]
            ids.append(i)
        write_tar(directory / f"{prefix}-{k:06d}.tar", members)
        position += size
    return ids
