"""The array formats, read whole into memory: scikit-learn's digits, IDX files (MNIST, Fashion-MNIST), the CIFAR
binaries and npz archives.  One reader each, and `describe_arrays`, which counts a source from its headers.
sources.py dispatches to them by a URI's kind.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from vitkit.data import readers
from vitkit.data.holdout import FIXED_TEST_FRACTION, FIXED_TEST_SEED, fixed_test_split, stratified_split
from vitkit.data.imageset import ImageSet, SourceInfo
from vitkit.data.readers import DataFormatError
from vitkit.data.tarsamples import check_class_names

ARRAY_KINDS = ("digits", "mnist", "fashion-mnist", "cifar10", "cifar100", "npz")
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


def _in_memory(images: np.ndarray, labels: np.ndarray, class_names: list[str]) -> ImageSet:
    # A private copy: readers' arrays may be read-only buffers or shared by the in-process cache.
    return ImageSet(
        images=torch.from_numpy(np.array(images, order="C")),
        labels=torch.from_numpy(labels.astype(np.int64)),
        class_names=class_names,
    )


@functools.lru_cache(maxsize=1)
def digits() -> ImageSet:
    """scikit-learn's bundled `digits.csv.gz` (64 pixels 0..16 + label per row), read without importing sklearn."""
    spec = importlib.util.find_spec("sklearn")
    path = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" if spec and spec.origin else None
    if path is None or not path.is_file():
        raise FileNotFoundError("the digits source needs scikit-learn (its bundled datasets/data/digits.csv.gz)")
    rows = np.loadtxt(path, delimiter=",", dtype=np.uint8)  # (1797, 65)
    pixels = np.rint(rows[:, :64].reshape(-1, 1, 8, 8) * (255.0 / 16.0)).astype(np.uint8)  # 0..16 -> 0..255
    return _in_memory(pixels, rows[:, 64], [str(d) for d in range(10)])


def read_digits(part: str) -> ImageSet:
    return fixed_test_split(digits(), part, "digits")


def read_idx(kind: str, root: Path, part: str) -> ImageSet:
    images, labels = _idx_cached(root, "t10k" if part == "test" else "train", _stamp(root))
    names = FASHION_MNIST_CLASSES if kind == "fashion-mnist" else [str(d) for d in range(10)]
    return replace(
        _in_memory(images, labels, names), origin=f"{root} {'t10k' if part == 'test' else 'train'} IDX files"
    )


def _stamp(root: Path) -> tuple:
    """Directory listing with sizes and mtimes, so the in-process cache notices changed files."""
    if not root.is_dir():
        what = (
            "is a file; give the directory that holds the data" if root.is_file() else "data directory does not exist"
        )
        raise FileNotFoundError(f"{root}: {what}")
    return tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in root.iterdir() if p.is_file()))


@functools.lru_cache(maxsize=2)
def _idx_cached(root: Path, prefix: str, stamp: tuple) -> tuple[np.ndarray, np.ndarray]:
    return readers.read_idx_pair(root, prefix, num_classes=10)


def _cifar_dir(root: Path, inner: str) -> Path:
    """Accept either the extracted `cifar-10-batches-bin` folder or its parent."""
    return root / inner if (root / inner).is_dir() else root


def read_cifar(kind: str, root: Path, part: str) -> ImageSet:
    if kind == "cifar10":
        root = _cifar_dir(root, "cifar-10-batches-bin")
        names = [f"data_batch_{i}.bin" for i in range(1, 6)] if part != "test" else ["test_batch.bin"]
        parts = [readers.read_cifar_bin(root / name, 1, 10) for name in names]
        class_names = _class_names(readers.read_names(root / "batches.meta.txt") or CIFAR10_CLASSES, 10, root)
    else:
        root = _cifar_dir(root, "cifar-100-binary")
        parts = [readers.read_cifar_bin(root / ("test.bin" if part == "test" else "train.bin"), 2, 100)]
        class_names = _class_names(
            readers.read_names(root / "fine_label_names.txt") or list(map(str, range(100))), 100, root
        )
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    return replace(
        _in_memory(images, labels, class_names), origin=f"{root} {'test' if part == 'test' else 'training'} batches"
    )


