"""`vitkit shard`: any source vitkit reads, written as webdataset tar shards plus `dataset.json`.

    vitkit shard folder:/data/photos --out /data/photos-wds --samples-per-shard 1000 [--max-side 384]

Each split the source holds (train; val where it has its own; test) becomes {split}-000000.tar,
{split}-000001.tar, ... of `samples_per_shard` samples (the last one fewer).  A sample is KEY.<ext>
(the image) and KEY.cls (the class index as text; none with `labelled=False`, for a source without
labels), KEY being the sample's index in the source split (9 digits), so every shard can be traced
back.  Samples are written in a fixed random order (by `seed`): a stream reads a few shards at a time
and shuffles within a window, so each shard must hold a mix of classes already (a class-sorted folder
would otherwise train class by class).

Files keep their original bytes (no re-encoding loss) unless `max_side` asks for a smaller longer
side: those are downscaled (aspect kept) and re-encoded, JPEG at quality 95 for JPEG sources, else
PNG.  Arrays (MNIST, CIFAR, npz, digits) are encoded as PNG, losslessly unless `max_side` asks for
them smaller; arrays whose images hold more pixels than the readers accept are refused before anything
is written.  A file whose header does not open is left out and counted.  The output is deterministic
(tar headers carry no time or owner); each shard is written under a temporary name and renamed, and
dataset.json is written last.
"""

from __future__ import annotations

import io
import json
import logging
import os
import secrets
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from vitkit.atomic import atomic_write_text, lock_directory, remove_torn, removed_if_left_empty, unlock_directory
from vitkit.data import stream
from vitkit.data.images import (
    MAX_PIXELS,
    NoLabelsError,
    decode_workers,
    probe_images,
)
from vitkit.data.imageset import ImageSet
from vitkit.data.shard_records import encode, records
from vitkit.data.sources import load_split, mirror_keeps_label, parse_uri
from vitkit.data.tarsamples import check_class_names
from vitkit.data.tarshards import INCOMPLETE, INDEX, INDEX_FORMAT

log = logging.getLogger(__name__)

# where a Hugging Face image column holds paths (datasets' to_parquet of files), they resolve as datasets does
PATHS_HINT = ": an image column of file paths is read from the current directory; run where they resolve"


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = len(data), 0, 0o644, 0, 0, "", ""
    tar.addfile(info, io.BytesIO(data))


class _Shards:
    """Writes one split's shards one sample at a time: each under a temporary name, fsynced, then renamed."""

    def __init__(self, out: Path, split: str, per_shard: int, labelled: bool = True):
        self.out, self.split, self.per_shard, self.labelled = out, split, per_shard, labelled
        self.written: list[dict[str, Any]] = []
        self.first: list[bytes] = []  # a few stored images, for the index's typical size
        self._handle: Any = None
        self._tar: tarfile.TarFile | None = None
        self._tmp: Path | None = None
        self._count = 0
        self.skipped = 0  # source images left out (header does not open, unreadable)

    def add(self, index: int, data: bytes, ext: str, label: int) -> None:
        if self._tar is None:
            # named as every temporary vitkit writes (atomic.TORN_NAME), so remove_torn finds one a kill left
            self._tmp = self.out / f".{self.split}-{len(self.written):06d}.tar.{secrets.token_hex(6)}.tmp"
            self._handle = open(self._tmp, "xb")
            self._tar = tarfile.open(fileobj=self._handle, mode="w", format=tarfile.USTAR_FORMAT)
        _add(self._tar, f"{index:09d}.{ext}", data)
        if self.labelled:
            _add(self._tar, f"{index:09d}.cls", str(label).encode())
        self._count += 1
        if len(self.first) < 16:
            self.first.append(data)
        if self._count == self.per_shard:
            self.close()

    def _temporary(self) -> Path:
        assert self._tmp is not None, "no shard is open"
        return self._tmp

    def close(self) -> None:
        if self._tar is None:
            return
        self._tar.close()
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()
        name = f"{self.split}-{len(self.written):06d}.tar"
        os.replace(self._temporary(), self.out / name)
        self.written.append({"shard": name, "count": self._count})
        self._tar, self._count = None, 0


