"""How large a model a checkpoint may ask for: its size is computed on the meta device (shapes, no
memory) and refused above a limit before anything real is built.

The default limit is the memory available now (MemAvailable, or a container's own limit): a model
larger than that cannot be built here at all.  It is a guard against absurd sizes, not a promise:
reading holds the file's tensors and the model at once.  `max_bytes=` on `vitkit.load` /
`vitkit.checkpoints.read` (the CLI's `--max-model-gb`) sets another.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from vitkit.checkpoints.validate import CheckpointError
from vitkit.host import available_memory
from vitkit.models import build_model
from vitkit.models.configs import ModelConfig

HOW_TO_RAISE = (
    "pass max_bytes= to vitkit.load / vitkit.checkpoints.read, or --max-model-gb to vitkit convert / export-onnx"
)


class _NoRandomInit(TorchFunctionMode):
    """Skips random initialisers on meta tensors, which hold no values: torch's meta `normal_` runs
    through its Python reference kernels and imports the compiler (~2 s) for nothing."""

    SKIPPED = frozenset({Tensor.normal_, Tensor.uniform_, nn.init.normal_, nn.init.uniform_, nn.init.trunc_normal_})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")
        if func in self.SKIPPED and isinstance(target, Tensor) and target.is_meta:
            return target
        return func(*args, **kwargs)


def meta_model(config: ModelConfig) -> nn.Module:
    """The model `config` describes, on the meta device: every shape, no memory."""
    with torch.device("meta"), _NoRandomInit():
        return build_model(config)


def model_bytes(config: ModelConfig) -> int:
    """Bytes of the model's parameters and buffers (float32)."""
    return sum(t.numel() * t.element_size() for t in meta_model(config).state_dict().values())


def resolve(max_bytes: int | None) -> tuple[int, str]:
    """The limit in bytes and where it comes from."""
    if max_bytes is None:
        return available_memory(), "the memory available now"
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, float)) or not max_bytes >= 0:  # NaN too
        raise ValueError(f"max_bytes must be a number of bytes >= 0 (inf: no limit), got {max_bytes!r}")
    if math.isinf(max_bytes):
        return sys.maxsize, "no limit"
    return int(max_bytes), "the limit given"


def size_words(count: int) -> str:
    """A byte count in the unit that keeps its digits: 1.2 GB, 21.9 MB, 100 bytes."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def check_model(config: ModelConfig, source: str, max_bytes: int | None) -> dict[str, Tensor]:
    """The model's state dict on the meta device, once its size is known to be within the limit."""
    state = meta_model(config).state_dict()
    need = sum(t.numel() * t.element_size() for t in state.values())
    limit, why = resolve(max_bytes)
    if need > limit:
        raise CheckpointError(
            f"{source}: the model needs {size_words(need)} ({need} bytes of float32 weights), above the limit "
            f"of {size_words(limit)} ({why}); if this machine can hold it, {HOW_TO_RAISE}"
        )
    return state


def check_file(path: Path, max_bytes: int | None) -> None:
    """A file read whole into memory (a legacy torch pickle) is refused above the limit."""
    size = path.stat().st_size
    limit, why = resolve(max_bytes)
    if size > limit:
        raise CheckpointError(
            f"{path}: {size_words(size)} would be read into memory, above the limit of {size_words(limit)} ({why}); "
            f"if this machine can hold it, {HOW_TO_RAISE}"
        )
