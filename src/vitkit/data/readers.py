"""Readers for the fixed-size array formats behind the data URIs: IDX (MNIST, Fashion-MNIST),
the CIFAR-10/100 binary version, and `.npz` archives.

Each reader validates what it reads (magic number, header, size) and raises `DataFormatError` naming
the file, so a wrong or truncated download stops with one clear line instead of a reshape error deep
inside numpy.  Nothing here unpickles: `.npz` files are opened with `allow_pickle=False`.
"""

from __future__ import annotations

import gzip
import struct
import tokenize
import zipfile
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vitkit.bounds import MAX_CLASSES
from vitkit.data.listing import folder_instead
from vitkit.host import available_memory

IDX_IMAGES_MAGIC = 2051  # 0x00000803: unsigned bytes, 3 dims (N, rows, cols)
IDX_LABELS_MAGIC = 2049  # 0x00000801: unsigned bytes, 1 dim (N,)
MAX_IDX_BYTES = 1 << 34  # data an IDX header may claim (MNIST's training images: 47 MB)
CIFAR_PIXELS = 3 * 32 * 32  # one record's image: 1024 R, then 1024 G, then 1024 B bytes, row-major
MAX_NAMES_FILE_BYTES = 1 << 20  # a CIFAR names file (CIFAR-100's: 0.6 KB)


class DataFormatError(ValueError):
    """A data file is missing, truncated or not in the format its name says."""


# ----------------------------------------------------------------------------------------- IDX
def idx_path(directory: Path, stem: str) -> Path:
    """`stem` (e.g. `train-images-idx3-ubyte`) as `.gz` or uncompressed in `directory`."""
    for name in (f"{stem}.gz", stem):
        if (directory / name).is_file():
            return directory / name
    raise DataFormatError(f"{directory}: neither {stem}.gz nor {stem} exists{folder_instead(directory)}")


def _read_bytes(path: Path, limit: int | None = None) -> bytes:
    """The (gunzipped) content of `path`, or only its first `limit` bytes."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as handle:
                return handle.read() if limit is None else handle.read(limit)
        with open(path, "rb") as handle:
            return handle.read() if limit is None else handle.read(limit)
    except (EOFError, OSError, zlib.error) as error:  # truncated or corrupt gzip stream
        raise DataFormatError(f"{path}: cannot read ({error}); the file is truncated or corrupt") from error


def idx_header(path: Path) -> tuple[int, tuple[int, ...]]:
    """(magic, dims) from the first bytes of an IDX file; decompresses only the header."""
    head = _read_bytes(path, 16)
    if len(head) < 8:
        raise DataFormatError(f"{path}: {len(head)} bytes is too short for an IDX header")
    magic = struct.unpack(">i", head[:4])[0]
    if magic not in (IDX_IMAGES_MAGIC, IDX_LABELS_MAGIC):
        raise DataFormatError(
            f"{path}: IDX magic number is {magic}, expected {IDX_IMAGES_MAGIC} (images) or "
            f"{IDX_LABELS_MAGIC} (labels); this is not an IDX ubyte file"
        )
    ndim = magic & 0xFF  # the low byte counts the dimensions
    if len(head) < 4 + 4 * ndim:
        raise DataFormatError(f"{path}: truncated IDX header")
    return magic, struct.unpack(f">{ndim}i", head[4 : 4 + 4 * ndim])


def read_idx(path: Path, expect_magic: int) -> np.ndarray:
    """The uint8 array of an IDX file, after checking its magic number and its exact size."""
    magic, dims = idx_header(path)
    if magic != expect_magic:
        kind = "images" if expect_magic == IDX_IMAGES_MAGIC else "labels"
        raise DataFormatError(f"{path}: IDX magic number is {magic}, expected {expect_magic} for {kind}")
    offset = 4 + 4 * len(dims)
    expected = int(np.prod(dims, dtype=object))
    if min(dims, default=0) < 0 or expected > MAX_IDX_BYTES:
        raise DataFormatError(f"{path}: header claims dims {dims}; not an IDX file of this kind")
    free = available_memory()
    if expected > free:
        raise DataFormatError(
            f"{path}: header claims dims {dims}, {expected:,} bytes, more than the memory available ({free:,} bytes)"
        )
    data = _read_bytes(path, offset + expected + 1)  # a gzip stream that inflates past its header stops here
    if len(data) - offset != expected:
        raise DataFormatError(
            f"{path}: header says {dims} = {expected} bytes of data but the file holds {len(data) - offset}; "
            "the file is truncated or corrupt"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=offset).reshape(dims)


def read_idx_pair(directory: Path, prefix: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 1, 28, 28) and labels (N,) of one MNIST-style split (`prefix` is `train` or `t10k`)."""
    images_file = idx_path(directory, f"{prefix}-images-idx3-ubyte")
    labels_file = idx_path(directory, f"{prefix}-labels-idx1-ubyte")
    images = read_idx(images_file, IDX_IMAGES_MAGIC)
    labels = read_idx(labels_file, IDX_LABELS_MAGIC)
    if images.ndim != 3 or min(images.shape[1:]) < 1:
        raise DataFormatError(f"{images_file}: images of shape {images.shape[1:]}; expected (H, W) of 1 pixel or more")
    if len(images) != len(labels):
        raise DataFormatError(f"{images_file} has {len(images)} images but {labels_file} has {len(labels)} labels")
    if labels.size and labels.max() >= num_classes:
        raise DataFormatError(f"{labels_file}: label {labels.max()} is out of range for {num_classes} classes")
    return images[:, None], labels  # (N, H, W) -> (N, 1, H, W)


