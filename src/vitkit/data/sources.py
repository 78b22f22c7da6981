"""Data sources named by URI (DESIGN.md) -> `ImageSet`s of uint8 (N, C, H, W) images and int64 labels.

    digits            scikit-learn's bundled 8x8 digits (1,797 images, 10 classes); needs no files
    mnist:DIR         the original IDX files (`train-images-idx3-ubyte.gz`, ...; `.gz` optional)
    fashion-mnist:DIR the same layout as mnist
    cifar10:DIR       official binary version: data_batch_1..5.bin, test_batch.bin (+ batches.meta.txt)
    cifar100:DIR      official binary version: train.bin, test.bin (<coarse><fine> labels; fine is the class)
    folder:DIR        ImageFolder layout DIR/<class>/*.jpg or DIR/train/<class>/ + DIR/val/<class>/ (vitkit.data.folder)
    npz:FILE          arrays x_train, y_train, x_test, y_test (or images, labels); NHWC or NCHW uint8
    wds:DIR|PATTERN   webdataset tar shards (vitkit.data.tarshards: splits by index or name prefix)
    hf:DIR            a Hugging Face dataset on disk: save_to_disk Arrow files or Parquet (vitkit.data.hf)

Splits.  "test" is the official test split; digits, an `images, labels` npz, a folder without
DIR/test or DIR/val and tar shards without test-* or val-* shards have none, so a fixed class-stratified
20 % (at most 10,000 images, the same on every process and worker; vitkit.data.holdout) is held out as
their test split.  For a folder, "test" is DIR/test if present,
else DIR/val.  "train" is the training data minus a class-stratified `val_fraction` held out by
`seed`; "val" is that held-out part, or DIR/val of a folder (beside DIR/test) when `val_fraction` is
0.  The same (uri, val_fraction, seed) always gives the same split; `ImageSet.origin` says where each
part came from.

A wds: or Parquet split with no val split of its own holds out whole shards (row groups) instead.

How training reads a split is its `access` ("memory", "files" or "stream"):
  memory  small sets live in memory as one uint8 tensor (fixed-size sources always; folders, hf: and
          wds: sets whose decoded images fit in `max_in_memory_bytes` and that have at most
          MAX_FILES_IN_MEMORY images, so a million-file folder starts without decoding anything);
  files   larger folders and Arrow datasets: random access, decoded by DataLoader workers (`ImageSet.read`);
  stream  larger tar shards and Parquet files: a `vitkit.data.stream.ShardSet`, read front to back by
          every process and worker.
Fixed-size sources are returned at native size; resizing is the transforms' job.

Labels.  `labelled=False` reads for an objective that uses none (masked patch prediction): a folder without
class sub-folders, shards whose samples have no .cls/.json member and an hf dataset without a label column
are then one class, `UNLABELLED`, and every image is kept; labels that exist are read as ever.  A labelled
reading refuses such a source and says which command takes it.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from dataclasses import replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from vitkit.data import folder, large, readers
from vitkit.data.holdout import (
    FIXED_TEST_FRACTION,
    FIXED_TEST_MAX,
    FIXED_TEST_SEED,
    fixed_test_split,
    stratified_split,
)
from vitkit.data.images import MAX_PIXELS, BadImageError, DecompressionBombError, decode_image
from vitkit.data.imageset import MAX_FILES_IN_MEMORY, EmptySplitError, ImageSet, SourceInfo
from vitkit.data.inmemory import check_usable, materialise
from vitkit.data.readers import DataFormatError
from vitkit.data.stream import ShardSet

__all__ = [
    "ImageSet",
    "SourceInfo",
    "ShardSet",
    "parse_uri",
    "load_split",
    "describe",
    "decode_image",
    "stratified_split",
    "mirror_keeps_label",
    "separate_val",
    "BadImageError",
    "DecompressionBombError",
    "DataFormatError",
    "EmptySplitError",
    "KINDS",
    "MAX_FILES_IN_MEMORY",
    "FIXED_TEST_FRACTION",
    "FIXED_TEST_MAX",
    "FIXED_TEST_SEED",
]

log = logging.getLogger(__name__)

KINDS = ("digits", "mnist", "fashion-mnist", "cifar10", "cifar100", "folder", "npz", "wds", "hf")
DEFAULT_FOLDER_SIZE = 224  # side a folder is decoded to when no image_size is given (the paper's resolution)
FASHION_MNIST_CLASSES = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
Split = Literal["train", "val", "test"]
# Whether a left-right mirror keeps an image's label: not for digits; yes for clothes and natural images.
# Sources not listed (folders, npz) cannot know: training follows the convention (flip) and says so.
MIRROR_KEEPS_LABEL = {"digits": False, "mnist": False, "fashion-mnist": True, "cifar10": True, "cifar100": True}


def parse_uri(uri: str) -> tuple[str, str]:
    """ "fashion-mnist:/x" -> ("fashion-mnist", "/x"); "digits" -> ("digits", "")."""
    kind, _, path = uri.partition(":")
    if kind not in KINDS:
        raise ValueError(
            f"unknown data source {uri!r}; expected one of {', '.join(k + ':' for k in KINDS)} (digits needs no path)"
        )
    if kind != "digits" and not path:
        raise ValueError(f"data source {uri!r} needs a path: {kind}:PATH")
    if kind == "digits" and path:
        raise ValueError(f"data source 'digits' takes no path, got {uri!r}")
    return kind, path


def mirror_keeps_label(uri: str) -> bool | None:
    """True / False where the source's kind (or the dataset.json that `vitkit shard` wrote from it) tells
    whether flips preserve labels, None where it cannot."""
    kind, path = parse_uri(uri)
    if kind == "wds":
        return large.index_mirror_rule(path)
    return MIRROR_KEEPS_LABEL.get(kind)


# --------------------------------------------------------------------------- one reader per kind
def _in_memory(images: np.ndarray, labels: np.ndarray, class_names: list[str]) -> ImageSet:
    # A private copy: readers' arrays may be read-only buffers or shared by the in-process cache.
    return ImageSet(
        images=torch.from_numpy(np.array(images, order="C")),
        labels=torch.from_numpy(labels.astype(np.int64)),
        class_names=class_names,
    )


@functools.lru_cache(maxsize=1)
def _digits() -> ImageSet:
    """scikit-learn's bundled `digits.csv.gz` (64 pixels 0..16 + label per row), read without importing sklearn."""
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is None or not path.is_file():
        raise FileNotFoundError("the digits source needs scikit-learn (its bundled datasets/data/digits.csv.gz)")
    rows = np.loadtxt(path, delimiter=",", dtype=np.uint8)  # (1797, 65)
    pixels = np.rint(rows[:, :64].reshape(-1, 1, 8, 8) * (255.0 / 16.0)).astype(np.uint8)  # 0..16 -> 0..255
    return _in_memory(pixels, rows[:, 64], [str(d) for d in range(10)])


