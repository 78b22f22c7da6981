"""Tensor names, shapes and dtypes from a weight file's header, without reading its data.

A `.safetensors` file is an 8-byte little-endian header length, a JSON header and the data; an `.npz`
is a zip of `.npy` members, each with its own header.  Both are parsed here with every claim
bounded by the file (lengths, offsets, sizes), and returned as tensors on the meta device: shapes
to compare with the model before a byte of data is read.  Pickled objects are refused by dtype.
"""

from __future__ import annotations

import json
import lzma
import math
import os
import struct
import tokenize
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vitkit.checkpoints.validate import CheckpointError, short

MAX_HEADER = 100_000_000  # the safetensors library's own bound
MAX_DIMS, MAX_MEMBERS = 8, 100_000
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}  # fmt: skip
PICKLED = "holds pickled Python objects; refusing to load it (pickles can run code)"


def meta_tensor(shape: Any, dtype: torch.dtype, where: str) -> Tensor:
    """A meta tensor of `shape` (a list of non-negative integers whose size fits in memory arithmetic)."""
    if not (
        isinstance(shape, (list, tuple))
        and len(shape) <= MAX_DIMS
        and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape)
    ):
        raise CheckpointError(f"{where}: shape must be a list of at most {MAX_DIMS} sizes >= 0, got {short(shape)}")
    if math.prod(max(d, 1) for d in shape) > 1 << 56:
        raise CheckpointError(f"{where}: shape {list(shape)} is too large to describe a tensor")
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


# ---- safetensors ------------------------------------------------------------------------------------------


def looks_safetensors(path: str | Path) -> bool:
    """Whether the file begins as safetensors does: a little-endian header length within the file, then "{"."""
    try:
        with open(path, "rb") as handle:
            prefix = handle.read(9)
            size = os.fstat(handle.fileno()).st_size
    except OSError:
        return False
    return len(prefix) == 9 and prefix[8:] == b"{" and int.from_bytes(prefix[:8], "little") <= size - 8


def safetensors_header(path: str | Path) -> dict[str, Tensor]:
    """name -> meta tensor of a .safetensors file; the offsets must tile its data exactly."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise CheckpointError(f"{path}: {size} bytes, too short for a safetensors file (header length first)")
        length = int.from_bytes(prefix, "little")
        if length > size - 8:
            raise CheckpointError(
                f"{path}: the header claims {length} bytes, but the file has {size - 8} after "
                "its length (truncated, or not a safetensors file)"
            )
        if length > MAX_HEADER:
            raise CheckpointError(
                f"{path}: the header claims {length} bytes, more than the {MAX_HEADER} a safetensors header may have"
            )
        raw = handle.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, RecursionError, ValueError) as err:
        problem = f"{type(err).__name__}: {err}"[:200]
        raise CheckpointError(f"{path}: the safetensors header is not valid JSON ({problem})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the safetensors header must be a JSON object, got {type(header).__name__}")
    if not isinstance(header.pop("__metadata__", None) or {}, dict):
        raise CheckpointError(f"{path}: the safetensors __metadata__ must be an object")
    if len(header) > MAX_MEMBERS:  # each a meta tensor next: a 70 MB header of empty ones took 1.35 GB
        raise CheckpointError(f"{path}: {len(header):,} tensors, more than the {MAX_MEMBERS:,} of any weights")
    spans, tensors = [], {}
    for name, entry in header.items():
        tensors[name], span = _safetensors_entry(entry, f"{path}: tensor {short(name)}")
        spans.append((*span, name))
    _check_tiling(spans, size - 8 - length, path)
    return tensors


def _safetensors_entry(entry: Any, where: str) -> tuple[Tensor, tuple[int, int]]:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise CheckpointError(f"{where}: must be an object with dtype, shape and data_offsets")
    dtype = SAFETENSORS_DTYPES.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    if dtype is None:
        known = sorted(SAFETENSORS_DTYPES)
        raise CheckpointError(f"{where}: unknown dtype {short(entry['dtype'])}; expected one of {known}")
    tensor = meta_tensor(entry["shape"], dtype, where)
    offsets = entry["data_offsets"]
    integers = isinstance(offsets, list) and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    if not (integers and len(offsets) == 2 and 0 <= offsets[0] <= offsets[1]):
        raise CheckpointError(f"{where}: data_offsets must be [begin, end], 0 <= begin <= end, got {short(offsets)}")
    need = tensor.numel() * tensor.element_size()
    if offsets[1] - offsets[0] != need:
        raise CheckpointError(
            f"{where}: shape {list(tensor.shape)} of {entry['dtype']} needs {need} bytes, "
            f"its data_offsets span {offsets[1] - offsets[0]}"
        )
    return tensor, (offsets[0], offsets[1])


def _check_tiling(spans: list[tuple[int, int, str]], data_size: int, path: Path) -> None:
    # the safetensors format: tensors follow each other without gaps or overlaps and fill the data exactly
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            raise CheckpointError(
                f"{path}: tensor {short(name)} starts at byte {begin} of the data, expected {end} "
                "(overlapping or missing data)"
            )
        end = stop
    if end != data_size:
        raise CheckpointError(
            f"{path}: the header describes {end} bytes of data, the file holds {data_size} "
            "(truncated, or bytes appended)"
        )


# ---- npz --------------------------------------------------------------------------------------------------

# what zipfile and numpy's .npy header parser (a Python literal, tokenised) raise on damaged bytes
ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    NotImplementedError,
    RuntimeError,
    zlib.error,
    lzma.LZMAError,
    EOFError,
    OSError,
    ValueError,
    struct.error,
    tokenize.TokenError,
    SyntaxError,
)


def npz_header(path: str | Path) -> dict[str, Tensor]:
    """name -> meta tensor of an .npz (float32 for floats, as they are read; integers and booleans keep their
    kind, for the check that weights are floats); object arrays refused unread."""
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            if len(members) > MAX_MEMBERS:
                raise CheckpointError(f"{path}: {len(members)} members, more than the {MAX_MEMBERS} of any weights")
            return {info.filename.removesuffix(".npy"): _npy_header(archive, info, path) for info in members}
    except CheckpointError:
        raise
    except ZIP_ERRORS as err:
        problem = f"{type(err).__name__}: {err}"[:200]
        raise CheckpointError(
            f"{path}: cannot be read as an .npz archive ({problem}); the file is damaged or not an .npz"
        ) from None


def _npy_header(archive: zipfile.ZipFile, info: zipfile.ZipInfo, path: Path) -> Tensor:
    where = f"{path}: member {short(info.filename)}"
    if not info.filename.endswith(".npy"):
        raise CheckpointError(f"{where} is not a .npy array")
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        if version not in ((1, 0), (2, 0)):  # 3.0 exists only for non-latin-1 field names of structured arrays
            raise CheckpointError(f"{where}: unknown .npy format version {version}")
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(member)
        header_bytes = member.tell()
    if dtype.hasobject:
        raise CheckpointError(f"{path} {PICKLED} (member {short(info.filename)} is an object array)")
    if dtype.kind not in "biuf":
        raise CheckpointError(f"{where}: dtype {dtype.str} is not a number type")
    kind = {"f": torch.float32, "b": torch.bool}.get(dtype.kind, torch.int64)
    tensor = meta_tensor(list(shape), kind, where)
    need = tensor.numel() * dtype.itemsize
    if info.file_size != header_bytes + need:
        raise CheckpointError(
            f"{where}: shape {list(shape)} of {dtype.str} needs {need} bytes, "
            f"the member holds {info.file_size - header_bytes}"
        )
    return tensor
