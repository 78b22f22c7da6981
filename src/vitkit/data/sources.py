"""Data sources named by URI (DESIGN.md) -> `ImageSet`s of uint8 (N, C, H, W) images and int64 labels.

    digits            scikit-learn's bundled 8x8 digits (1,797 images, 10 classes); needs no files
    mnist:DIR         the original IDX files (`train-images-idx3-ubyte.gz`, ...; `.gz` optional)
    fashion-mnist:DIR the same layout as mnist
    cifar10:DIR       official binary version: data_batch_1..5.bin, test_batch.bin (+ batches.meta.txt)
    cifar100:DIR      official binary version: train.bin, test.bin (<coarse><fine> labels; fine is the class)
    folder:DIR        ImageFolder layout DIR/<class>/*.jpg or DIR/train/<class>/ + DIR/val/<class>/ (vitkit.data.folder)
    npz:FILE          arrays x_train, y_train, x_test, y_test (or images, labels); NHWC or NCHW uint8
                      (these six: vitkit.data.arrays)
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

A wds: or Parquet split with no val split of its own holds out whole shards (row groups) where they hold
about the asked share, else a class-stratified draw of its samples (vitkit.data.holdout.hold_out_val).

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

import difflib
import itertools
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch

from vitkit.data import arrays, folder, large
from vitkit.data.holdout import (
    FIXED_TEST_FRACTION,
    FIXED_TEST_MAX,
    FIXED_TEST_SEED,
    hold_out_val,
    stratified_split,
)
from vitkit.data.images import MAX_PIXELS, BadImageError, DecompressionBombError, decode_image
from vitkit.data.imageset import MAX_FILES_IN_MEMORY, VAL_HINT, EmptySplitError, ImageSet, SourceInfo
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
Split = Literal["train", "val", "test"]
# Whether a left-right mirror keeps an image's label: not for digits; yes for clothes and natural images.
# Sources not listed (folders, npz) cannot know: training follows the convention (flip) and says so.
MIRROR_KEEPS_LABEL = {"digits": False, "mnist": False, "fashion-mnist": True, "cifar10": True, "cifar100": True}


def data_name(uri: str) -> str:
    """A source URI as a file-name part: "fashion-mnist:/x/fashion-mnist" -> "fashion-mnist", "folder:/x/photos"
    -> "folder-photos"."""
    kind, path = parse_uri(uri)
    tail = Path(path).stem if path else ""
    name = kind if not tail or tail == kind else f"{kind}-{tail}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def parse_uri(uri: str) -> tuple[str, str]:
    """ "fashion-mnist:/x" -> ("fashion-mnist", "/x"); "digits" -> ("digits", ""); "folder:~/photos" -> the home's
    (a shell expands ~ only at a word's start, not after "folder:")."""
    kind, _, path = uri.partition(":")
    path = os.path.expanduser(path) if path.startswith("~") else path
    if kind not in KINDS:
        raise ValueError(
            f"unknown data source {uri!r}; expected one of {', '.join(k + ':' for k in KINDS)} (digits needs no path)"
            + _meant(uri, kind, path)
        )
    if kind != "digits" and not path:
        raise ValueError(f"data source {uri!r} needs a path: {kind}:PATH")
    if kind == "digits" and path:
        raise ValueError(f"data source 'digits' takes no path, got {uri!r}")
    return kind, path


def _array_kind(directory: Path) -> str | None:
    """The array reader a directory's files call for: IDX files (Fashion-MNIST where the folder's path says so,
    else MNIST), CIFAR's binary batches; None for any other."""
    names = {path.name for path in itertools.islice(directory.iterdir(), 100)}  # a look, not a scan
    if names & {"train-images-idx3-ubyte", "train-images-idx3-ubyte.gz"}:
        return "fashion-mnist" if "fashion" in str(directory.resolve()).lower() else "mnist"  # FashionMNIST/raw
    if "data_batch_1.bin" in names or "cifar-10-batches-bin" in names:
        return "cifar10"
    return "cifar100" if "train.bin" in names or "cifar-100-binary" in names else None


def _meant(uri: str, kind: str, path: str) -> str:
    """The URI a newcomer likely meant: folder:PATH for a bare path to a directory, the scheme a near miss of one
    (fashion_mnist:, Folder:) names; "" where none is likely."""
    directory = Path(os.path.expanduser(uri))
    if directory.is_dir():  # what it holds says which reader: arrays, shards, a saved HF dataset, else image folders
        return f"; did you mean {_array_kind(directory) or large.reader_for(directory) or 'folder'}:{uri}?"
    close = difflib.get_close_matches(kind.lower().replace("_", "-"), KINDS, n=1, cutoff=0.8)
    return f"; did you mean {close[0]}:{path}?" if close and path else ""


def check_mirror_views(uri: str, flip_views: bool, asked_by: str = "--flip-views") -> None:
    """Refuse mirror-image views (test-time flips) of a source whose mirror images change the label (digits);
    `asked_by` is the flag or setting that asked for them."""
    if flip_views and mirror_keeps_label(uri) is False:
        raise ValueError(
            f"{uri}: a mirror image changes the label here (digits, handwriting), so averaging each image with its "
            f"mirror image (flip views) would mix classes; leave out {asked_by}"
        )


def mirror_keeps_label(uri: str) -> bool | None:
    """True / False where the source's kind (or the dataset.json that `vitkit shard` wrote from it) tells
    whether flips preserve labels, None where it cannot."""
    kind, path = parse_uri(uri)
    if kind == "wds":
        return large.index_mirror_rule(path)
    return MIRROR_KEEPS_LABEL.get(kind)


def separate_val(uri: str, reading: Mapping[str, Any] | None = None) -> bool:
    """Whether a source has a validation split of its own, apart from its test split (folder DIR/val + DIR/test,
    val-* beside test-* shards, a validation beside a labelled test split), as `reading` (load_split's
    `image_column`, `label_column`, `labelled`) reads it."""
    kind, path = parse_uri(uri)
    if kind in ("wds", "hf"):
        return {"val", "test"} <= set(large.split_names(kind, path, reading))
    roots = folder.folder_roots(Path(path)) if kind == "folder" else {}
    return "val" in roots and roots["val"] != roots.get("test")


def check_named_split(uri: str, split: str, reading: Mapping[str, Any] | None = None) -> None:
    """A command's `--split`, where a source's val split stands in for its test split (a folder of train/ and
    val/ only, val-* shards without test-*): "val" would score the test images, so it is refused (ValueError).
    `reading`: as `separate_val`."""
    if split != "val" or separate_val(uri, reading):
        return
    kind, path = parse_uri(uri)
    if kind in ("wds", "hf"):
        splits = large.split_names(kind, path, reading)
    else:
        splits = list(folder.folder_roots(Path(path))) if kind == "folder" else []
    if "val" in splits:  # a val split, and (separate_val: no) none of its own beside the test split
        raise ValueError(
            f"{uri}: its val split is also its test split (it has no test split of its own), so --split val would "
            "score the test images: use --split test (a training run validates on a hold-out of its train split)"
        )


def _read(
    kind: str, path: str, part: str, size: int, channels: int | None, columns: tuple[str, str], labelled: bool
) -> ImageSet | ShardSet:
    if kind == "folder":
        return folder.read_folder(Path(path), part, size, channels or 3, labelled=labelled)
    if kind == "wds":
        return large.read_wds(path, part, size, channels, labelled=labelled)
    if kind == "hf":
        return large.read_hf(path, part, size, channels, *columns, labelled=labelled)
    if part == "val":
        raise ValueError(f"{kind} has no separate val split: {VAL_HINT}")
    if kind == "digits":
        return arrays.read_digits(part)
    if kind in ("mnist", "fashion-mnist"):
        return arrays.read_idx(kind, Path(path), part)
    if kind in ("cifar10", "cifar100"):
        return arrays.read_cifar(kind, Path(path), part)
    return arrays.read_npz_split(Path(path), part)


def _hold_out(whole: ImageSet | ShardSet, split: str, fraction: float, seed: int) -> ImageSet | ShardSet:
    """The train or val part of a training split: class-stratified, or whole shards of a stream; its origin
    says which."""
    if isinstance(whole, ShardSet):
        subset, how = hold_out_val(whole, fraction, seed, split)
    else:
        keep, held = stratified_split(whole.labels, fraction, seed)
        subset, how = whole.subset(keep if split == "train" else held), "class-stratified"
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
            for a streamed split, whole shards where they hold about that share, else its samples, drawn
            class-stratified from their label members (vitkit.data.holdout.hold_out_val).
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
        if strict and subset.problems:
            raise BadImageError(f"{uri} {split}: damaged shard: {subset.problems[0]}")
    result, reasons = materialise(
        subset, strict=strict, max_in_memory_bytes=max_in_memory_bytes, num_workers=num_workers, max_pixels=max_pixels
    )
    problems = getattr(subset, "problems", [])
    check_usable(result, uri, split, reasons, problems)
    if split == "train" and labelled and isinstance(subset, ImageSet) and isinstance(result, ImageSet):
        _check_no_class_lost(subset, result, uri)
    _log_loaded(uri, split, result, len(problems))
    if split == "test" and labelled and isinstance(result, ImageSet):
        _warn_untested(result)
    if split == "train" and val_fraction == 0.0 and labelled and isinstance(result, ImageSet):
        _warn_untrained(result)
    return result


def _check_no_class_lost(listed: ImageSet, kept: ImageSet, uri: str) -> None:
    """A ValueError where every training file of a class failed to decode: as a class folder without images, it
    cannot be learnt (trained anyway, its figures stood on the other classes alone)."""
    if not kept.skipped:
        return
    lost = sorted(set(listed.labels.tolist()) - set(kept.labels.tolist()))
    if lost:
        counts = torch.bincount(listed.labels, minlength=listed.num_classes)
        sized = [(listed.class_names[c], int(counts[c])) for c in lost[:5]]
        named = ", ".join(f"{name!r} ({count} file{'s' * (count != 1)})" for name, count in sized)
        classes = f"class {named}" if len(lost) == 1 else f"{len(lost)} classes, {named}"
        raise ValueError(
            f"{uri}: no training file of {classes}{' and more' if len(lost) > 5 else ''} decodes (the first bad "
            "files are named above); a class without training images cannot be learnt: replace its files or "
            "remove its folder"
        )


def _warn_untrained(train: ImageSet) -> None:
    """Name the classes the training split holds no image of (test labels beyond train's, a classes.txt naming
    classes no sample holds): the head has their outputs, which nothing trains."""
    absent, names = _absent(train)
    if absent:
        one = absent == 1
        log.warning(
            "%d class%s no training image (%s): the model cannot learn %s",
            absent, " has" if one else "es have", names, "it" if one else "them",
        )  # fmt: skip


def _warn_untested(test: ImageSet) -> None:
    """Name the classes a test split holds no image of (a fixed hold-out leaves a class of one image none)."""
    absent, names = _absent(test)
    if absent:
        why = " (a class needs 2 images or more for one to be held out)" if "hold-out" in test.origin else ""
        log.warning(
            "%d class%s no test image (%s): %s accuracy is not measured%s",
            absent, " has" if absent == 1 else "es have", names, "its" if absent == 1 else "their", why,
        )  # fmt: skip


def _absent(split: ImageSet) -> tuple[int, str]:
    """(how many classes `split` holds no image of, the first five's names)."""
    absent = (torch.bincount(split.labels, minlength=split.num_classes) == 0).nonzero().flatten().tolist()
    return len(absent), ", ".join(split.class_names[i] for i in absent[:5]) + (", ..." if len(absent) > 5 else "")


def _log_loaded(uri: str, split: str, result: ImageSet | ShardSet, damaged: int) -> None:
    """One line for a split as loaded: its size, classes, how training reads it, and what was lost."""
    log.info(
        "%s %s: %d images, %d class%s, %s%s%s",
        uri,
        split,
        len(result),
        result.num_classes,
        "" if result.num_classes == 1 else "es",
        ACCESS[result.access],
        f", {result.skipped} bad files skipped" if result.skipped else "",
        f", {damaged} damaged shard(s) (named above: their samples after the damage are lost)" if damaged else "",
    )


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
    if kind != "hf" and (image_column or label_column):  # every command describes its data first
        flag = "--label-column" if label_column else "--image-column"
        raise ValueError(f"{flag} chooses a column of an hf: data set; {uri} has no columns (it is {kind}:)")
    root, size = Path(path), image_size or DEFAULT_FOLDER_SIZE
    if kind in arrays.ARRAY_KINDS:
        return arrays.describe_arrays(kind, uri, root)
    if kind == "wds":
        return large.describe_wds(uri, path, size, max_in_memory_bytes, labelled=labelled)
    if kind == "hf":
        return large.describe_hf(uri, path, size, max_in_memory_bytes, image_column, label_column, labelled=labelled)
    return folder.describe_folder(uri, root, size, max_in_memory_bytes, labelled=labelled)