def idx_count(directory: Path, prefix: str) -> int:
    """Number of images in a split, from the header alone."""
    return idx_header(idx_path(directory, f"{prefix}-images-idx3-ubyte"))[1][0]


# --------------------------------------------------------------------------------------- CIFAR
def read_cifar_bin(path: Path, label_bytes: int, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 3, 32, 32) and labels (N,) of one CIFAR binary file.

    A record is `label_bytes` label bytes then 3072 pixel bytes.  CIFAR-10 has one label byte; CIFAR-100
    has two, `<coarse><fine>`, and the fine label (the last one) is the class.
    """
    record = label_bytes + CIFAR_PIXELS
    count = cifar_count(path, label_bytes)
    rows = np.fromfile(path, dtype=np.uint8, count=count * record).reshape(-1, record)  # (N, label_bytes + 3072)
    labels = rows[:, label_bytes - 1].astype(np.int64)
    if labels.max() >= num_classes or (label_bytes == 2 and rows[:, 0].max() >= 20):
        raise DataFormatError(f"{path}: label out of range for {num_classes} classes; wrong file for this data set?")
    return rows[:, label_bytes:].reshape(-1, 3, 32, 32), labels  # (N, 3072) -> (N, C, H, W)


def cifar_count(path: Path, label_bytes: int) -> int:
    """The records of a CIFAR binary file, from its size: a whole number of them, which fits in memory."""
    if not path.is_file():
        raise DataFormatError(
            f"{path}: missing (expected the official CIFAR binary version){folder_instead(path.parent)}"
        )
    size, record = path.stat().st_size, label_bytes + CIFAR_PIXELS
    if size == 0 or size % record:
        raise DataFormatError(
            f"{path}: {size} bytes is not a whole number of {record}-byte records; "
            "the file is truncated or not the binary version"
        )
    free = available_memory()
    if size > free:
        raise DataFormatError(f"{path}: {size:,} bytes, more than the memory available ({free:,} bytes)")
    return size // record


def read_names(path: Path) -> list[str] | None:
    """Class names, one per non-empty line (batches.meta.txt, fine_label_names.txt), if the file exists."""
    if not path.is_file():
        return None
    size = path.stat().st_size
    if size > MAX_NAMES_FILE_BYTES:
        raise DataFormatError(f"{path}: {size:,} bytes, more than a names file may be ({MAX_NAMES_FILE_BYTES:,})")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise DataFormatError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


# ----------------------------------------------------------------------------------------- NPZ
NPZ_KEYS = (("x_train", "y_train", "x_test", "y_test"), ("images", "labels"))
# what zipfile and numpy's .npy header parser (a Python literal, tokenised) raise on a damaged archive
NPZ_ERRORS = (OSError, zipfile.BadZipFile, ValueError, EOFError, KeyError, tokenize.TokenError, SyntaxError)


def _npy_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of one `.npy` member, from its header alone."""
    with archive.open(info) as handle:
        version = np.lib.format.read_magic(handle)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(handle)
    return shape, dtype


