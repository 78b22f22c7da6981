"""`ImageSet` (one split: images in memory, or files/rows decoded on demand), `SourceInfo` (what a
source holds, found cheaply) and the rule for which sets are decoded into memory up front."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from vitkit.data.images import decode_image

MAX_FILES_IN_MEMORY = 100_000  # above this many images a set is never decoded up front (start-up time)
UNLABELLED = "unlabelled"  # the one class of a source read without labels (masked patch prediction)
NO_LABELS_HINT = "vitkit pretrain-mpp reads images without labels"  # the end of a labelled reading's refusal
VAL_HINT = (
    "a training run holds one out of its training split with data.val_fraction > 0 and evaluates on it as it "
    "trains; to score a model, use the test split (--split test)"
)


class EmptySplitError(ValueError):
    """A split with no usable sample: the message says how many were skipped and why, naming the files."""


def fits_in_memory(count: int, channels: int, size: int, max_in_memory_bytes: int) -> bool:
    """Whether `count` images decoded to (channels, size, size) are kept in memory rather than read on demand.

    Decoding up front costs start-up time in proportion to the count (about 1 s per 10,000 JPEGs per
    core), so beyond MAX_FILES_IN_MEMORY images training starts at once and workers decode instead.
    """
    return count * channels * size * size <= max_in_memory_bytes and count <= MAX_FILES_IN_MEMORY


@dataclass
class ImageSet:
    """Images and labels of one split.  Either `images` (in memory) or `files` (decoded on demand) is set."""

    images: torch.Tensor | None  # uint8 (N, C, H, W), all the same size, when the set lives in memory
    labels: torch.Tensor  # int64 (N,)
    class_names: list[str]
    files: Sequence[Any] | None = None  # instead of `images`: FileList of paths, hf.ArrowImages, or a list
    load_size: int | None = None  # side length files are decoded/resized to (file-based sets)
    skipped: int = 0  # corrupt/unreadable files skipped while building the set
    channels: int = 3  # decode mode of `files`: 3 = RGB, 1 = L
    origin: str = ""  # where this split came from (a directory, an official split, a hold-out), for the plan
    names: Sequence[str] | None = None  # what each row of an in-memory set was decoded from (a file, a shard key)

    def __post_init__(self) -> None:
        if (self.images is None) == (self.files is None):
            raise ValueError("ImageSet needs exactly one of `images` or `files`")
        count = len(self.images) if self.images is not None else len(self.files)
        if count != len(self.labels):
            raise ValueError(f"ImageSet has {count} images but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def access(self) -> str:
        """How training reads the set: "memory" (one tensor) or "files" (decoded by DataLoader workers)."""
        return "memory" if self.images is not None else "files"

    def subset(self, index: torch.Tensor) -> ImageSet:
        """The samples at `index` (int64 positions), in that order."""
        index = torch.as_tensor(index, dtype=torch.int64)
        if self.images is not None:
            names = None if self.names is None else [self.names[i] for i in index.tolist()]
            return replace(self, images=self.images[index], labels=self.labels[index], names=names)
        files = self.files.take(index) if hasattr(self.files, "take") else [self.files[i] for i in index.tolist()]
        return replace(self, files=files, labels=self.labels[index])

    def fixed_sample(self, count: int, seed: int = 0) -> ImageSet:
        """`count` samples drawn by `seed` (all of them where there are no more), kept in their order here: the
        same subset every time, for a bounded evaluation or figure."""
        if count >= len(self):
            return self
        drawn = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))[:count]
        return self.subset(drawn.sort().values)

    def read(self, i: int) -> torch.Tensor:
        """Sample `i` as uint8 (C, H, W); for file sets this decodes (raises `BadImageError` if corrupt)."""
        if self.images is not None:
            return self.images[i]
        return decode_image(self.files[i], self.channels, size=self.load_size, name=self.name(i))

    def name(self, i: int) -> str:
        """What sample `i` is, for messages: its file (or shard key), or its row."""
        if self.files is None:
            return self.names[i] if self.names is not None else f"row {i}"
        return self.files.name(i) if hasattr(self.files, "name") else str(self.files[i])


@dataclass(frozen=True)
class SourceInfo:
    """What a source holds, found cheaply (headers and directory listings, not pixels)."""

    uri: str  # the URI as given
    num_train: int  # images in the training split (before any val hold-out)
    num_classes: int  # K
    image_size: int  # typical side length in pixels (median shorter side of ~32 headers for folders)
    channels: int  # C of the stored images (1 for digits / MNIST-style, 3 otherwise)
    in_memory: bool  # whether load_split keeps it in memory (at DEFAULT_FOLDER_SIZE for folders)
    access: str = "memory"  # how training would read it at that size: "memory", "files" or "stream" (ImageSet.access)