def _class_names(given: list[str] | np.ndarray, num: int, where: Path) -> list[str]:
    """The names a file gives its classes, one for each class its labels reach: fewer (or a 2-D array) planned a
    model of that many classes, and training then ended in a traceback; none repeated or empty."""
    if isinstance(given, np.ndarray) and given.ndim != 1:
        raise DataFormatError(f"{where}: class_names has shape {given.shape}; expected one name for each class")
    names = [str(name) for name in given]
    check_class_names(names, str(where), "class")
    if len(names) < num:
        raise DataFormatError(
            f"{where}: {len(names)} class names for labels that reach {num - 1}; give a name for each class"
        )
    return names


def read_npz_split(path: Path, part: str) -> ImageSet:
    arrays = readers.read_npz(path)
    if "x_train" in arrays:
        images, labels = (
            (arrays["x_test"], arrays["y_test"]) if part == "test" else (arrays["x_train"], arrays["y_train"])
        )
        num = readers.class_count([arrays["y_train"], arrays["y_test"]], path, "class_names" in arrays)
    else:
        images, labels = arrays["images"], arrays["labels"]
        num = readers.class_count([labels], path, "class_names" in arrays)
    names = _class_names(arrays["class_names"], num, path) if "class_names" in arrays else list(map(str, range(num)))
    whole = _in_memory(images, labels, names)
    if "x_train" in arrays:
        return replace(whole, origin=f"{path} {'x_test' if part == 'test' else 'x_train'}")
    return fixed_test_split(whole, part, str(path))


def describe_arrays(kind: str, uri: str, root: Path) -> SourceInfo:
    """Counts and sizes of an array source from its headers (decodes no pixels, except digits' 100 KB)."""
    if kind == "digits":
        return SourceInfo(
            uri=uri, num_train=len(read_digits("train")), num_classes=10, image_size=8, channels=1, in_memory=True
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
    return _describe_npz(uri, root)


def _describe_npz(uri: str, path: Path) -> SourceInfo:
    shapes = readers.npz_shapes(path)
    keys = next((keys for keys in readers.NPZ_KEYS if all(key in shapes for key in keys)), None)
    if keys is None:  # images without their labels too
        raise DataFormatError(
            f"{path}: holds {sorted(shapes)}; expected x_train, y_train, x_test, y_test or images, labels"
        )
    key, label_keys = keys[0], list(keys[1::2])
    shape = shapes[key]
    if len(shape) not in (3, 4) or min(shape) < 1:
        raise DataFormatError(
            f"{path}: `{key}` has shape {tuple(shape)}; expected images as (N, H, W), (N, H, W, C) or (N, C, H, W)"
        )
    nchw = len(shape) == 4 and shape[1] in (1, 3) and shape[3] not in (1, 3)
    channels = 1 if len(shape) == 3 else (shape[1] if nchw else shape[3])
    side = shape[-1] if nchw or len(shape) == 3 else shape[2]
    with np.load(path, allow_pickle=False) as archive:  # decompresses the labels only
        readers.check_npz_sizes(path, archive.zip, label_keys)  # before numpy allocates what a header claims
        for name in label_keys:
            readers.check_labels(readers.npz_array(archive, name, path), path, name)
        if key == "images":  # the fixed 20 % test hold-out needs the labels
            labels = torch.from_numpy(archive["labels"].astype(np.int64))
            num_train = len(stratified_split(labels, FIXED_TEST_FRACTION, FIXED_TEST_SEED)[0])
            num_classes = readers.class_count([labels.numpy()], path, "class_names" in shapes)
        else:
            num_train = shape[0]
            num_classes = readers.class_count([archive["y_train"], archive["y_test"]], path, "class_names" in shapes)
    return SourceInfo(
        uri=uri,
        num_train=num_train,
        num_classes=num_classes,
        image_size=int(side),
        channels=int(channels),
        in_memory=True,
    )
