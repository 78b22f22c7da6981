"""Checkpoint formats: vitkit's own (native.py) and the official, timm and HF ones, converted on read.

`read(path)` probes the format (one probe per format), converts, then applies the surgery asked for
(Sec. 3.2): another resolution (position embeddings interpolated in 2D), a new zero-initialised head,
the pre-logits layer kept or dropped.  Nothing is ever unpickled beyond tensors.

Files are untrusted (validate.py): configs are checked field by field, the model's size against a
memory limit and the weights' header against the model on the meta device (limits.py, headers.py),
before anything is built or read; every problem with a file is a `CheckpointError` naming it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from torch import nn

from vitkit.checkpoints import hf, native, official, surgery, timm, validate
from vitkit.checkpoints.native import Checkpoint
from vitkit.checkpoints.validate import CheckpointError, read_json
from vitkit.models.configs import ModelConfig, image_size

__all__ = [
    *("Checkpoint", "CheckpointError", "FORMATS", "check", "checked", "detect_format"),
    *("load", "read", "save", "write"),
]

Format = Literal["vitkit", "official", "timm", "hf"]
FORMATS: tuple[str, ...] = ("vitkit", "official", "timm", "hf")


def detect_format(path: str | os.PathLike) -> Format:
    """Which format `path` holds: one probe per format, first match wins."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    if path.is_dir():
        if (path / native.CONFIG).is_file():
            read_json(path / native.CONFIG)  # a damaged config.json is named here, not after the probes below
        if native.is_native(path):
            return "vitkit"
        if hf.looks_hf(path):
            return "hf"
        if timm.looks_timm(path):
            return "timm"
        found = sorted(p.name for p in path.iterdir())[:8]
        raise CheckpointError(
            f"{path} is not a checkpoint directory vitkit knows: expected vitkit's config.json + model.safetensors, "
            "an HF ViT directory (config.json with model_type 'vit') or a timm one (config.json with 'architecture' "
            "or 'model_args', beside model.safetensors or pytorch_model.bin); "
            f"found {found}"
        )
    if official.looks_official(path):
        return "official"
    if path.parent != path and any(looks(path.parent) for looks in (native.is_native, hf.looks_hf, timm.looks_timm)):
        raise CheckpointError(  # its config (heads, numerics, classes) is beside it, not in it
            f"{path} is one file of the checkpoint directory {path.parent}: give the directory, whose config.json "
            "says how to build the model"
        )
    if timm.looks_timm(path):
        return "timm"
    raise CheckpointError(
        f"{path}: unknown checkpoint format (suffix {path.suffix!r}); expected a directory, an official .npz, "
        "or a timm state dict (.safetensors, .pth, .pt, .bin)"
    )


def check(path: str | os.PathLike) -> Format:
    """The format of the checkpoint at `path`, once the checks `read` makes of its files before it builds a model
    pass: a vitkit directory's config.json, the model's size, the weights' header and hash; an official .npz's
    header; a timm or HF weight file opened as `read` opens it (a safetensors header, a torch zip file
    memory-mapped, a legacy torch file read whole).  Raises what `read` raises (CheckpointError: damaged)."""
    return checked(path)[0]


def checked(path: str | os.PathLike) -> tuple[Format, ModelConfig]:
    """`check`, with the model the files hold: a vitkit directory's config.json, or what the weights' header of
    another format gives (its names and shapes, as `read` infers the model before reading any data)."""
    path = Path(path)
    validate.refuse_special_files(path)
    kind = detect_format(path)
    if kind == "vitkit":
        return kind, native.check(path)[0]
    reading = {"official": official.reading, "timm": timm.reading, "hf": hf.reading}[kind]
    return kind, reading(path).model_config()


def read(
    path: str | os.PathLike,
    *,
    img_size: int | None = None,
    num_classes: int | None = None,
    pre_logits: surgery.PreLogits | None = None,
    resample: str = "bilinear",
    config: ModelConfig | None = None,
    max_bytes: int | None = None,
) -> Checkpoint:
    """Read any supported checkpoint into a `Checkpoint` (model + class names + normalisation).

    Args:
        img_size: build the model for this resolution; learned position embeddings are interpolated
            in 2D over the patch grid, [class] row kept aside (`resample`: "bilinear" or "bicubic").
        num_classes: replace the head by a zero-initialised D x K layer (Sec. 3.2); the pre-logits layer
            goes too unless `pre_logits="keep"`.
        pre_logits: "keep" or "drop" the representation layer (default: keep unless a new head is asked for).
        config: the model config of a foreign file (otherwise inferred from the tensor shapes).
        max_bytes: the largest model (float32 weights, in bytes) to build; default the memory available now.
            A larger one is refused before anything is allocated.

    Raises:
        CheckpointError: the file is damaged, inconsistent, or asks for a model above `max_bytes`.
    """
    if pre_logits not in (None, "keep", "drop"):
        raise ValueError(f"pre_logits must be 'keep' or 'drop', got {pre_logits!r}")
    if resample not in ("bilinear", "bicubic"):
        raise ValueError(f"resample must be 'bilinear' or 'bicubic', got {resample!r}")
    validate.refuse_special_files(Path(path))
    kind = detect_format(path)
    if kind == "vitkit":
        if config is not None:
            raise ValueError("a vitkit checkpoint records its own config; config= applies to foreign formats only")
        checkpoint = native.load(path, max_bytes=max_bytes)
    else:
        reader = {"official": official.to_vitkit, "timm": timm.to_vitkit, "hf": hf.to_vitkit}[kind]
        checkpoint = reader(path, config, max_bytes=max_bytes)
    checkpoint.provenance.setdefault("format", kind)
    if img_size is not None and img_size != image_size(checkpoint.config):
        checkpoint.provenance["resampled_from"] = image_size(checkpoint.config)
        checkpoint.model = surgery.change_resolution(checkpoint.model, img_size, resample)
    if num_classes is not None or pre_logits == "drop":
        checkpoint.model = surgery.replace_head(checkpoint.model, num_classes, pre_logits)
        if num_classes is not None:
            checkpoint.class_names = None
            checkpoint.provenance["new_head"] = num_classes
    return checkpoint


def load(path: str | os.PathLike, **options: object) -> nn.Module:
    """The model stored at `path`, in any supported format (options as `read`)."""
    return read(path, **options).model  # type: ignore[arg-type]


def save(model: nn.Module | Checkpoint, directory: str | os.PathLike, **meta: object) -> os.PathLike:
    """Write vitkit's own format: `directory/model.safetensors` + `directory/config.json`."""
    return native.save(model, directory, **meta)  # type: ignore[arg-type]


def write(checkpoint: Checkpoint, destination: str | os.PathLike, to: str = "vitkit") -> Path:
    """Write `checkpoint` in format `to`: vitkit / timm / hf (directories) or official (an .npz file)."""
    writers = {"vitkit": native.save, "timm": timm.write, "hf": hf.write, "official": official.write}
    if to not in writers:
        raise ValueError(f"unknown target format {to!r}; choose one of {sorted(writers)}")
    return Path(writers[to](checkpoint, destination))
