"""Key tables with layer slots, shared by the foreign formats (official.py, timm.py, hf.py).

A table maps a foreign key pattern to a vitkit key pattern and the name of a tensor layout change.
Slots are `{i}` (encoder block, 0-based), `{s}` / `{u}` (hybrid stage / unit, 0-based) and `{s1}` /
`{u1}` (the same, 1-based, as the official code names `block1/unit1`).  `expand` writes a table out
for one model's sizes; the reverse direction is the same table inverted, never a second table.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

import torch
from torch import Tensor

from vitkit.checkpoints.limits import meta_model
from vitkit.checkpoints.validate import CheckpointError

# foreign pattern -> (vitkit pattern, layout); the layout names a pair in LAYOUTS.
KeyTable = Mapping[str, tuple[str, str]]
Layout = tuple[Callable[[Tensor, int], Tensor], Callable[[Tensor, int], Tensor]]

# (to vitkit, from vitkit); the int argument is the number of heads k, used by the attention layouts.
LAYOUTS: dict[str, Layout] = {
    "copy": (lambda t, k: t, lambda t, k: t),
    # Flax Dense kernel (in, out) <-> torch Linear weight (out, in)
    "dense": (lambda t, k: t.T, lambda t, k: t.T),
    # Flax Conv kernel HWIO <-> torch OIHW
    "conv": (lambda t, k: t.permute(3, 2, 0, 1), lambda t, k: t.permute(2, 3, 1, 0)),
    # Flax MultiHeadDotProductAttention query/key/value kernel (D, k, D_h) <-> Linear weight (k·D_h, D)
    "heads_in": (lambda t, k: t.reshape(t.shape[0], -1).T, lambda t, k: t.T.reshape(t.shape[1], k, -1)),
    # its bias (k, D_h) <-> (k·D_h,)
    "heads_bias": (lambda t, k: t.reshape(-1), lambda t, k: t.reshape(k, -1)),
    # its out kernel (k, D_h, D) <-> Linear weight (D, k·D_h)
    "heads_out": (lambda t, k: t.reshape(-1, t.shape[-1]).T, lambda t, k: t.T.reshape(k, -1, t.shape[0])),
    # old Flax linen stored GroupNorm scale/bias unsqueezed, (1, 1, 1, C) (Flax GitHub #1721)
    "squeeze": (lambda t, k: t.reshape(-1), lambda t, k: t),
}
LAYOUT_DIMS = {"dense": 2, "conv": 4, "heads_in": 3, "heads_bias": 2, "heads_out": 3}  # a foreign tensor's rank


def expand(table: KeyTable, depth: int, units: Iterable[int] = ()) -> dict[str, tuple[str, str]]:
    """Write `table` out for `depth` encoder blocks and hybrid stages of `units` units each.

    Returns foreign key -> (vitkit key, layout).  Patterns without slots appear once; a pattern whose
    slots do not apply (hybrid keys for a plain ViT) does not appear.
    """
    out: dict[str, tuple[str, str]] = {}
    units = tuple(units)
    for foreign, (ours, layout) in table.items():
        slots = set(re.findall(r"{(\w+)}", foreign + ours))
        if not slots:
            out[foreign] = (ours, layout)
        elif slots <= {"i"}:
            for i in range(depth):
                out[foreign.format(i=i)] = (ours.format(i=i), layout)
        else:
            for s, count in enumerate(units):
                for u in range(count):
                    names = {"s": s, "u": u, "s1": s + 1, "u1": u + 1}
                    out[foreign.format(**names)] = (ours.format(**names), layout)
    return out


def restrict(table: dict[str, tuple[str, str]], config: object) -> dict[str, tuple[str, str]]:
    """Keep the entries whose vitkit tensor exists in the model `config` builds (no head, no [class], ...).

    Split q/k/v names count as present when the fused `attn.qkv` tensor is.
    """
    names = set(meta_model(config).state_dict())  # built on the meta device: shapes only, no memory
    fused = re.compile(r"\.attn\.[qkv]\.")
    return {k: v for k, v in table.items() if fused.sub(".attn.qkv.", v[0]) in names}


def convert(
    tensors: Mapping[str, Tensor], table: Mapping[str, tuple[str, str]], num_heads: int, source: str
) -> dict[str, Tensor]:
    """Rename and re-lay `tensors` (foreign keys) with an expanded table; names every missing or unknown key."""
    missing = sorted(k for k in table if k not in tensors)
    unknown = sorted(k for k in tensors if k not in table)
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing tensors {_few(missing)}")
        if unknown:
            parts.append(f"unexpected tensors {_few(unknown)}")
        raise CheckpointError(f"{source}: " + "; ".join(parts))
    return {
        ours: _relayout(torch.as_tensor(tensors[foreign]), layout, num_heads, f"{source}: tensor {foreign}")
        for foreign, (ours, layout) in table.items()
    }


def _relayout(tensor: Tensor, layout: str, num_heads: int, where: str) -> Tensor:
    # the rank is checked first; a reshape that still fails (sizes that do not divide) is the file's shape
    rank = LAYOUT_DIMS.get(layout, tensor.dim())
    if tensor.dim() != rank:
        raise CheckpointError(f"{where} has shape {tuple(tensor.shape)}; its layout ({layout}) has {rank} dimensions")
    try:
        return LAYOUTS[layout][0](tensor, num_heads).contiguous()
    except RuntimeError as err:
        raise CheckpointError(
            f"{where} has shape {tuple(tensor.shape)}, which its layout ({layout}) cannot take: "
            f"{str(err).splitlines()[0]}"
        ) from None


def convert_back(
    state: Mapping[str, Tensor], table: Mapping[str, tuple[str, str]], num_heads: int
) -> dict[str, Tensor]:
    """Inverse of `convert`: vitkit tensors -> foreign keys, with the inverse layouts."""
    inverse = {ours: (foreign, layout) for foreign, (ours, layout) in table.items()}
    missing = sorted(k for k in inverse if k not in state)
    if missing:
        raise ValueError(f"model has no tensors {_few(missing)} required by the target layout")
    unknown = sorted(k for k in state if k not in inverse)
    if unknown:
        raise ValueError(f"the target layout has no place for tensors {_few(unknown)}")
    return {
        foreign: LAYOUTS[layout][1](state[ours], num_heads).contiguous() for ours, (foreign, layout) in inverse.items()
    }


def count_indices(keys: Iterable[str], pattern: str) -> int:
    """1 + the largest integer captured by `pattern` (a regex with one group) among `keys`; 0 if none.

    An index of more than 9 digits counts as 10**9 (a file's key names are untrusted; the config's range check
    then refuses it).
    """
    regex = re.compile(pattern)
    found = [int(m.group(1)) if len(m.group(1)) <= 9 else 10**9 for k in keys if (m := regex.match(k))]
    return max(found) + 1 if found else 0


def shape_of(tensors: Mapping[str, Tensor], key: str, rank: int, source: str) -> tuple[int, ...]:
    """The shape of `tensors[key]`, which must exist and have `rank` dimensions (config inference reads these)."""
    if key not in tensors:
        raise CheckpointError(f"{source}: tensor {key} is missing")
    shape = tuple(tensors[key].shape)
    if len(shape) != rank:
        raise CheckpointError(f"{source}: tensor {key} has shape {shape}, expected {rank} dimensions")
    return shape


def _few(keys: list[str], limit: int = 8) -> str:
    return f"{keys[:limit]}{f' ... ({len(keys)} in all)' if len(keys) > limit else ''}"
