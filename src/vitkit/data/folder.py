"""The `folder:` source: one split as vitkit.data.sources wants it (files listed, nothing decoded yet), and
its description from the listing and a few image headers.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vitkit.data.holdout import fixed_test_split
from vitkit.data.images import image_size as _header_size
from vitkit.data.imageset import UNLABELLED, VAL_HINT, ImageSet, SourceInfo, fits_in_memory
from vitkit.data.listing import class_folders, scan_flat, scan_folder, shards_instead


def folder_roots(root: Path) -> dict[str, Path]:
    """Which directory holds each part of a folder source."""
    if not root.is_dir():
        what = (
            "is a file; give the directory that holds the data" if root.is_file() else "data directory does not exist"
        )
        raise FileNotFoundError(f"{root}: {what}")
    if not (root / "train").is_dir():
        return {"train": root}
    _refuse_a_class_named_train(root)
    roots = {"train": root / "train"}
    if (root / "val").is_dir():
        roots["val"] = roots["test"] = root / "val"
    if (root / "test").is_dir():
        roots["test"] = root / "test"
    return roots


def folders(path: Path) -> list[str]:
    """The visible sub-folders of `path`, sorted."""
    return sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def _refuse_a_class_named_train(root: Path) -> None:
    """root/train that holds images and no class folders, beside other folders of images, is a class named
    "train" (vehicles/{bus,car,train}): it was read as the training split, with "no class sub-folders"."""
    others = [name for name in folders(root) if name not in ("train", "val", "test")]
    if others and not folders(root / "train"):
        raise ValueError(
            f"{root}/train holds images, not class folders, beside the folders {', '.join(others[:5])}: a folder "
            "named 'train' (like 'val' and 'test') is read as a split; rename that class folder (e.g. 'train_')"
        )


def read_folder(root: Path, part: str, size: int, channels: int, labelled: bool = True) -> ImageSet:
    """A file-based ImageSet (nothing decoded yet); `_materialise` decodes it if it is small.

    Without DIR/test and DIR/val, "test" is a fixed class-stratified hold-out of the training files and
    "train" the rest, so every folder layout trains and reports a test accuracy.  Read without labels
    (`labelled=False`), every image file under the directory (hidden ones aside) is class 0 of one class.
    """
    roots = folder_roots(root)
    class_names = class_folders(roots["train"]) if labelled else [UNLABELLED]
    if part == "val" and part not in roots:
        raise ValueError(f"folder:{root} has no val split (no {root}/val directory): {VAL_HINT}")
    source = roots[part] if part in roots else roots["train"]
    training = source == roots["train"]
    files, labels = scan_folder(source, class_names, training=training) if labelled else scan_flat(source)
    if not files:
        where = " in its class folders" if labelled else ""
        raise ValueError(f"{source}: no image files (.jpg, .png, ...){where}{shards_instead(source)}")
    found = ImageSet(
        images=None,
        files=files,
        labels=torch.tensor(labels, dtype=torch.int64),
        class_names=class_names,
        load_size=size,
        channels=channels,
        origin=str(source),
    )
    return found if "test" in roots else fixed_test_split(found, part, str(source))


def describe_folder(uri: str, root: Path, size: int, max_in_memory_bytes: int, labelled: bool = True) -> SourceInfo:
    """The training part's counts from its listing, its typical side from about 32 image headers (no pixels)."""
    part = read_folder(root, "train", size, 3, labelled)
    sample = part.files[:: max(1, len(part.files) // 32)]  # about 32 headers spread over the classes
    sides = sorted(min(s) for s in map(_header_size, sample) if s)
    typical = sides[len(sides) // 2] if sides else 0
    fits = fits_in_memory(len(part), 3, size, max_in_memory_bytes)
    return SourceInfo(
        uri=uri,
        num_train=len(part),
        num_classes=part.num_classes,
        image_size=typical,
        channels=3,
        in_memory=fits,
        access="memory" if fits else "files",
    )


def one_class_hint(root: Path) -> str:
    """Where a folder reads as one class whose folder holds folders of its own (DIR/data/{cat,dog}/...): the
    classes are likely those, one level down; "" otherwise."""
    only = folders(folder_roots(root)["train"])
    if len(only) != 1:
        return ""
    inner = folder_roots(root)["train"] / only[0]
    if not folders(inner):
        return ""
    return f"; its one class folder holds folders of its own, so its classes may be one level down: folder:{inner}"
