"""timm `vit_*` state dicts (huggingface/pytorch-image-models, `timm/models/vision_transformer.py`).

vitkit's attribute names were chosen close to timm's, so KEY_MAP is almost the identity; what differs
is numerics (timm: exact erf GELU, LayerNorm eps 1e-6) and a few variants handled by named quirks.
Files: `.safetensors`, or `.pth` / `.bin` / `.pt` read with `torch.load(weights_only=True)`, or a
timm hub directory (`config.json` with "architecture" + `model.safetensors`).  A `pre_logits.fc`
layer is read and written under timm 0.x's name (timm >= 0.9 has none and drops it).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
from pathlib import Path
from typing import Any, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from vitkit.checkpoints import keymap
from vitkit.atomic import atomic_write, atomic_write_text
from vitkit.checkpoints.native import Checkpoint, build_checkpoint
from vitkit.models.configs import VIT_SIZES, ViTConfig

log = logging.getLogger(__name__)

BLOCK = "blocks.{i}."
KEY_MAP: dict[str, tuple[str, str]] = {  # timm key -> (vitkit key, layout)
    "patch_embed.proj.weight": ("patch_embed.proj.weight", "copy"),
    "patch_embed.proj.bias": ("patch_embed.proj.bias", "copy"),
    "cls_token": ("cls_token", "copy"),
    "pos_embed": ("pos_embed", "copy"),
    **{
        BLOCK + f"{module}.{kind}": (BLOCK + f"{module}.{kind}", "copy")
        for module in ("norm1", "attn.qkv", "attn.proj", "norm2", "mlp.fc1", "mlp.fc2")
        for kind in ("weight", "bias")
    },
    "norm.weight": ("norm.weight", "copy"),
    "norm.bias": ("norm.bias", "copy"),
    "pre_logits.fc.weight": ("pre_logits.fc.weight", "copy"),  # timm 0.x representation layer
    "pre_logits.fc.bias": ("pre_logits.fc.bias", "copy"),
    "head.weight": ("head.weight", "copy"),
    "head.bias": ("head.bias", "copy"),
}
WEIGHTS, CONFIG = "model.safetensors", "config.json"
UNSUPPORTED = {  # key fragment -> the timm feature it belongs to
    "fc_norm.": "fc_norm (LayerNorm after average pooling; vitkit's 'gap' normalises before pooling)",
    "reg_token": "register tokens",
    "dist_token": "a distillation token (DeiT)",
    ".ls1.": "layer scale",
    ".q_norm.": "q/k normalisation",
    "norm_pre.": "a pre-encoder LayerNorm (CLIP)",
    "attn_pool.": "attention pooling (MAP head)",
    "patch_embed.backbone.": "a ResNet hybrid backbone (timm's StdConv eps differs; convert the official .npz instead)",
}


# ---- quirks -----------------------------------------------------------------------------------------------


def unwrap(obj: Any) -> dict[str, Tensor]:
    # training scripts wrap the state dict: {"state_dict": ...}, {"model": ...}, {"state_dict_ema": ...}
    for key in ("state_dict_ema", "model_ema", "state_dict", "model"):
        if isinstance(obj, Mapping) and isinstance(obj.get(key), Mapping):
            obj = obj[key]
            break
    if not isinstance(obj, Mapping) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise ValueError("the file does not hold a flat state dict of tensors")
    return {k.removeprefix("module."): v for k, v in obj.items()}  # DDP's "module." prefix


def reject_unsupported(state: Mapping[str, Tensor], source: str) -> None:
    # timm variants whose computation vitkit does not implement: refuse rather than guess
    for fragment, what in UNSUPPORTED.items():
        hits = [k for k in state if fragment in k]
        if hits:
            raise ValueError(f"{source}: tensors {hits[:3]} belong to {what}, which vitkit does not implement")


def add_class_posemb_row(state: dict[str, Tensor]) -> dict[str, Tensor]:
    # timm no_embed_class=True: E_pos has no [class] row (added before the concat); a zero row is exact
    posemb = state.get("pos_embed")
    if "cls_token" in state and posemb is not None:
        rows = posemb.shape[1]
        if int(rows**0.5) ** 2 == rows:
            state = {**state, "pos_embed": torch.cat([posemb.new_zeros(1, 1, posemb.shape[2]), posemb], dim=1)}
    return state


# ---- config -----------------------------------------------------------------------------------------------


def guess_num_heads(hidden: int) -> int:
    """Heads are not in a fused-qkv state dict: Table 1 sizes, else head_dim 64."""
    for size, heads in ((v[0], v[3]) for v in VIT_SIZES.values()):
        if size == hidden:
            return heads
    if hidden % 64:
        raise ValueError(f"cannot infer num_heads for hidden size {hidden}: pass a config")
    log.warning("num_heads not recorded; assuming head_dim 64 (%d heads)", hidden // 64)
    return hidden // 64


def infer_config(state: Mapping[str, Tensor], args: Mapping[str, Any] | None = None) -> ViTConfig:
    """Config from tensor shapes, with timm's `model_args` (config.json) where given; timm numerics."""
    args = dict(args or {})
    if "patch_embed.proj.weight" not in state or "blocks.0.attn.qkv.weight" not in state:
        raise ValueError("not a timm ViT state dict: no patch_embed.proj.weight / blocks.0.attn.qkv.weight")
    hidden, in_chans, patch, _ = state["patch_embed.proj.weight"].shape
    depth = keymap.count_indices(state, r"^blocks\.(\d+)\.")
    pool = "token" if "cls_token" in state else "gap"
    tokens = state["pos_embed"].shape[1] - (pool == "token")
    grid = int(round(tokens**0.5))
    if grid * grid != tokens:
        raise ValueError(f"pos_embed has {tokens} patch rows, not a square grid")
    return ViTConfig(
        img_size=grid * patch, patch_size=patch, in_chans=in_chans, hidden_size=hidden, depth=depth,
        num_heads=int(args.get("num_heads") or guess_num_heads(hidden)),
        mlp_dim=state["blocks.0.mlp.fc1.weight"].shape[0], pool=pool,
        representation_size=state["pre_logits.fc.weight"].shape[0] if "pre_logits.fc.weight" in state else None,
        num_classes=state["head.weight"].shape[0] if "head.weight" in state else 0,
        qkv_bias="blocks.0.attn.qkv.bias" in state,
        gelu="exact", layer_norm_eps=1e-6,  # timm: nn.GELU() (erf) and partial(nn.LayerNorm, eps=1e-6)
    )  # fmt: skip


