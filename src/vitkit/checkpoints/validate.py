"""What a checkpoint file says is untrusted until checked: JSON read with bounds, fields checked by type
and range, tensor names and shapes compared with the model before any data is read.

Every problem is a `CheckpointError` (a ValueError) whose message starts with the file's path and
names the field or tensor at fault.  Readers convert the known failure types of parsing into it at
the format boundary; anything else is a bug and keeps its own traceback.
"""

from __future__ import annotations

import errno
import json
import math
import numbers
import os
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch import Tensor

from vitkit.models.configs import ConfigError, ModelConfig, config_from_dict

MAX_JSON_BYTES = 64 << 20  # a config.json with 21k class names is ~0.5 MB


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as it is; the message names the file and the problem."""


# Read errors of a file that is most likely intact (permissions, a failing disk, a network file system): errno
# numbers; a name a platform lacks (ENOMEDIUM on macOS) is left out
NOT_NOW = frozenset(
    getattr(errno, name)
    for name in "EACCES EPERM EIO ESTALE ETIMEDOUT EAGAIN EBUSY ENXIO ENODEV ENOTCONN EHOSTDOWN ENOLINK".split()
    + ["ENOMEDIUM"]
    if hasattr(errno, name)
)


def unreadable_now(path: Path, error: OSError, pointer: Path, before: Path | None = None) -> ValueError:
    """The error that stops a resume at a step checkpoint that cannot be read for now (NOT_NOW: permissions, a
    storage error), where stepping back would train its steps again; `pointer` is the run's LATEST."""
    cure = (
        "give this user read access to it and resume"
        if isinstance(error, PermissionError)
        else "a storage error, not damage: resume once the storage reads it"
    )
    other = (
        f"write {before.name} into {pointer} to resume from the step before"
        if before is not None
        else f"remove {pointer} to start the run over"
    )
    return ValueError(f"{path} cannot be read ({error.strerror or error}): {cure}; or {other}")


def refuse_special_files(path: Path) -> None:
    """A checkpoint file, and each entry of a checkpoint directory, must be a regular file (or a directory):
    a link to /dev/zero passed the size limit (a device's size is 0) and filled memory; a FIFO hung the read."""
    entries = [path]
    if path.is_dir():
        try:
            entries = sorted(path.iterdir())
        except OSError:
            return  # the reader names what it cannot read
    for entry in entries:
        try:
            mode = entry.stat().st_mode
        except OSError:
            continue  # missing, or a dangling link: the reader names it
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise CheckpointError(f"{entry}: not a regular file (a device, FIFO or socket is no checkpoint)")


