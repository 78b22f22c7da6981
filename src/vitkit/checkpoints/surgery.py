"""Checkpoint surgery (Sec. 3.2): new resolution, new head, pre-logits kept or dropped; fused q/k/v.

The tensor functions are pure; `change_resolution` and `replace_head` apply them to a model.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
from torch import Tensor, nn

from vitkit.checkpoints import limits
from vitkit.models import build_model
from vitkit.models import posemb as pe
from vitkit.models.configs import ResNetConfig, image_size, replace_vit, with_overrides

log = logging.getLogger(__name__)

PreLogits = Literal["keep", "drop"]


def cat(parts: list[Tensor], dim: int = 0) -> Tensor:
    """`torch.cat`; on the meta device (checks of a file's header) the shape alone, as torch's meta `cat`
    imports its compiler (~2 s) on first use, and the dtype of a part that holds no floats where one does (so
    that the check that weights are floats sees an integer k between float q and v)."""
    if not all(p.is_meta for p in parts):
        return torch.cat(parts, dim)
    shapes = [list(p.shape) for p in parts]
    if len({len(s) for s in shapes}) != 1 or len({tuple(s[:dim] + s[dim + 1 :]) for s in shapes}) != 1:
        raise ValueError(f"cannot concatenate shapes {[tuple(s) for s in shapes]} along dimension {dim}")
    dtype = next((p.dtype for p in parts if not p.dtype.is_floating_point), parts[0].dtype)
    return parts[0].new_empty([*shapes[0][:dim], sum(s[dim] for s in shapes), *shapes[0][dim + 1 :]], dtype=dtype)


def fuse_qkv(state: dict[str, Tensor], depth: int) -> dict[str, Tensor]:
    """`blocks.{i}.attn.{q,k,v}.{weight,bias}` -> `blocks.{i}.attn.qkv.*` (rows q, then k, then v)."""
    out = dict(state)
    for i in range(depth):
        for kind in ("weight", "bias"):
            parts = [out.pop(f"blocks.{i}.attn.{n}.{kind}", None) for n in "qkv"]
            if all(p is not None for p in parts):
                if len({p.shape for p in parts}) != 1 or parts[0].dim() == 0:
                    shapes = [tuple(p.shape) for p in parts]
                    raise ValueError(f"block {i}: q, k and v {kind}s differ in shape: {shapes}")
                out[f"blocks.{i}.attn.qkv.{kind}"] = cat(parts, dim=0)  # 3 x (D, ...) -> (3·D, ...)
            elif any(p is not None for p in parts):
                raise ValueError(f"block {i}: q, k and v {kind}s must all be present or all absent")
    return out


def split_qkv(state: dict[str, Tensor], depth: int) -> dict[str, Tensor]:
    """Inverse of `fuse_qkv`."""
    out = dict(state)
    for i in range(depth):
        for kind in ("weight", "bias"):
            fused = out.pop(f"blocks.{i}.attn.qkv.{kind}", None)
            if fused is not None:
                for name, part in zip("qkv", fused.chunk(3, dim=0)):  # (3·D, ...) -> 3 x (D, ...)
                    out[f"blocks.{i}.attn.{name}.{kind}"] = part
    return out


def resize_pos_embed(
    posemb: Tensor,
    new_grid: tuple[int, int],
    old_grid: tuple[int, int],
    num_prefix_tokens: int,
    method: str = "bilinear",
) -> Tensor:
    """Learned 1D position embeddings (S, prefix + gh·gw, D) interpolated in 2D, [class] rows kept aside."""
    return pe.resample_pos_embed(posemb, new_grid, old_grid, num_prefix_tokens, method)  # type: ignore[arg-type]


def resize_rel_pos(table: Tensor, num_tokens: int) -> Tensor:
    """Relative-attention table (2T0 - 1, D_h) resampled linearly to 2T - 1 offsets (App. D.4)."""
    return pe.resample_1d(table[None], 2 * num_tokens - 1)[0]


def change_resolution(model: nn.Module, img_size: int, method: str = "bilinear") -> nn.Module:
    """A copy of `model` built for `img_size`, its position embeddings resampled (Sec. 3.2).  A resolution
    whose one image would take absurd work is refused (limits.check_work) before anything is built."""
    config = model.config
    if image_size(config) == img_size:
        return model
    resized = with_overrides(config, img_size=img_size)
    limits.check_work(resized, f"the model at {img_size} px", "choose a smaller resolution")
    new = build_model(resized)
    if isinstance(config, ResNetConfig):  # a CNN has no position embeddings: only the recorded size changes
        new.load_state_dict(model.state_dict())
        return new
    state = model.state_dict()
    old_grid, new_grid, prefix = model.grid_size, new.grid_size, model.num_prefix_tokens
    if "pos_embed" in state:
        state["pos_embed"] = resize_pos_embed(state["pos_embed"], new_grid, old_grid, prefix, method)
    for axis, key in ((1, "pos_embed_x"), (0, "pos_embed_y")):  # learned 2D tables: one axis each
        if key in state:
            state[key] = pe.resample_1d(state[key], new_grid[axis])
    tokens = prefix + new_grid[0] * new_grid[1]
    for key in [k for k in state if k.endswith("attn.rel_pos")]:
        state[key] = resize_rel_pos(state[key], tokens)
    new.load_state_dict(state)
    log.info("resampled position embeddings from grid %s to %s (%s)", old_grid, new_grid, method)
    return new


def replace_head(model: nn.Module, num_classes: int, pre_logits: PreLogits | None = None) -> nn.Module:
    """Sec. 3.2: a zero-initialised D x K head; the pre-logits layer goes too unless pre_logits="keep".

    Without a new head (num_classes None), "drop" removes the pre-logits layer only from a head-less
    model: a trained head reads the pre-logits features, so dropping them under it would be silently wrong.
    """
    has_pre_logits = not isinstance(getattr(model, "pre_logits", nn.Identity()), nn.Identity)
    if num_classes is None:
        if pre_logits == "drop" and has_pre_logits:
            if not isinstance(model.head, nn.Identity):
                raise ValueError(
                    "pre_logits='drop' would leave the trained head reading features it was not trained on: "
                    "give num_classes=K for a new head (or num_classes=0 for features only)"
                )
            model.reset_head(0)
        return model
    if num_classes < 0:
        raise ValueError(f"num_classes must be >= 0, got {num_classes}")
    if pre_logits == "keep" and has_pre_logits:  # keep the representation layer, new K-way layer on top
        reference = next(model.pre_logits.parameters())  # the new head lives on the model's device, in its dtype
        model.head = (
            nn.Linear(model.num_features, num_classes, device=reference.device, dtype=reference.dtype)
            if num_classes
            else nn.Identity()
        )
        if num_classes:
            nn.init.zeros_(model.head.weight)
            nn.init.zeros_(model.head.bias)
        model.config = replace_vit(model.config, num_classes=num_classes)  # encoder_config follows
        return model
    model.reset_head(num_classes)
    return model