# ---- reading and writing ----------------------------------------------------------------------------------


def read_state(path: Path) -> dict[str, Tensor]:
    """Tensors of a .safetensors file, or of a torch pickle through the weights-only unpickler."""
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path))
        except (SafetensorError, OSError) as err:
            raise ValueError(f"cannot read {path}: {err}") from None
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"refusing to load {path}: it holds pickled Python objects other than tensors, and unpickling "
            f"them could run code (weights_only=True refused: {first})"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        raise ValueError(f"cannot read {path} as a torch checkpoint: {err}") from None
    try:
        return unwrap(obj)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def to_vitkit(path: str | os.PathLike, config: ViTConfig | None = None) -> Checkpoint:
    """Read a timm ViT state dict (file or hub directory)."""
    path = Path(path)
    meta: dict[str, Any] = {}
    if path.is_dir():
        meta = json.loads((path / CONFIG).read_text())
        path = path / WEIGHTS
    state = unwrap(read_state(path))
    reject_unsupported(state, str(path))
    state = add_class_posemb_row(state)
    config = config or infer_config(state, meta.get("model_args"))
    table = keymap.restrict(keymap.expand(KEY_MAP, config.depth), config)
    state = keymap.convert(state, table, config.num_heads, str(path))
    pretrained = meta.get("pretrained_cfg", {})
    extra: dict[str, Any] = {"provenance": {"source": str(path), "format": "timm"}}
    if "mean" in pretrained and "std" in pretrained:
        extra.update(mean=tuple(pretrained["mean"]), std=tuple(pretrained["std"]))
    if meta.get("label_names"):
        extra["class_names"] = list(meta["label_names"])
    return build_checkpoint(config, state, str(path), **extra)


def from_vitkit(checkpoint: Checkpoint) -> dict[str, Tensor]:
    """timm state dict of a vitkit ViT."""
    config = checkpoint.model.config
    if not isinstance(config, ViTConfig):
        raise ValueError(f"timm export covers plain ViT models, not {type(config).__name__}")
    if config.posemb != "learned_1d" or config.posemb_where != "input":
        raise ValueError(f"timm's ViT has learned 1D position embeddings at the input, not {config.posemb}/{config.posemb_where}")
    if config.gelu != "exact":
        log.warning("timm's ViT uses exact GELU; this model uses %s GELU (logits will differ by ~1e-3 in timm)", config.gelu)
    table = keymap.restrict(keymap.expand(KEY_MAP, config.depth), config)
    state = {k: v.detach().cpu().contiguous() for k, v in checkpoint.model.state_dict().items()}
    return keymap.convert_back(state, table, config.num_heads)


def model_args(config: ViTConfig) -> dict[str, Any]:
    """timm VisionTransformer keyword arguments for `config`."""
    return {
        "img_size": config.img_size, "patch_size": config.patch_size, "in_chans": config.in_chans,
        "num_classes": config.num_classes, "embed_dim": config.hidden_size, "depth": config.depth,
        "num_heads": config.num_heads, "mlp_ratio": config.mlp_dim / config.hidden_size,
        "qkv_bias": config.qkv_bias, "class_token": config.pool == "token",
        "global_pool": "token" if config.pool == "token" else "avg", "fc_norm": False,
    }  # fmt: skip


def write(checkpoint: Checkpoint, directory: str | os.PathLike) -> Path:
    """A timm hub-style directory: model.safetensors + config.json (architecture, model_args, pretrained_cfg)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = from_vitkit(checkpoint)
    atomic_write(directory / WEIGHTS, lambda tmp: save_file(state, str(tmp), metadata={"format": "pt"}))
    config = checkpoint.model.config
    meta = {
        "architecture": "vit_base_patch16_224",  # every field is overridden by model_args
        "num_classes": config.num_classes,
        "num_features": config.hidden_size,
        "model_args": model_args(config),
        "pretrained_cfg": {
            "input_size": [config.in_chans, config.img_size, config.img_size],
            "mean": list(checkpoint.mean), "std": list(checkpoint.std), "interpolation": "bicubic",
            "crop_pct": 1.0, "num_classes": config.num_classes,
        },  # fmt: skip
    }
    if checkpoint.class_names:
        meta["label_names"] = list(checkpoint.class_names)
    atomic_write_text(directory / CONFIG, json.dumps(meta, indent=2) + "\n")
    return directory


def looks_timm(path: Path) -> bool:
    if path.is_dir():
        try:
            return "architecture" in json.loads((path / CONFIG).read_text()) and (path / WEIGHTS).is_file()
        except (OSError, ValueError):
            return False
    return path.suffix in (".safetensors", ".pth", ".pt", ".bin")