def read_json(path: str | os.PathLike) -> dict[str, Any]:
    """The JSON object in `path`, read with a size bound; every way it can be damaged is a CheckpointError."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_JSON_BYTES + 1)
    except OSError as err:
        if err.errno in NOT_NOW:  # not damage: the caller decides (a resume stops rather than step back)
            raise
        raise CheckpointError(f"{path}: cannot be read ({err.strerror or err})") from None
    if len(raw) > MAX_JSON_BYTES:
        raise CheckpointError(f"{path}: larger than {MAX_JSON_BYTES >> 20} MiB, too large for a config file")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise CheckpointError(f"{path}: is not UTF-8 text ({err.reason} at byte {err.start})") from None
    except RecursionError:
        raise CheckpointError(f"{path}: its JSON is nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, and int() of a number with more than 4300 digits
        raise CheckpointError(f"{path}: is not valid JSON ({err})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: must hold a JSON object, got {type(data).__name__}")
    return data


def model_config(data: Any, where: str) -> ModelConfig:
    """`config_from_dict(data)` (vitkit's config.json "model"), its errors naming `where` and `model.<field>`."""
    try:
        return config_from_dict(data)
    except ConfigError as err:
        raise CheckpointError(f"{where}: model.{err.field} {err.problem}") from None
    except ValueError as err:  # relations between fields (divisibility, grids), unknown fields
        raise CheckpointError(f"{where}: model: {err}") from None


@contextmanager
def naming(source: str, field_names: Mapping[str, str] | None = None) -> Iterator[None]:
    """Problems a converter finds in a file's content (its ValueErrors) re-raised as CheckpointErrors naming
    `source`; a config field is named as the file names it (`field_names`: vitkit field -> the file's), else
    as inferred from the tensor shapes."""
    try:
        yield
    except CheckpointError:
        raise
    except ConfigError as err:
        foreign = (field_names or {}).get(err.field)
        field = f"{foreign} (vitkit's {err.field})" if foreign else f"{err.field} (inferred from the tensor shapes)"
        raise CheckpointError(f"{source}: {field} {err.problem}") from None
    except ValueError as err:
        raise CheckpointError(f"{source}: {err}") from None


def numbers_list(value: Any, where: str, counts: tuple[int, ...], *, positive: bool = False) -> tuple[float, ...]:
    """A list of finite numbers of one of `counts` lengths (> 0 when `positive`), as a tuple of floats."""
    good = (
        isinstance(value, (list, tuple))
        and len(value) in counts
        and all(
            isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and (v > 0 or not positive)
            for v in value
        )
    )
    if not good:
        lengths = " or ".join(str(c) for c in counts)
        kind = f"finite numbers{' > 0' if positive else ''}"
        raise CheckpointError(f"{where} must be a list of {lengths} {kind}, got {short(value)}")
    return tuple(float(v) for v in value)


def strings_list(value: Any, where: str, count: int | None) -> list[str] | None:
    """None, or a list of `count` strings (any number when `count` is None)."""
    if value is None:
        return None
    if not (isinstance(value, list) and count in (None, len(value)) and all(isinstance(v, str) for v in value)):
        what = "strings" if count is None else f"{count} strings (one per class)"
        raise CheckpointError(f"{where} must be null or a list of {what}, got {short(value)}")
    return list(value)


def mapping(value: Any, where: str) -> dict[str, Any]:
    """An object (None reads as empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise CheckpointError(f"{where} must be an object, got {short(value)}")
    return value


def short(value: Any, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters: a file's values go into messages, and may be megabytes long."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_fits(expected: Mapping[str, Tensor], state: Mapping[str, Tensor], source: str) -> None:
    """`state` has exactly the names and shapes of `expected` (a model's state dict, on the meta device or not),
    and floating-point numbers wherever the model has them: integer, boolean or complex weights are damage."""
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    shapes = [f"{k}: file {tuple(state[k].shape)} vs model {tuple(v.shape)}"
              for k, v in expected.items() if k in state and state[k].shape != v.shape]  # fmt: skip
    kinds = [f"{k}: file {str(state[k].dtype).removeprefix('torch.')} vs model {str(v.dtype).removeprefix('torch.')}"
             for k, v in expected.items()
             if k in state and v.is_floating_point() and not state[k].is_floating_point()]  # fmt: skip
    if missing or unexpected or shapes or kinds:
        parts = []
        if missing:
            parts.append(f"missing {missing[:10]}{' ...' if len(missing) > 10 else ''}")
        if unexpected:
            parts.append(f"unexpected {unexpected[:10]}{' ...' if len(unexpected) > 10 else ''}")
        if shapes:
            parts.append(f"shape mismatch {shapes[:10]}")
        if kinds:
            parts.append(f"not floating-point numbers {kinds[:10]}")
        raise CheckpointError(f"{source} does not fit the model: " + "; ".join(parts))


def check_finite(state: Mapping[str, Tensor], source: str) -> None:
    """Every floating-point tensor of `state` holds finite numbers: a NaN weight makes every output NaN."""
    floats = ((k, t.float() if t.element_size() == 1 else t) for k, t in state.items() if t.is_floating_point())
    bad = [(k, int((~t.isfinite()).sum())) for k, t in floats if not t.isfinite().all()]  # fp8 has no isfinite
    if bad:
        named = ", ".join(f"{k} ({count:,})" for k, count in bad[:5]) + (" ..." if len(bad) > 5 else "")
        raise CheckpointError(
            f"{source} holds NaN or infinite weights in {len(bad)} tensor(s): {named}; the checkpoint is damaged "
            "(a run's earlier checkpoint, or the original file, may be whole)"
        )
