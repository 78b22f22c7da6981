"""A foreign weight file (`.safetensors`, or a torch pickle `.pth` / `.bin` / `.pt`) as a header and its data.

The header is the file's tensor names and shapes on the meta device, read without the data: the
safetensors header, or a torch zip file loaded memory-mapped (its data stays on disk until copied
into the model).  A legacy (non-zip) torch file is read whole, so it is refused above the memory
limit first.  Pickles go through torch's weights-only unpickler and nothing else.
"""

from __future__ import annotations

import pickle
import struct
import warnings
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import Tensor

from vitkit.checkpoints import headers, limits
from vitkit.checkpoints.validate import CheckpointError, naming, short

Tensors = dict[str, Tensor]
# torch.load's zip reader and its weights-only unpickler raise these on damaged files: the unpickler is Python,
# and a damaged pickle's opcodes index an empty stack or an unknown memo slot, call a tensor rebuild with the
# wrong arguments or objects, or fail the unpickler's own asserts (persistent ids)
UNPICKLER_ERRORS = (
    RuntimeError,
    EOFError,
    OSError,
    ValueError,
    IndexError,
    KeyError,
    TypeError,
    AttributeError,
    AssertionError,
    OverflowError,
    struct.error,
)
# words of the advice around torch's weights-only error (load without it, allowlist the object, file an issue)
_ADVICE = ("weights_only", "Weights only", "trust", "safe_globals", "torch.load", "Please")


def unwrap(obj: Any) -> Tensors:
    """The flat state dict inside what training scripts save: {"state_dict": ...}, {"model": ...}, EMA ones."""
    for key in ("state_dict_ema", "model_ema", "state_dict", "model"):
        if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
            obj = obj[key]
            break
    if not isinstance(obj, Mapping) or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in obj.items()):
        raise ValueError("the file does not hold a flat state dict of tensors with string names")
    return {k.removeprefix("module."): v for k, v in obj.items()}  # DDP's "module." prefix


def open_tensors(path: Path, max_bytes: int | None) -> tuple[Tensors, Callable[[], Tensors]]:
    """(name -> meta tensor, a function returning the tensors with their data).  The file's first bytes say
    which kind it is, whatever its suffix (a safetensors file named .pt is read as safetensors)."""
    if path.suffix == ".safetensors" or headers.looks_safetensors(path):
        with naming(str(path)):
            header = unwrap(headers.safetensors_header(path))
        return header, lambda: read_safetensors(path)
    state = read_torch(path, max_bytes)
    return {k: torch.empty(v.shape, dtype=v.dtype, device="meta") for k, v in state.items()}, lambda: state


def read_safetensors(path: Path) -> Tensors:
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError) as err:
        raise CheckpointError(f"cannot read {path}: {err}") from None
    with naming(str(path)):
        return unwrap(state)


def read_torch(path: Path, max_bytes: int | None) -> Tensors:
    """Tensors of a torch pickle through the weights-only unpickler (a zip file memory-mapped)."""
    mapped = is_stored_zip(path)
    if not mapped:
        limits.check_file(path, max_bytes)
    try:
        with warnings.catch_warnings():  # the refusal below says it in one line; torch's warning added two
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mapped)
    except pickle.UnpicklingError as err:
        stop = unpickler_stop(err)
        raise CheckpointError(
            f"refusing to load {path}: it is not a checkpoint vitkit can read safely (not safetensors, not .npz, "
            "not a torch file of tensors only): it is damaged or holds pickled Python objects, and unpickling those "
            "could run code" + (f" (the weights-only unpickler stopped at: {stop})" if stop else "")
        ) from None
    except UNPICKLER_ERRORS as err:
        raise CheckpointError(
            f"cannot read {path} as a torch checkpoint ({type(err).__name__}: "
            f"{str(err).strip()[:300]}); the file is damaged or not a torch checkpoint"
        ) from None
    with naming(str(path)):
        state = unwrap(obj)
    odd = [k for k, v in state.items() if v.layout != torch.strided or v.is_meta or v.is_quantized]
    if odd:
        raise CheckpointError(
            f"{path}: tensors {short(odd)} are sparse, quantised or hold no data; expected dense weights"
        )
    return state


def unpickler_stop(err: pickle.UnpicklingError) -> str:
    """What torch's weights-only unpickler stopped at ("Unsupported operand 3"), or "" when it does not say.

    torch's message around it advises weights_only=False or an allowlist, which would unpickle an untrusted
    file's objects, so only a line of the unpickler's own finding is kept, cut before any advice.
    """
    for line in str(err).splitlines():
        finding = line.partition("WeightsUnpickler error:")[2] or line
        finding = finding.split(" was not an allowed global")[0].split(". Please")[0].strip().rstrip(".")
        if finding and not any(word in finding for word in _ADVICE):
            return finding[:200]
    return ""


def is_stored_zip(path: Path) -> bool:
    """Whether `path` is a zip file (torch.save's container), refusing one with compressed records: torch.save
    stores them uncompressed, and torch.load would inflate a compressed one whole, whatever its size claims
    (a 2 MB file took 2.4 GB).  A stored record's size is checked by torch against its tensor's."""
    if not zipfile.is_zipfile(path):
        return False
    try:
        with zipfile.ZipFile(path) as archive:
            packed = [i.filename for i in archive.infolist() if i.compress_type != zipfile.ZIP_STORED]
    except headers.ZIP_ERRORS as err:
        problem = f"{type(err).__name__}: {err}"[:200]
        raise CheckpointError(f"cannot read {path} as a torch checkpoint (a damaged zip: {problem})") from None
    if packed:
        raise CheckpointError(f"{path}: records {short(packed)} are compressed; torch.save writes them uncompressed")
    return True