ZIP_STARTS = (b"PK\x03\x04", b"PK\x05\x06")  # a zip's first member, or an empty zip: what np.load takes as .npz


def require_npz(path: Path) -> None:
    """A DataFormatError unless `path` starts as a zip: np.load reads any other start as .npy or a pickle (refused
    with numpy's advice to allow pickles), whatever zip follows, which zipfile finds anywhere in the file."""
    try:
        with open(path, "rb") as file:
            start = file.read(4)
    except OSError as error:
        raise DataFormatError(f"{path}: cannot read ({error.strerror or error})") from None
    if start not in ZIP_STARTS:
        raise DataFormatError(f"{path}: not an .npz archive (a zip of .npy arrays, as numpy.savez writes)")


def npz_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Array shapes in an `.npz`, read from the `.npy` headers without decompressing the data."""
    require_npz(path)
    shapes = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                shapes[info.filename.removesuffix(".npy")] = _npy_header(archive, info)[0]
    except NPZ_ERRORS as error:
        raise DataFormatError(f"{path}: not a readable .npz archive ({error})") from error
    return shapes


def to_nchw(array: np.ndarray, path: Path, key: str) -> np.ndarray:
    """uint8 NHWC, NCHW or NHW (grayscale) -> NCHW.  A channel axis of size 1, 3 or 4 marks the layout."""
    if array.dtype != np.uint8:
        raise DataFormatError(f"{path}: `{key}` has dtype {array.dtype}; images must be uint8 0..255")
    if array.ndim == 3:
        out = array[:, None]
    elif array.ndim != 4:
        raise DataFormatError(f"{path}: `{key}` has shape {array.shape}; expected (N, H, W, C) or (N, C, H, W)")
    elif array.shape[1] in (1, 3) and array.shape[3] not in (1, 3):
        out = array
    elif array.shape[3] in (1, 3):
        out = array.transpose(0, 3, 1, 2)
    else:
        raise DataFormatError(f"{path}: `{key}` has shape {array.shape}; no channel axis of size 1 or 3")
    if min(out.shape[2:]) < 1:
        raise DataFormatError(f"{path}: `{key}` has shape {array.shape}: images of no pixels")
    return out


def check_npz_sizes(path: Path, archive: zipfile.ZipFile, keys: list[str]) -> None:
    """Each member read (`keys`, of the open `archive`) may claim in its .npy header no more bytes than the member
    holds, and all of them no more than the memory available: numpy allocates what a header claims before it
    reads a byte, so a forged shape would otherwise allocate any amount."""
    try:
        members = [archive.getinfo(f"{key}.npy") for key in keys]
        for info in members:
            shape, dtype = _npy_header(archive, info)
            claimed = int(np.prod(shape, dtype=object)) * dtype.itemsize
            if claimed > info.file_size:
                raise DataFormatError(
                    f"{path}: `{info.filename}` claims shape {shape} ({claimed:,} bytes) but holds "
                    f"{info.file_size:,} bytes"
                )
    except NPZ_ERRORS as error:
        if isinstance(error, DataFormatError):
            raise
        raise DataFormatError(f"{path}: cannot read .npz ({error})") from error
    need, free = sum(info.file_size for info in members), available_memory()
    if need > free:
        raise DataFormatError(
            f"{path}: {', '.join(keys)} inflate to {need:,} bytes, more than the {free:,} bytes of memory available"
        )


def mostly_empty(present: int, total: int) -> bool:
    """Whether class ids 0..total-1 of which `present` hold an image are mostly empty: the mark of one stray label
    (30000 among 0..2) where no class list names the classes, which is refused rather than made a model of."""
    return total - present > present


def class_count(label_arrays: Sequence[np.ndarray], path: Path, named: bool) -> int:
    """K, the largest label + 1, of arrays of checked labels; a DataFormatError where no class names are given
    (`named`) and most of the ids 0..K-1 have no image (`mostly_empty`)."""
    arrays = [labels for labels in label_arrays if labels.size]
    top = max((int(labels.max()) for labels in arrays), default=-1)
    present = len(np.unique(np.concatenate(arrays))) if arrays else 0
    if not named and mostly_empty(present, top + 1):
        raise DataFormatError(
            f"{path}: {top + 1 - present} of the {top + 1} class ids 0..{top} have no image: the labels are class "
            f"indices and no class_names array names the classes; if label {top} is a stray one, fix it, else "
            "add class_names"
        )
    return top + 1


def check_labels(labels: np.ndarray, path: Path, key: str, count: int | None = None) -> None:
    """A DataFormatError where an array of class labels is not 1-D integers (`count` of them, where given) or
    holds one below 0 or at MAX_CLASSES or above (one stray label would otherwise plan a model with that many
    classes)."""
    if labels.ndim != 1 or labels.dtype.kind not in "iu" or (count is not None and len(labels) != count):
        how_many = "" if count is None else f"{count} "
        raise DataFormatError(f"{path}: `{key}` must be {how_many}integer labels, got {labels.dtype} {labels.shape}")
    if labels.size and labels.min() < 0:
        raise DataFormatError(f"{path}: `{key}` has negative labels")
    if labels.size and labels.max() >= MAX_CLASSES:
        index = int(labels.argmax())
        raise DataFormatError(
            f"{path}: `{key}` holds label {int(labels[index])} (at index {index}); class labels run "
            f"0..{MAX_CLASSES - 1}"
        )


def npz_array(archive: Any, key: str, path: Path) -> np.ndarray:
    """`archive[key]` of an np.load'ed `.npz`; a DataFormatError naming the file and the array where it holds
    Python objects, which are not unpickled."""
    try:
        return archive[key]
    except ValueError as error:
        if "allow_pickle" not in str(error):
            raise
        raise DataFormatError(
            f"{path}: {key} holds Python objects (an array of mixed or string values), which vitkit does not "
            "unpickle: store integer class ids (and the names as a 'class_names' array of strings)"
        ) from None


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an `.npz` file, never unpickling; images are returned NCHW, labels int64.  Only the
    arrays used are read: another member may inflate to any size."""
    require_npz(path)
    try:
        with np.load(path, allow_pickle=False) as archive:
            names = list(archive.files)
            keys = next((keys for keys in NPZ_KEYS if all(key in names for key in keys)), None)
            if keys is None:
                raise DataFormatError(
                    f"{path}: holds {sorted(names)}; expected x_train, y_train, x_test, y_test or images, labels"
                )
            wanted = [*keys, *(["class_names"] if "class_names" in names else [])]
            check_npz_sizes(path, archive.zip, wanted)  # the archive numpy opened: its headers, no second open
            arrays = {key: npz_array(archive, key, path) for key in wanted}
    except DataFormatError:
        raise
    except NPZ_ERRORS as error:
        raise DataFormatError(f"{path}: cannot read .npz ({error})") from error
    out = {}
    for image_key, label_key in zip(keys[0::2], keys[1::2]):
        images = to_nchw(arrays[image_key], path, image_key)
        labels = arrays[label_key]
        check_labels(labels, path, label_key, count=len(images))
        out[image_key], out[label_key] = images, labels.astype(np.int64)
    if "class_names" in arrays:
        out["class_names"] = arrays["class_names"]
    return out
