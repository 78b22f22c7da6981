"""What the `eval`, `fewshot`, `predict` and `embed` verbs do, one function each: open the checkpoint
and the data, run the library call, write the outputs, return the numbers for printing."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vitkit.atomic import atomic_write_text
from vitkit.data.images import NoLabelsError
from vitkit.data.imageset import ImageSet
from vitkit.data.inmemory import drawn_sample
from vitkit.data.sources import check_named_split, data_name, load_split
from vitkit.eval.accuracy import AccuracyConfig, evaluate
from vitkit.eval.embed import output_paths, save_embeddings
from vitkit.eval.features import channels, compute, require_classifier, resolution
from vitkit.eval.fewshot import FewShotConfig, run_fewshot
from vitkit.eval.predict import PredictConfig, expand_inputs, predict_files
from vitkit.runs import RunDir, data_reading, find_checkpoint, is_run_dir, open_checkpoint

log = logging.getLogger(__name__)


def _load(path, uri: str, split: str, checkpoint, img_size: int | None, max_images: int | None = None, columns=None):
    """A split of `uri` as the checkpoint reads it (its resolution and channels; a run's own hf columns), with
    its labels where it has them: a masked-patch-prediction run read its own data without them, but probing or
    embedding its encoder needs them; a source without labels reads as that run read it."""
    reading = {**data_reading(path, uri), **(columns or {})}  # the flags' columns over the run's
    check_named_split(uri, split, reading)
    common = dict(image_size=resolution(checkpoint, img_size), channels=1 if channels(checkpoint) == 1 else 3)
    try:
        images = load_split(uri, split, **common, **{**reading, "labelled": True})
    except NoLabelsError:
        if reading.get("labelled", True):
            raise
        images = load_split(uri, split, **common, **reading)
    if max_images is not None and max_images < len(images):
        images = drawn_sample(images, max_images)
    if images.skipped:
        log.warning("%s %s: %d unreadable files skipped", uri, split, images.skipped)
    return images


def row_names(images, rows: int) -> list[str] | None:
    """What each of `rows` embedded rows was read from (a file, a shard key), where every row is known: a set
    decoded into memory (its unreadable images left out before), or a file set none of whose images was
    skipped.  None for arrays (row i is the source's row i) and streamed shards, with a warning where images
    were skipped from a file set."""
    if not isinstance(images, ImageSet) or (images.files is None and images.names is None):
        return None
    if rows != len(images):
        log.warning(
            "%d unreadable images were skipped while embedding, so rows are not named (the log names each: "
            "remove them to have every row named)",
            len(images) - rows,
        )
        return None
    return [images.name(i) for i in range(rows)]


def default_out(path: str | os.PathLike, name: str) -> Path | None:
    """RUN/<name> when `path` is a run directory, else None (write nothing)."""
    return Path(path) / name if is_run_dir(path) else None


def eval_command(
    path: str | os.PathLike,
    data: str,
    split: str,
    config: AccuracyConfig,
    out: str | os.PathLike | None,
    max_images: int | None = None,
    columns: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Accuracy of a checkpoint (or a run's final checkpoint) on a split; writes eval_SPLIT.json and
    confusion_SPLIT.png to `out` (RUN/eval by default, where another data set than the run's own is
    eval_DATA_SPLIT.json, so evaluating on it does not replace the run's own figures)."""
    from vitkit.eval.plots import plot_confusion

    checkpoint = open_checkpoint(path)
    require_classifier(checkpoint, path)
    images = _load(path, data, split, checkpoint, config.img_size, max_images, columns)
    result = evaluate(checkpoint, images, config)
    report = {"checkpoint": str(find_checkpoint(path)), "data": data, "split": split, **result.to_dict()}
    if images.origin:
        report["origin"] = images.origin  # e.g. the fixed hold-out of a folder without test/, which is not all of it
    stem, default = split, default_out(path, "eval")
    if out is None and default is not None and (RunDir(path).stored_config() or {}).get("data", {}).get("uri") != data:
        stem = f"{data_name(data)}_{split}"  # not the run's own data: beside its own figures, not over them
    out = Path(out) if out is not None else default
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / f"eval_{stem}.json", json.dumps(report, indent=1) + "\n")
        files = [f"eval_{stem}.json"]
        if result.confusion is not None:
            files.append(plot_confusion(result.confusion, result.class_names, out / f"confusion_{stem}.png").name)
        report["out"], report["files"] = str(out), files
    return report


def fewshot_command(
    path: str | os.PathLike,
    data: str,
    config: FewShotConfig,
    out: str | os.PathLike | None,
    columns: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Few-shot linear accuracy (Sec. 4.1) of a checkpoint's frozen representation on a data set."""
    checkpoint = open_checkpoint(path)
    train = _load(path, data, "train", checkpoint, config.img_size, columns=columns)
    test = _load(path, data, "test", checkpoint, config.img_size, columns=columns)
    result = run_fewshot(checkpoint, train, test, config)
    report = {"checkpoint": str(find_checkpoint(path)), "data": data, **result.to_dict()}
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        atomic_write_text(Path(out) / "fewshot.json", json.dumps(report, indent=1) + "\n")
        report["out"] = str(out)
    return report


def predict_command(path: str | os.PathLike, files: Sequence[str], config: PredictConfig) -> list[dict[str, Any]]:
    """Top-k classes of image files and folders (see `predict_files`); folders holding no image, and nothing
    else given, are a ValueError before the model is read."""
    inputs = expand_inputs(files, refuse_empty=True)
    checkpoint = open_checkpoint(path)
    require_classifier(checkpoint, path)
    return predict_files(checkpoint, inputs, config)


def embed_command(
    path: str | os.PathLike,
    data: str,
    split: str,
    layer: str,
    out: str | os.PathLike,
    *,
    img_size: int | None = None,
    batch_size: int = 64,
    device: str = "auto",
    columns: dict[str, str] | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Representations (`layer`) of every image of a split, saved as .npy or .safetensors with labels; files
    already there are replaced only with `force`."""
    taken = [str(p) for p in output_paths(out) if p.exists()]  # a bad suffix is refused before any work too
    if taken and not force:
        named = taken[0] if len(taken) == 1 else f"{', '.join(taken[:-1])} and {taken[-1]}"
        verb = "exists" if len(taken) == 1 else "exist"
        raise ValueError(f"{named} already {verb}; choose another --out or pass --force to replace")
    checkpoint = open_checkpoint(path)
    images = _load(path, data, split, checkpoint, img_size, columns=columns)
    embeddings, labels = compute(checkpoint, images, layer, img_size=img_size, batch_size=batch_size, device=device)
    meta = {
        "checkpoint": str(find_checkpoint(path)),
        "data": data,
        "split": split,
        "layer": layer,
        "img_size": resolution(checkpoint, img_size),
        "class_names": images.class_names,
    }
    names = row_names(images, len(embeddings))
    if names is not None:
        meta["names"] = names
    written = save_embeddings(out, embeddings, labels, meta)
    return {**meta, "shape": list(embeddings.shape), "files": [str(p) for p in written]}
