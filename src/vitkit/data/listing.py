"""Image folders as lists: the class sub-folders of an ImageFolder-style directory and the image files in
them, recursive and sorted, held as one byte-string array (a million paths in megabytes, not objects).
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import overload

import numpy as np
import torch

from vitkit.data.images import IMAGE_EXTENSIONS, NoLabelsError

log = logging.getLogger(__name__)


def class_folders(root: Path) -> list[str]:
    """Class names of an ImageFolder-style `root`: its sub-directories, in sorted order (capitals first)."""
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory")
    entries = [entry for entry in os.scandir(root) if not entry.name.startswith(".")]
    names = sorted(entry.name for entry in entries if entry.is_dir())
    if not names:
        expected = f"{root}: no class sub-folders (expected {root}/<class>/<image>.jpg)"
        if instead := shards_instead(root):  # a wds: source, not a folder of images without labels
            raise ValueError(expected + instead)
        raise NoLabelsError(f"{expected}; vitkit pretrain-mpp reads a folder of images without labels")
    loose = Counter(
        Path(e.name).suffix.lower() or "no extension" for e in sorted(entries, key=lambda e: e.name) if not e.is_dir()
    )
    key = (str(root), (("beside the class folders", loose.total()),))
    if loose and key not in _WARNED:  # an image there has no class: it would be left out unsaid
        _WARNED.add(key)
        log.warning(
            "%s: %d file%s beside the class folders (%s) not read: only the files inside a class folder are",
            root,
            loose.total(),
            "" if loose.total() == 1 else "s",
            _kinds(loose),
        )
    return names


def shards_instead(root: Path) -> str:
    """ "; it holds .tar shards: read them with wds:ROOT" where `root` holds .tar files and no image, else ""."""
    names = [name.lower() for name in os.listdir(root) if not name.startswith(".")]
    shards = any(name.endswith(".tar") for name in names) and not any(n.endswith(IMAGE_EXTENSIONS) for n in names)
    return f"; it holds .tar shards: read them with wds:{root}" if shards else ""


def folder_instead(root: Path, depth: int = 3, looked: int = 256) -> str:
    """ "; it holds image files: read them with folder:ROOT" where an image lies within `depth` levels of `root`
    (a train/<class>/ or <class>/ layout) among the first `looked` entries of each directory; the wds: hint where
    it holds .tar shards (`shards_instead`); else ""."""

    def has_images(directory: Path, left: int) -> bool:
        try:
            with os.scandir(directory) as entries:
                for _, entry in zip(range(looked), entries):
                    if entry.is_file() and entry.name.lower().endswith(IMAGE_EXTENSIONS):
                        return True
                    if left > 1 and entry.is_dir() and not entry.name.startswith(".") and has_images(entry, left - 1):
                        return True
        except OSError:
            return False
        return False

    if has_images(root, depth):
        return f"; it holds image files: read them with folder:{root}"
    return shards_instead(root) if root.is_dir() else ""


def scan_flat(root: Path) -> tuple[FileList, list[int]]:
    """Every image file under `root` (recursive, sorted), all of class 0: a folder read without labels."""
    skipped: Counter[str] = Counter()
    files = _image_files(str(root), skipped)
    _warn_skipped(root, skipped)
    return FileList.of(files), [0] * len(files)


class FileList(Sequence[Path]):
    """File paths stored as one numpy byte-string array (about N x path-length bytes).

    A million `Path` objects take seconds to build and, being a million refcounted Python objects,
    are copied page by page into every forked DataLoader worker; one array is neither.
    """

    def __init__(self, paths: np.ndarray):
        self._paths = paths  # dtype S<n>: os.fsencode'd paths

    @classmethod
    def of(cls, paths: Sequence[str | os.PathLike]) -> FileList:
        return cls(np.array([os.fsencode(p) for p in paths], dtype=bytes) if len(paths) else np.empty(0, "S1"))

    def __len__(self) -> int:
        return len(self._paths)

    @overload
    def __getitem__(self, i: int) -> Path: ...
    @overload
    def __getitem__(self, i: slice) -> FileList: ...

    def __getitem__(self, i: int | slice) -> Path | FileList:
        if isinstance(i, slice):
            return FileList(self._paths[i])
        return Path(os.fsdecode(self._paths[i]))

    def take(self, index: torch.Tensor | Sequence[int]) -> FileList:
        """The paths at `index`, in that order."""
        return FileList(self._paths[np.asarray(index, dtype=np.int64)])

    def name(self, i: int) -> str:
        return os.fsdecode(self._paths[i])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # type: ignore[assignment]


def _image_files(folder: str, skipped: Counter[str]) -> list[str]:
    """Image files under `folder`, recursively, hidden ones and hidden directories aside (as for class folders),
    sorted; other files that are not hidden, and broken links, are counted in `skipped` by lower-case suffix.
    Symlinked directories are followed, each real directory once (the first link by name), but not one into
    the data set (another class) or above it.
    os.scandir's file types avoid one stat per file."""
    root = os.path.dirname(os.path.realpath(folder))  # the data set's: a link into it or above it is not followed
    found, pending, seen = [], [folder], {os.path.realpath(folder)}
    while pending:
        with os.scandir(pending.pop()) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
        for entry in entries:
            if entry.name.startswith("."):  # .ipynb_checkpoints, .git, .DS_Store, macOS's ._x.jpg: no data
                continue
            try:
                is_dir = entry.is_dir()
            except OSError:  # a link to itself (ELOOP)
                skipped["broken link"] += 1
                continue
            if is_dir:
                real = os.path.realpath(entry.path)
                linked = entry.is_symlink()
                if real not in seen and not (linked and (_within(real, root) or _within(root, real))):
                    seen.add(real)
                    pending.append(entry.path)
            elif entry.name.lower().endswith(IMAGE_EXTENSIONS) and entry.is_file():
                found.append(entry.path)
            elif entry.is_file():
                skipped[os.path.splitext(entry.name)[1].lower() or "(no suffix)"] += 1
            elif entry.is_symlink():
                skipped["broken link"] += 1
    return sorted(found, key=lambda path: path.split(os.sep))  # the order of sorted Path objects


