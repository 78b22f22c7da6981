"""timm `vit_*` state dicts (huggingface/pytorch-image-models, `timm/models/vision_transformer.py`).

vitkit's attribute names were chosen close to timm's, so KEY_MAP is almost the identity; what differs
is numerics (timm: exact erf GELU unless `model_args.act_layer` or the architecture's timm default names the
tanh one, LayerNorm eps 1e-6) and a few variants handled by named quirks.
Files: `.safetensors`, or `.pth` / `.bin` / `.pt` read with `torch.load(weights_only=True)`, or a
timm hub directory (`config.json` with "architecture" + `model.safetensors`), all read through
tensorfile.py: the config is inferred from the header's shapes and checked before any data is read.  A `pre_logits.fc`
layer is read and written under timm 0.x's name (timm >= 0.9 has none and drops it).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from torch import Tensor

from vitkit.atomic import atomic_write, atomic_write_text
from vitkit.checkpoints import keymap, surgery
from vitkit.checkpoints.native import Checkpoint, Reading
from vitkit.checkpoints.tensorfile import open_tensors
from vitkit.checkpoints.validate import CheckpointError, mapping, naming, numbers_list, read_json, short, strings_list
from vitkit.models.configs import MAX_WIDTH, VIT_SIZES, ViTConfig, check_int

log = logging.getLogger(__name__)

ACTIVATIONS = {"gelu": "exact", "gelu_tanh": "tanh"}  # timm's `act_layer` names -> vitkit's `gelu`
# timm architectures built with the tanh GELU by default (timm 1.0's registry: the SigLIP 2-era GAP ViTs), whose
# hub config.json therefore does not name it; every other ViT architecture defaults to the exact GELU.
TANH_GELU_ARCHITECTURES = frozenset(
    f"vit_{name}_siglip_gap_{size}"
    for name, size in (
        ("base_patch32", 256), ("large_patch16", 512), ("so400m_patch16", 256), ("so400m_patch16", 384),
        ("so400m_patch16", 512), ("giantopt_patch16", 256), ("giantopt_patch16", 384),
    )
)  # fmt: skip
# timm architectures whose head count is neither Table 1's nor width / 64 (timm 1.0's registry): a hub config.json
# names the architecture, and its model_args leave out what the architecture fixes.  By the name's size word and
# the width, and whole names where one size word has two counts at one width.
TIMM_SIZE_HEADS = {("so400m", 1152): 16, ("giant", 1408): 16, ("gigantic", 1664): 16, ("giantopt", 1536): 16}
TIMM_NAMED_HEADS = {"vit_base_patch16_gap_224": 16}
TIMM_LAYER_NORM_EPS = 1e-6  # timm's ViT LayerNorm; `model_args` has no field for another eps

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
WEIGHTS, TORCH_WEIGHTS, CONFIG = "model.safetensors", "pytorch_model.bin", "config.json"  # a hub directory's files
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


def reject_unsupported(state: Mapping[str, Tensor], source: str) -> None:
    # timm variants whose computation vitkit does not implement: refuse rather than guess
    for fragment, what in UNSUPPORTED.items():
        hits = [k for k in state if fragment in k]
        if hits:
            raise CheckpointError(f"{source}: tensors {hits[:3]} belong to {what}, which vitkit does not implement")
    if "head.bias" in state and "head.weight" not in state:  # read as head-less, it was "unexpected head.bias"
        raise CheckpointError(f"{source}: head.bias without head.weight; the file is damaged or cut short")


def check_pooling(global_pool: Any, class_token: bool, where: str) -> None:
    """timm's `global_pool` (model_args, or a config.json's top level) where vitkit computes it: token pooling, or
    GAP without a class token."""
    if global_pool is None or global_pool == "token" or (global_pool == "avg" and not class_token):
        return
    what = "with a class token (vitkit's GAP has none)" if global_pool == "avg" else "(vitkit pools by token or GAP)"
    raise CheckpointError(
        f"{where}: global_pool {global_pool!r} {what} is a pooling vitkit does not compute; its logits would be wrong"
    )


def grid_tokens(img_size: Any, state: Mapping[str, Tensor], where: str) -> int | None:
    """Patch rows of E_pos for timm's `model_args.img_size` (an int or [H, W]), or None where it says none."""
    if img_size is None or "patch_embed.proj.weight" not in state:
        return None
    sides = list(img_size) if isinstance(img_size, (list, tuple)) else [img_size, img_size]
    if len(sides) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sides):
        raise CheckpointError(f"{where}: model_args.img_size must be a positive int or [H, W], got {img_size!r}")
    if sides[0] != sides[1]:
        raise CheckpointError(f"{where}: model_args.img_size {sides} is not square; vitkit's ViT is built square")
    kernel = state["patch_embed.proj.weight"].shape
    if len(kernel) != 4 or min(kernel) < 1 or kernel[-1] != kernel[-2]:
        raise CheckpointError(
            f"{where}: patch_embed.proj.weight has shape {tuple(kernel)}; expected (D, C, P, P), P >= 1"
        )
    return (sides[0] // kernel[-1]) ** 2


def add_class_posemb_row(state: dict[str, Tensor], tokens: int | None = None) -> dict[str, Tensor]:
    """timm no_embed_class=True: E_pos has no [class] row (added before the concat); a zero row is exact.  Told
    as `tokens` (the patch rows model_args gives), else taken from a square number of rows."""
    posemb = state.get("pos_embed")
    if "cls_token" in state and posemb is not None and posemb.dim() == 3:
        rows = posemb.shape[1]
        without_class_row = rows == tokens if tokens is not None else math.isqrt(rows) ** 2 == rows
        if without_class_row:
            row = posemb.new_zeros(posemb.shape[0], 1, posemb.shape[2])
            state = {**state, "pos_embed": surgery.cat([row, posemb], dim=1)}
    return state


# ---- config -----------------------------------------------------------------------------------------------


def architecture_heads(architecture: Any, hidden: int) -> int | None:
    """The head count timm's `architecture` (a hub config.json's name, maybe with a ".tag") fixes at width `hidden`
    where Table 1 and width / 64 would give another; None where they give timm's or the name is not known."""
    if not isinstance(architecture, str):
        return None
    name = architecture.split(".", 1)[0]
    word = re.match(r"vit_([a-z0-9]+?)_", name)
    return TIMM_NAMED_HEADS.get(name) or (TIMM_SIZE_HEADS.get((word.group(1), hidden)) if word else None)


def guess_num_heads(hidden: int, source: str) -> int:
    """Heads are not in a fused-qkv state dict: Table 1 sizes, else head_dim 64, said in a warning."""
    table = next((v[3] for v in VIT_SIZES.values() if v[0] == hidden), None)
    if table is None and (hidden % 64 or not 0 < hidden <= MAX_WIDTH):
        raise ValueError(
            f"cannot infer num_heads for hidden size {hidden}: put the file in a directory as {WEIGHTS} (or "
            f'{TORCH_WEIGHTS}) beside a {CONFIG} holding {{"model_args": {{"num_heads": H}}}}, and give the directory'
        )
    heads = table or hidden // 64
    log.warning(
        "%s: num_heads is not recorded; assuming %d (%s for width %d). A model with another head count gives "
        "wrong logits: put the file in a directory, beside a config.json holding model_args.num_heads, and give "
        "the directory",
        source, heads, "Table 1's" if table else "head_dim 64", hidden,
    )  # fmt: skip
    return heads


def infer_config(
    state: Mapping[str, Tensor], num_heads: int | None, source: str, gelu: str = "exact", architecture: Any = None
) -> ViTConfig:
    """Config from tensor shapes, with timm's `model_args` (config.json: num_heads, act_layer) where given, and
    the head count its `architecture` fixes where they do not say it."""
    if "patch_embed.proj.weight" not in state or "blocks.0.attn.qkv.weight" not in state:
        raise CheckpointError(
            f"{source}: not a timm ViT state dict: no patch_embed.proj.weight / blocks.0.attn.qkv.weight"
        )
    hidden, in_chans, patch, _ = keymap.shape_of(state, "patch_embed.proj.weight", 4, source)
    depth = keymap.count_indices(state, r"^blocks\.(\d+)\.")
    pool = "token" if "cls_token" in state else "gap"
    tokens = keymap.shape_of(state, "pos_embed", 3, source)[1] - (pool == "token")
    grid = math.isqrt(max(tokens, 0))
    if tokens < 1 or grid * grid != tokens:
        raise CheckpointError(f"{source}: pos_embed has {tokens} patch rows, not a square grid")
    head = keymap.shape_of(state, "head.weight", 2, source)[0] if "head.weight" in state else 0
    rep = keymap.shape_of(state, "pre_logits.fc.weight", 2, source)[0] if "pre_logits.fc.weight" in state else None
    with naming(source):
        return ViTConfig(
            img_size=grid * patch, patch_size=patch, in_chans=in_chans, hidden_size=hidden, depth=depth,
            num_heads=num_heads or architecture_heads(architecture, hidden) or guess_num_heads(hidden, source),
            mlp_dim=keymap.shape_of(state, "blocks.0.mlp.fc1.weight", 2, source)[0], pool=pool,
            representation_size=rep, num_classes=head, qkv_bias="blocks.0.attn.qkv.bias" in state,
            gelu=gelu, layer_norm_eps=TIMM_LAYER_NORM_EPS,
        )  # fmt: skip


# ---- reading and writing ----------------------------------------------------------------------------------


def to_vitkit(path: str | os.PathLike, config: ViTConfig | None = None, max_bytes: int | None = None) -> Checkpoint:
    """Read a timm ViT state dict (file or hub directory): header first, data once the model is known to fit."""
    return reading(path, max_bytes).checkpoint(config, max_bytes)


def reading(path: str | os.PathLike, max_bytes: int | None = None) -> Reading:
    """A timm ViT state dict (file or hub directory) opened: its header read, its data when asked."""
    path = Path(path)
    meta: dict[str, Any] = {}
    if path.is_dir():
        meta = read_json(path / CONFIG)
        path = weights_file(path)
    source, where = str(path), f"{path.parent / CONFIG}"
    args = mapping(meta.get("model_args"), f"{where}: model_args")
    with naming(where, {"num_heads": "model_args.num_heads"}):
        check_int("num_heads", args.get("num_heads"), 1, MAX_WIDTH, optional=True)
    gelu = activation(args["act_layer"] if "act_layer" in args else default_activation(meta), where)
    pretrained = mapping(meta.get("pretrained_cfg"), f"{where}: pretrained_cfg")

    def convert(tensors: dict[str, Tensor], config: ViTConfig | None) -> tuple[ViTConfig, dict[str, Tensor]]:
        reject_unsupported(tensors, source)
        check_pooling(args.get("global_pool", meta.get("global_pool")), "cls_token" in tensors, where)  # root: older
        state = add_class_posemb_row(tensors, grid_tokens(args.get("img_size"), tensors, where))
        config = config or infer_config(state, args.get("num_heads"), source, gelu, meta.get("architecture"))
        table = keymap.restrict(keymap.expand(KEY_MAP, config.depth), config)
        return config, keymap.convert(state, table, config.num_heads, source)

    def fields(config: ViTConfig) -> dict[str, Any]:
        extra: dict[str, Any] = {"provenance": {"source": source, "format": "timm"}}
        counts = tuple(sorted({1, 3, config.in_chans}))
        if "mean" in pretrained and "std" in pretrained:
            extra.update(
                mean=numbers_list(pretrained["mean"], f"{where}: pretrained_cfg.mean", counts),
                std=numbers_list(pretrained["std"], f"{where}: pretrained_cfg.std", counts, positive=True),
            )
        if meta.get("label_names"):
            names = label_list(meta["label_names"], config.num_classes, f"{where}: label_names")
            extra["class_names"] = strings_list(names, f"{where}: label_names", config.num_classes or None)
        return extra

    header, load = open_tensors(path, max_bytes)
    return Reading(convert, header, load, source, fields)


def from_vitkit(checkpoint: Checkpoint) -> dict[str, Tensor]:
    """timm state dict of a vitkit ViT."""
    config = checkpoint.model.config
    if not isinstance(config, ViTConfig):
        raise ValueError(f"timm export covers plain ViT models, not {type(config).__name__}")
    if config.posemb != "learned_1d" or config.posemb_where != "input":
        raise ValueError(
            f"timm's ViT has learned 1D position embeddings at the input, not {config.posemb}/{config.posemb_where}"
        )
    if config.layer_norm_eps != TIMM_LAYER_NORM_EPS:
        log.warning(
            "timm's ViT uses LayerNorm eps %g and its config.json cannot say another; this model uses %g "
            "(timm's logits will differ slightly, and reading the export back gives eps %g)",
            TIMM_LAYER_NORM_EPS, config.layer_norm_eps, TIMM_LAYER_NORM_EPS,
        )  # fmt: skip
    if config.representation_size:
        log.warning(
            "timm >= 0.9 has no pre-logits layer: timm.create_model cannot load this export (timm 0.x and vitkit "
            "can, under timm 0.x's pre_logits.fc names)"
        )
    table = keymap.restrict(keymap.expand(KEY_MAP, config.depth), config)
    state = {k: v.detach().cpu().contiguous() for k, v in checkpoint.model.state_dict().items()}
    return keymap.convert_back(state, table, config.num_heads)


def label_list(names: Any, num_classes: int, where: str) -> Any:
    """timm's `label_names` as a list: a list as it is, or an object of class index -> name (timm writes one where
    some indices have no name; those are named by their index)."""
    if not isinstance(names, dict):
        return names
    indices = {key: int(key) for key in names if isinstance(key, str) and key.isdigit() and key.isascii()}
    if len(indices) != len(names) or any(index >= num_classes for index in indices.values()):
        raise CheckpointError(f"{where}: keys must be class indices below {num_classes}, got {short(list(names))}")
    by_index = {index: names[key] for key, index in indices.items()}
    return [by_index.get(index, str(index)) for index in range(num_classes)]


def default_activation(meta: Mapping[str, Any]) -> str | None:
    """timm's `act_layer` for a hub config.json's architecture where model_args do not name one (None: GELU)."""
    architecture = meta.get("architecture")
    if isinstance(architecture, str) and architecture.split(".", 1)[0] in TANH_GELU_ARCHITECTURES:
        return "gelu_tanh"
    return None


def activation(name: Any, where: str) -> str:
    """vitkit's `gelu` for timm's `model_args.act_layer` (absent: timm's default, exact GELU)."""
    if name is None or name == "":
        return "exact"
    if not isinstance(name, str) or name not in ACTIVATIONS:
        raise CheckpointError(f"{where}: model_args.act_layer {name!r} is not one vitkit has: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def model_args(config: ViTConfig) -> dict[str, Any]:
    """timm VisionTransformer keyword arguments for `config`."""
    act_layer = {gelu: name for name, gelu in ACTIVATIONS.items()}[config.gelu]
    ratio = config.mlp_dim / config.hidden_size
    if int(config.hidden_size * ratio) != config.mlp_dim:  # timm's fc1 width: int(embed_dim * mlp_ratio)
        ratio = (config.mlp_dim + 0.5) / config.hidden_size
    return {
        "img_size": config.img_size, "patch_size": config.patch_size, "in_chans": config.in_chans,
        "num_classes": config.num_classes, "embed_dim": config.hidden_size, "depth": config.depth,
        "num_heads": config.num_heads, "mlp_ratio": ratio,
        "qkv_bias": config.qkv_bias, "class_token": config.pool == "token",
        "global_pool": "token" if config.pool == "token" else "avg", "fc_norm": False, "act_layer": act_layer,
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
            "mean": list(checkpoint.mean),
            "std": list(checkpoint.std),
            "interpolation": "bicubic",
            "crop_pct": 1.0,
            "num_classes": config.num_classes,
        },  # fmt: skip
    }
    if checkpoint.class_names:
        meta["label_names"] = list(checkpoint.class_names)
    atomic_write_text(directory / CONFIG, json.dumps(meta, indent=2) + "\n")
    return directory


def looks_timm(path: Path) -> bool:
    """A timm state-dict file, or a hub directory: config.json with "architecture" or "model_args" (timm's own
    `save_for_hf` writes both) beside model.safetensors or pytorch_model.bin."""
    if path.is_dir():
        try:
            meta = read_json(path / CONFIG)
        except CheckpointError:
            return False
        return ("architecture" in meta or "model_args" in meta) and weights_file(path).is_file()
    return path.suffix in (".safetensors", ".pth", ".pt", ".bin")


def weights_file(directory: Path) -> Path:
    """The weights of a timm hub directory: model.safetensors where it has one, else pytorch_model.bin."""
    return directory / WEIGHTS if (directory / WEIGHTS).is_file() else directory / TORCH_WEIGHTS