def _read_digits(part: str) -> ImageSet:
    return fixed_test_split(_digits(), part, "digits")


def _read_idx(kind: str, root: Path, part: str) -> ImageSet:
    images, labels = _idx_cached(root, "t10k" if part == "test" else "train", _stamp(root))
    names = FASHION_MNIST_CLASSES if kind == "fashion-mnist" else [str(d) for d in range(10)]
    return replace(
        _in_memory(images, labels, names), origin=f"{root} {'t10k' if part == 'test' else 'train'} IDX files"
    )


def _stamp(root: Path) -> tuple:
    """Directory listing with sizes and mtimes, so the in-process cache notices changed files."""
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: data directory does not exist")
    return tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in root.iterdir() if p.is_file()))


@functools.lru_cache(maxsize=2)
def _idx_cached(root: Path, prefix: str, stamp: tuple) -> tuple[np.ndarray, np.ndarray]:
    return readers.read_idx_pair(root, prefix, num_classes=10)


def _cifar_dir(root: Path, inner: str) -> Path:
    """Accept either the extracted `cifar-10-batches-bin` folder or its parent."""
    return root / inner if (root / inner).is_dir() else root


def _read_cifar(kind: str, root: Path, part: str) -> ImageSet:
    if kind == "cifar10":
        root = _cifar_dir(root, "cifar-10-batches-bin")
        names = [f"data_batch_{i}.bin" for i in range(1, 6)] if part != "test" else ["test_batch.bin"]
        parts = [readers.read_cifar_bin(root / name, 1, 10) for name in names]
        class_names = readers.read_names(root / "batches.meta.txt") or CIFAR10_CLASSES
    else:
        root = _cifar_dir(root, "cifar-100-binary")
        parts = [readers.read_cifar_bin(root / ("test.bin" if part == "test" else "train.bin"), 2, 100)]
        class_names = readers.read_names(root / "fine_label_names.txt") or [str(i) for i in range(100)]
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    return replace(
        _in_memory(images, labels, class_names), origin=f"{root} {'test' if part == 'test' else 'training'} batches"
    )