def _within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


_WARNED: set[tuple[str, tuple[tuple[str, int], ...]]] = set()  # (root, counts) already warned in this process


def _warn_skipped(root: Path, skipped: Counter[str]) -> None:
    """One warning for the files under `root` that were not read because of their suffix, counted by kind
    (a folder of phone photos in .heic would otherwise shrink unnoticed); once a process, though a run lists
    the folder for each split."""
    key = (str(root), tuple(sorted(skipped.items())))
    if skipped and key not in _WARNED:
        _WARNED.add(key)
        log.warning(
            "%s: %d file%s not read, by extension (%s); vitkit reads %s",
            root,
            skipped.total(),
            "" if skipped.total() == 1 else "s",
            _kinds(skipped),
            " ".join(IMAGE_EXTENSIONS),
        )


def _kinds(skipped: Counter[str]) -> str:
    """'.heic 3, .txt 1': the commonest suffixes first, five at most."""
    kinds = ", ".join(f"{suffix} {count}" for suffix, count in skipped.most_common(5))
    return kinds + (", ..." if len(skipped) > 5 else "")


def scan_folder(root: Path, class_names: Sequence[str], *, training: bool = True) -> tuple[FileList, list[int]]:
    """Image files under `root/<class>/` (recursive, sorted) and their class indices in `class_names`.

    In the training split (`training`) a class folder without image files is an error: the class would be one
    of the model's outputs with nothing to learn it from.  In a val/ or test/ split it is a class not tested.

    os.scandir's file types spare a stat per file: 200,000 files list about 4x faster than with pathlib's
    rglob + is_file (benchmarks/data_pipeline.py --listing).
    """
    index = {name: i for i, name in enumerate(class_names)}
    extra = [name for name in class_folders(root) if name not in index]
    if extra:
        raise ValueError(f"{root}: class folders {extra} do not exist in the training split")
    files: list[str] = []
    labels: list[int] = []
    skipped: Counter[str] = Counter()
    for name in class_names:
        folder = root / name
        if not folder.is_dir():
            continue  # a class may be absent from a val/ split
        others: Counter[str] = Counter()
        found = _image_files(str(folder), others)
        skipped.update(others)
        if not found and training:
            held = f" (it holds {_kinds(others)})" if others else ""
            raise ValueError(
                f"{folder}: class folder has no image files ({', '.join(IMAGE_EXTENSIONS)}){held}; a class "
                "without training images cannot be learnt: add its images or remove the folder"
            )
        if not found:
            log.warning("%s: class folder has no image files: that class is not tested", folder)
        files += found
        labels += [index[name]] * len(found)
    _warn_skipped(root, skipped)
    return FileList.of(files), labels