def _write_split(
    data: ImageSet | stream.ShardSet,
    split: str,
    out: Path,
    per_shard: int,
    max_side: int | None,
    seed: int,
    workers: int,
    labelled: bool = True,
) -> _Shards:
    shards, skipped = _Shards(out, split, per_shard, labelled), 0
    items = records(data, seed)
    with ThreadPoolExecutor(workers) as pool:  # Pillow releases the GIL while it decodes and encodes
        while batch := [item for _, item in zip(range(256), items)]:
            for encoded in pool.map(lambda item: encode(item, max_side), batch):
                if encoded is None:
                    skipped += 1
                else:
                    shards.add(*encoded)
    shards.close()
    shards.skipped += skipped
    log.info(
        "%s: %d samples in %d shards%s",
        split,
        sum(s["count"] for s in shards.written),
        len(shards.written),
        f", {skipped} left out" if skipped else "",
    )
    return shards


def _source_splits(uri: str, reading: dict[str, Any]) -> list[str]:
    """The splits `uri` holds as its own (not "test" standing in for "val", nor a held-out part), as `reading`
    (load_split's columns and `labelled`) reads it."""
    kind, path = parse_uri(uri)
    if kind == "folder":  # test: DIR/test, else DIR/val (written as val), else the fixed hold-out of the files
        root = Path(path) / "train" if (Path(path) / "train").is_dir() else None
        val, test = (
            root is not None and (root.parent / "val").is_dir(),
            root is not None and (root.parent / "test").is_dir(),
        )
        return ["train", *(["val"] if val else []), *(["test"] if test or not val else [])]
    if kind in ("wds", "hf"):
        from vitkit.data.large import split_names

        names = split_names(kind, path, reading)
        if not {"val", "test"} & set(names):  # no held-out split of its own: its fixed hold-out is written as test
            return ["train", "test"]
        return [s for s in ("train", "val", "test") if s in names]
    return ["train", "test"]


def _open_splits(uri: str, image_column: str, label_column: str, labelled: bool) -> dict[str, Any]:
    """Every split of `uri` opened (nothing decoded) before anything is written; a split without labels beside
    a labelled train split is named."""
    sources: dict[str, Any] = {}
    reading = {"image_column": image_column, "label_column": label_column, "labelled": labelled}
    for split in _source_splits(uri, reading):
        try:
            sources[split] = load_split(
                uri,
                split,
                max_in_memory_bytes=0,
                image_column=image_column,
                label_column=label_column,
                labelled=labelled,
            )
        except NoLabelsError as error:
            if not sources:  # the training split: the source has no labels
                raise
            raise ValueError(f"{error} (the train split has labels; give the {split} split its labels too)") from None
    return sources


def _check_array_pixels(split: str, data: ImageSet | stream.ShardSet, max_side: int | None) -> None:
    """Arrays whose images, as written, hold more pixels than the readers accept are refused (a file's own
    header is judged as it is read)."""
    if not isinstance(data, ImageSet) or data.images is None:
        return
    height, width = data.images.shape[-2:]
    scale = 1.0 if max_side is None else min(1.0, max_side / max(height, width))
    written = (max(1, round(height * scale)), max(1, round(width * scale)))
    if written[0] * written[1] > MAX_PIXELS:
        raise ValueError(
            f"the {split} images would be written {written[0]}x{written[1]} ({written[0] * written[1]:,} pixels), "
            f"more than the readers accept (limit {MAX_PIXELS:,}); give {'a smaller ' if max_side else ''}--max-side "
            "to write them smaller"
        )


def _start_over(out: Path) -> None:
    """Remove what a `vitkit shard` killed in `out` wrote, so that the same command writes it again."""
    log.info("%s: removed the %d shard(s) an interrupted run wrote; writing them again", out, _remove_written(out))


def _remove_written(out: Path) -> int:
    """Remove what a `vitkit shard` wrote in `out` (every shard there is its: it began in an empty directory):
    its shards, index, temporaries and mark; returns the number of shards."""
    written = sorted(out.glob("*.tar"))
    for path in [*written, out / INDEX]:
        path.unlink(missing_ok=True)
    remove_torn(out)
    (out / INCOMPLETE).unlink(missing_ok=True)
    return len(written)