def _read_npz(path: Path, part: str) -> ImageSet:
    arrays = readers.read_npz(path)
    if "x_train" in arrays:
        images, labels = (
            (arrays["x_test"], arrays["y_test"]) if part == "test" else (arrays["x_train"], arrays["y_train"])
        )
        num = int(max(arrays["y_train"].max(initial=-1), arrays["y_test"].max(initial=-1))) + 1
    else:
        images, labels = arrays["images"], arrays["labels"]
        num = int(labels.max(initial=-1)) + 1
    names = [str(n) for n in arrays["class_names"]] if "class_names" in arrays else [str(i) for i in range(num)]
    whole = _in_memory(images, labels, names)
    if "x_train" in arrays:
        return replace(whole, origin=f"{path} {'x_test' if part == 'test' else 'x_train'}")
    return fixed_test_split(whole, part, str(path))


def separate_val(uri: str) -> bool:
    """Whether a source has a validation split of its own, apart from its test split (folder DIR/val + DIR/test,
    val-* beside test-* shards, a validation beside a test split)."""
    kind, path = parse_uri(uri)
    if kind in ("wds", "hf"):
        return {"val", "test"} <= set(large.split_names(kind, path))
    roots = folder.folder_roots(Path(path)) if kind == "folder" else {}
    return "val" in roots and roots["val"] != roots.get("test")


def _read(
    kind: str, path: str, part: str, size: int, channels: int | None, columns: tuple[str, str], labelled: bool
) -> ImageSet | ShardSet:
    if kind == "digits":
        return _read_digits(part)
    if kind == "folder":
        return folder.read_folder(Path(path), part, size, channels or 3, labelled=labelled)
    if kind == "wds":
        return large.read_wds(path, part, size, channels, labelled=labelled)
    if kind == "hf":
        return large.read_hf(path, part, size, channels, *columns, labelled=labelled)
    if part == "val":
        raise ValueError(f"{kind} has no separate val split; pass val_fraction > 0 to hold out part of train")
    if kind in ("mnist", "fashion-mnist"):
        return _read_idx(kind, Path(path), part)
    if kind in ("cifar10", "cifar100"):
        return _read_cifar(kind, Path(path), part)
    return _read_npz(Path(path), part)


def _hold_out(whole: ImageSet | ShardSet, split: str, fraction: float, seed: int) -> ImageSet | ShardSet:
    """The train or val part of a training split: class-stratified, or whole shards of a stream; its origin
    says which."""
    if isinstance(whole, ShardSet):
        subset = whole.hold_out(fraction, seed)[split == "val"]
    else:
        keep, held = stratified_split(whole.labels, fraction, seed)
        subset = whole.subset(keep if split == "train" else held)
    how = "whole-shard" if isinstance(whole, ShardSet) else "class-stratified"
    subset.origin = (
        f"{whole.origin} minus a {fraction:.1%} validation hold-out (seed {seed})"
        if split == "train"
        else f"a {fraction:.1%} {how} hold-out of {whole.origin} (seed {seed})"
    )
    return subset


def load_split(
    uri: str,
    split: Split,
    *,
    image_size: int | None = None,
    val_fraction: float = 0.0,
    seed: int = 0,
    strict: bool = False,
    max_in_memory_bytes: int = 2 << 30,
    channels: int | None = None,
    num_workers: int | None = None,
    max_pixels: int = MAX_PIXELS,
    image_column: str = "",
    label_column: str = "",
    labelled: bool = True,
) -> ImageSet | ShardSet:
    """One split of the source named by `uri` (see the module docstring for the URIs, splits and `access`).

    Args:
        image_size: side that variable-size files are decoded to (shorter side resized, centre-cropped);
            default DEFAULT_FOLDER_SIZE.  Fixed-size sources ignore it.
        val_fraction: class-stratified fraction of the training data held out as "val" (by `seed`);
            for a streamed split, that fraction of its shards.
        strict: raise `BadImageError` on the first corrupt file instead of skipping and counting it.
        max_in_memory_bytes: a set larger than this after decoding is returned as `files` or a stream;
            its bad images surface later, as `BadImageError` in the loader's workers (skipped, counted).
            A split left with no usable sample raises `EmptySplitError` (how many were skipped, and why).
        channels: 3 (RGB) or 1 (L) for folders (default 3), wds: and hf: (default: the stored images');
            fixed-size sources keep their own channels.
        num_workers: decoding threads for sets decoded up front (default min(8, CPUs)).
        max_pixels: decompression-bomb limit per image.
        image_column, label_column: hf: columns, when the types do not single them out.
        labelled: False for an objective without labels (see "Labels" in the module docstring).
    """
    kind, path = parse_uri(uri)
    if split not in ("train", "val", "test"):
        raise ValueError(f"split must be 'train', 'val' or 'test', got {split!r}")
    size, columns = image_size or DEFAULT_FOLDER_SIZE, (image_column, label_column)
    if split == "test" or val_fraction == 0.0:
        subset = _read(kind, path, split, size, channels, columns, labelled)
    else:
        subset = _hold_out(_read(kind, path, "train", size, channels, columns, labelled), split, val_fraction, seed)
    if isinstance(subset, ShardSet):
        subset.max_pixels = max_pixels  # checked by the workers that decode it
    result, reasons = materialise(
        subset, strict=strict, max_in_memory_bytes=max_in_memory_bytes, num_workers=num_workers, max_pixels=max_pixels
    )
    check_usable(result, uri, split, reasons, getattr(subset, "problems", []))
    damaged = len(getattr(subset, "problems", []))
    log.info(
        "%s %s: %d images, %d classes, %s%s%s",
        uri,
        split,
        len(result),
        result.num_classes,
        ACCESS[result.access],
        f", {result.skipped} bad files skipped" if result.skipped else "",
        f", {damaged} damaged shard(s) (named above: their samples after the damage are lost)" if damaged else "",
    )
    return result


ACCESS = {
    "memory": "in memory",
    "files": "files decoded by DataLoader workers",
    "stream": "streamed from shards by every process and worker",
}


def describe(
    uri: str,
    *,
    image_size: int | None = None,
    max_in_memory_bytes: int = 2 << 30,
    image_column: str = "",
    label_column: str = "",
    labelled: bool = True,
) -> SourceInfo:
    """Counts and sizes of a source from headers, listings and indexes (decodes no pixels, except digits' 100 KB)."""
    kind, path = parse_uri(uri)
    root, size = Path(path), image_size or DEFAULT_FOLDER_SIZE
    if kind == "digits":
        return SourceInfo(
            uri=uri, num_train=len(_read_digits("train")), num_classes=10, image_size=8, channels=1, in_memory=True
        )
    if kind in ("mnist", "fashion-mnist"):
        return SourceInfo(
            uri=uri,
            num_train=readers.idx_count(root, "train"),
            num_classes=10,
            image_size=28,
            channels=1,
            in_memory=True,
        )
    if kind == "cifar10":
        root = _cifar_dir(root, "cifar-10-batches-bin")
        count = sum(readers.cifar_count(root / f"data_batch_{i}.bin", 1) for i in range(1, 6))
        return SourceInfo(uri=uri, num_train=count, num_classes=10, image_size=32, channels=3, in_memory=True)
    if kind == "cifar100":
        count = readers.cifar_count(_cifar_dir(root, "cifar-100-binary") / "train.bin", 2)
        return SourceInfo(uri=uri, num_train=count, num_classes=100, image_size=32, channels=3, in_memory=True)
    if kind == "npz":
        return _describe_npz(uri, root)
    if kind == "wds":
        return large.describe_wds(uri, path, size, max_in_memory_bytes, labelled=labelled)
    if kind == "hf":
        return large.describe_hf(uri, path, size, max_in_memory_bytes, image_column, label_column, labelled=labelled)
    return folder.describe_folder(uri, root, size, max_in_memory_bytes, labelled=labelled)


def _describe_npz(uri: str, path: Path) -> SourceInfo:
    shapes = readers.npz_shapes(path)
    key = "x_train" if "x_train" in shapes else "images"
    if key not in shapes:
        raise DataFormatError(
            f"{path}: holds {sorted(shapes)}; expected x_train, y_train, x_test, y_test or images, labels"
        )
    shape = shapes[key]
    nchw = len(shape) == 4 and shape[1] in (1, 3) and shape[3] not in (1, 3)
    channels = 1 if len(shape) == 3 else (shape[1] if nchw else shape[3])
    side = shape[-1] if nchw or len(shape) == 3 else shape[2]
    with np.load(path, allow_pickle=False) as archive:  # decompresses the labels only
        if key == "images":  # the fixed 20 % test hold-out needs the labels
            labels = torch.from_numpy(archive["labels"].astype(np.int64))
            num_train = len(stratified_split(labels, FIXED_TEST_FRACTION, FIXED_TEST_SEED)[0])
            num_classes = int(labels.max()) + 1 if len(labels) else 0
        else:
            num_train = shape[0]
            num_classes = int(max(archive["y_train"].max(initial=-1), archive["y_test"].max(initial=-1))) + 1
    return SourceInfo(
        uri=uri,
        num_train=num_train,
        num_classes=num_classes,
        image_size=int(side),
        channels=int(channels),
        in_memory=True,
    )