def write_shards(
    uri: str,
    out: str | Path,
    samples_per_shard: int,
    *,
    max_side: int | None = None,
    seed: int = 0,
    workers: int | None = None,
    image_column: str = "",
    label_column: str = "",
    labelled: bool = True,
) -> dict[str, Any]:
    """Write every split of `uri` as tar shards in `out` plus dataset.json; returns what was written.

    `labelled=False` writes the images alone (no .cls members, no classes in dataset.json): a source without
    labels (a folder of photos) for masked patch prediction, which reads it as `wds:OUT`.
    """
    if samples_per_shard < 1 or (max_side is not None and max_side < 1):
        raise ValueError(f"samples_per_shard and max_side must be >= 1, got {samples_per_shard} and {max_side}")
    if label_column and not labelled:
        raise ValueError(f"a label column ({label_column!r}) names labels, which writing without labels leaves out")
    out = Path(out)
    interrupted = (out / INCOMPLETE).exists()  # a run killed there, or one writing it now (which holds the lock)
    held = _lock(out) if interrupted else None
    try:
        if interrupted:
            _start_over(out)
        _check_empty(out)
        sources = _open_splits(uri, image_column, label_column, labelled)
        for split, data in sources.items():  # what the reader would refuse is refused before anything is written
            if labelled and data.class_names:
                check_class_names(list(data.class_names), uri, "class")
            _check_array_pixels(split, data, max_side)
        with removed_if_left_empty(out):
            out.mkdir(parents=True, exist_ok=True)
            held = held if held is not None else _lock(out)
            try:
                return _write_all(sources, uri, out, samples_per_shard, max_side, seed, workers, labelled)
            except (Exception, KeyboardInterrupt, SystemExit):  # a full disk, Ctrl-C: nothing half-written stays
                if (out / INCOMPLETE).exists():  # not once the set is complete (its mark removed)
                    _remove_written(out)
                raise
    finally:
        unlock_directory(held)


def _check_empty(out: Path) -> None:
    """`out` is new or empty (hidden files aside): shards and their index are written into nothing of the user's."""
    visible = sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) if out.is_dir() else []
    if any(out.glob("*.tar")) or (out / INDEX).exists():
        raise ValueError(f"{out} already holds shards or {INDEX}; choose an empty directory")
    if visible:
        listed = ", ".join(visible[:3]) + (", ..." if len(visible) > 3 else "")
        raise ValueError(f"{out} is not empty (it holds {listed}); shard into an empty or new directory")


def _lock(out: Path) -> int | None:
    """The lock a shard run holds on `out` while it writes there; a ValueError where another holds it."""
    try:
        return lock_directory(out)
    except BlockingIOError:
        raise ValueError(f"{out} is in use by another vitkit shard, writing there now; wait for it to end") from None


def _write_all(
    sources: dict[str, Any],
    uri: str,
    out: Path,
    samples_per_shard: int,
    max_side: int | None,
    seed: int,
    workers: int | None,
    labelled: bool,
) -> dict[str, Any]:
    """Every split's shards, then dataset.json, between the INCOMPLETE mark's writing and its removal."""
    atomic_write_text(out / INCOMPLETE, "vitkit shard is writing this directory; a re-run starts it over\n")
    workers = workers or decode_workers()
    splits, classes, probe = {}, None, []
    first = sources.get("train") or next(iter(sources.values()))  # what a model is built for: the training split
    channels = first.images.shape[1] if first.images is not None else first.channels
    for split, data in sources.items():
        classes = classes or (data.class_names if labelled else None)
        splits[split] = _write_split(data, split, out, samples_per_shard, max_side, seed, workers, labelled)
        probe = probe or splits[split].first
        if split == "train" and not splits[split].written:  # every image unreadable: no data set to train on
            raise ValueError(f"{uri}: no training image could be read ({splits[split].skipped} left out, each named "
                             f"above){PATHS_HINT if uri.startswith('hf:') else ''}; nothing was written")  # fmt: skip
    index = {
        "format": INDEX_FORMAT,
        "source": uri,
        "classes": classes,  # null for images without labels
        "mirror_keeps_label": mirror_keeps_label(uri),  # the source's flip rule (None: it cannot tell)
        "channels": int(channels),
        "image_size": probe_images(probe)[0],
        "samples_per_shard": samples_per_shard,
        "max_side": max_side,
        "seed": seed,
        "splits": {s: w.written for s, w in splits.items()},
        "skipped": {s: w.skipped for s, w in splits.items()},
    }
    atomic_write_text(out / INDEX, json.dumps(index, indent=1) + "\n")
    (out / INCOMPLETE).unlink()
    return {
        "out": str(out),
        "num_classes": len(classes) if classes else 0,
        "splits": {
            s: {"shards": len(w.written), "samples": sum(e["count"] for e in w.written), "skipped": w.skipped}
            for s, w in splits.items()
        },
    }
