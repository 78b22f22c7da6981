"""The released checkpoints of google-research/vision_transformer: flat `.npz` files of Flax arrays.

Layout (read from the official `vit_jax/models_vit.py`, `models_resnet.py`, `checkpoint.py` and
big_vision's `models/vit.py`; keys are module paths joined by "/"):

    embedding/{kernel,bias}                          patch embedding, a P x P conv, kernel HWIO
    cls                                              [class] token (1, 1, D); absent for "gap"
    Transformer/posembed_input/pos_embedding         E_pos (1, [1 +] N, D)
    Transformer/encoderblock_{i}/LayerNorm_0, MultiHeadDotProductAttention_1/{query,key,value,out},
                                 LayerNorm_2, MlpBlock_3/Dense_{0,1}
    Transformer/encoder_norm, pre_logits (optional dense + tanh), head
    conv_root, gn_root, block{s}/unit{u}/{conv1,gn1,conv2,gn2,conv3,gn3,conv_proj,gn_proj}   R50 hybrid

Numerics of these files: LayerNorm eps 1e-6 and tanh GELU (Flax defaults), vitkit's defaults too.
Variants handled by named quirks below: `opt/target/` and `params/` prefixes, big_vision's names and
scan-stacked blocks, a position embedding without the [class] row, unsqueezed GroupNorm parameters.
Reading runs the quirks and config inference twice (native.read_checked): on the members' headers
(meta tensors, nothing read) to check the model's size and shapes, then on the data.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitkit.atomic import atomic_write
from vitkit.checkpoints import headers, keymap, surgery
from vitkit.checkpoints.native import Checkpoint, Reading
from vitkit.checkpoints.validate import CheckpointError, naming
from vitkit.models.configs import MAX_DEPTH, HybridConfig, ViTConfig

log = logging.getLogger(__name__)

BLOCK = "Transformer/encoderblock_{i}/"
# official key -> (vitkit key, layout); q/k/v land on separate keys and are fused by surgery.fuse_qkv.
KEY_MAP: dict[str, tuple[str, str]] = {
    "embedding/kernel": ("patch_embed.proj.weight", "conv"),
    "embedding/bias": ("patch_embed.proj.bias", "copy"),
    "cls": ("cls_token", "copy"),
    "Transformer/posembed_input/pos_embedding": ("pos_embed", "copy"),
    BLOCK + "LayerNorm_0/scale": ("blocks.{i}.norm1.weight", "copy"),
    BLOCK + "LayerNorm_0/bias": ("blocks.{i}.norm1.bias", "copy"),
    **{
        BLOCK + f"MultiHeadDotProductAttention_1/{name}/kernel": (f"blocks.{{i}}.attn.{short}.weight", "heads_in")
        for name, short in (("query", "q"), ("key", "k"), ("value", "v"))
    },
    **{
        BLOCK + f"MultiHeadDotProductAttention_1/{name}/bias": (f"blocks.{{i}}.attn.{short}.bias", "heads_bias")
        for name, short in (("query", "q"), ("key", "k"), ("value", "v"))
    },
    BLOCK + "MultiHeadDotProductAttention_1/out/kernel": ("blocks.{i}.attn.proj.weight", "heads_out"),
    BLOCK + "MultiHeadDotProductAttention_1/out/bias": ("blocks.{i}.attn.proj.bias", "copy"),
    BLOCK + "LayerNorm_2/scale": ("blocks.{i}.norm2.weight", "copy"),
    BLOCK + "LayerNorm_2/bias": ("blocks.{i}.norm2.bias", "copy"),
    BLOCK + "MlpBlock_3/Dense_0/kernel": ("blocks.{i}.mlp.fc1.weight", "dense"),
    BLOCK + "MlpBlock_3/Dense_0/bias": ("blocks.{i}.mlp.fc1.bias", "copy"),
    BLOCK + "MlpBlock_3/Dense_1/kernel": ("blocks.{i}.mlp.fc2.weight", "dense"),
    BLOCK + "MlpBlock_3/Dense_1/bias": ("blocks.{i}.mlp.fc2.bias", "copy"),
    "Transformer/encoder_norm/scale": ("norm.weight", "copy"),
    "Transformer/encoder_norm/bias": ("norm.bias", "copy"),
    "pre_logits/kernel": ("pre_logits.fc.weight", "dense"),
    "pre_logits/bias": ("pre_logits.fc.bias", "copy"),
    "head/kernel": ("head.weight", "dense"),
    "head/bias": ("head.bias", "copy"),
}
STEM, UNIT = "patch_embed.backbone.stem.", "patch_embed.backbone.stages.{s}.blocks.{u}."
# The R50 hybrid's ResNet (models_resnet.py, root in models_vit.py); vitkit names follow models/hybrid.py.
HYBRID_KEY_MAP: dict[str, tuple[str, str]] = {
    "conv_root/kernel": (STEM + "conv.weight", "conv"),
    "gn_root/scale": (STEM + "norm.weight", "squeeze"),
    "gn_root/bias": (STEM + "norm.bias", "squeeze"),
    **{f"block{{s1}}/unit{{u1}}/conv{n}/kernel": (UNIT + f"conv{n}.weight", "conv") for n in (1, 2, 3)},
    **{f"block{{s1}}/unit{{u1}}/gn{n}/scale": (UNIT + f"norm{n}.weight", "squeeze") for n in (1, 2, 3)},
    **{f"block{{s1}}/unit{{u1}}/gn{n}/bias": (UNIT + f"norm{n}.bias", "squeeze") for n in (1, 2, 3)},
    "block{s1}/unit{u1}/conv_proj/kernel": (UNIT + "downsample.conv.weight", "conv"),
    "block{s1}/unit{u1}/gn_proj/scale": (UNIT + "downsample.norm.weight", "squeeze"),
    "block{s1}/unit{u1}/gn_proj/bias": (UNIT + "downsample.norm.bias", "squeeze"),
}


# ---- quirks: each turns one variant of the layout into the released vit_jax one ----------------------------


def params_prefix(names: Iterable[str]) -> str:
    """Where the parameters lie: vit_jax checkpoints saved with the optimizer state keep them under "opt/target/",
    big_vision under "params/"; "" for a file of parameters alone."""
    names = list(names)
    return next((p for p in ("opt/target/", "params/") if any(k.startswith(p + "embedding/") for k in names)), "")


def strip_prefix(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    prefix = params_prefix(arrays)
    return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}


def reject_map_head(arrays: dict[str, np.ndarray]) -> None:
    # big_vision pool_type="map": attention pooling (MAPHead) has no vitkit equivalent
    if any(k.startswith(("MAPHead_0/", "probe")) for k in arrays):
        raise ValueError(
            "this checkpoint uses big_vision's MAP head (pool_type='map', keys MAPHead_0/...), "
            "which vitkit does not implement; only 'token' and 'gap' pooling are supported"
        )


def unstack_scanned_blocks(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    # big_vision scan=True stores all layers under Transformer/encoderblock/ with a leading layer axis
    scanned = "Transformer/encoderblock/"
    out = {}
    for key, value in arrays.items():
        if key.startswith(scanned):
            if value.ndim == 0 or value.shape[0] > MAX_DEPTH:
                raise ValueError(f"{key} has shape {tuple(value.shape)}: not up to {MAX_DEPTH} stacked layers")
            for i in range(value.shape[0]):
                out[f"Transformer/encoderblock_{i}/{key[len(scanned) :]}"] = value[i]
        else:
            out[key] = value
    return out


BIG_VISION_NAMES = {
    "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
    "LayerNorm_1": "LayerNorm_2",
    "MlpBlock_0": "MlpBlock_3",
}


def rename_big_vision_blocks(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    # big_vision numbers sub-modules per type (linen); the released vit_jax files number them globally (pre-linen)
    if not any("/MultiHeadDotProductAttention_0/" in k for k in arrays):
        return arrays
    pattern = re.compile(r"^(Transformer/encoderblock_\d+/)(\w+)(/.*)$")
    out = {}
    for key, value in arrays.items():
        match = pattern.match(key)
        if match and match.group(2) in BIG_VISION_NAMES:
            key = match.group(1) + BIG_VISION_NAMES[match.group(2)] + match.group(3)
        out[key] = value
    return out


def move_pos_embedding(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    # big_vision keeps E_pos at the top ("pos_embedding"), pre-2022 code in "Transformer/pos_embedding"
    out = dict(arrays)
    for old in ("pos_embedding", "Transformer/pos_embedding"):
        if old in out:
            out["Transformer/posembed_input/pos_embedding"] = out.pop(old)
    return out


def add_class_posemb_row(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    # big_vision adds E_pos before concatenating [class], so E_pos has no [class] row: a zero row is exact
    key = "Transformer/posembed_input/pos_embedding"
    if "cls" not in arrays or key not in arrays:
        return arrays
    posemb = torch.as_tensor(arrays[key])
    if posemb.dim() == 3 and math.isqrt(posemb.shape[1]) ** 2 == posemb.shape[1]:  # a square grid alone: no [class] row
        return {**arrays, key: surgery.cat([torch.zeros_like(posemb[:, :1]), posemb], dim=1)}
    return arrays


def normalise_layout(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every known variant -> the released vit_jax layout of KEY_MAP / HYBRID_KEY_MAP."""
    arrays = strip_prefix(arrays)
    reject_map_head(arrays)
    arrays = unstack_scanned_blocks(arrays)
    arrays = rename_big_vision_blocks(arrays)
    arrays = move_pos_embedding(arrays)
    return add_class_posemb_row(arrays)


# ---- config inference -------------------------------------------------------------------------------------


def infer_config(arrays: Mapping[str, torch.Tensor], source: str) -> ViTConfig | HybridConfig:
    """The model config the tensor shapes imply (normalised layout)."""
    if "embedding/kernel" not in arrays or "Transformer/encoderblock_0/LayerNorm_0/scale" not in arrays:
        raise ValueError(
            "not a ViT checkpoint of the official layout: no embedding/kernel or Transformer/encoderblock_0"
        )
    patch, _, in_chans, hidden = keymap.shape_of(arrays, "embedding/kernel", 4, source)
    depth = keymap.count_indices(arrays, r"^Transformer/encoderblock_(\d+)/")
    block = "Transformer/encoderblock_0/"
    heads = keymap.shape_of(arrays, block + "MultiHeadDotProductAttention_1/query/kernel", 3, source)[1]
    mlp = keymap.shape_of(arrays, block + "MlpBlock_3/Dense_0/kernel", 2, source)[1]
    pool = "token" if "cls" in arrays else "gap"
    rep = keymap.shape_of(arrays, "pre_logits/kernel", 2, source)[1] if "pre_logits/kernel" in arrays else None
    classes = keymap.shape_of(arrays, "head/kernel", 2, source)[1] if "head/kernel" in arrays else 0
    hybrid_layers = tuple(
        keymap.count_indices(arrays, rf"^block{s}/unit(\d+)/") - 1 for s in range(1, 5)  # units are 1-based
        if f"block{s}/unit1/conv1/kernel" in arrays
    )  # fmt: skip
    root = keymap.shape_of(arrays, "conv_root/kernel", 4, source) if "conv_root/kernel" in arrays else None
    stride = 4 * 2 ** max(len(hybrid_layers) - 1, 0) if root else 1  # root conv and max-pool /4, then /2 per stage
    if "Transformer/posembed_input/pos_embedding" not in arrays:
        raise ValueError(
            "no position embedding (Transformer/posembed_input/pos_embedding) in the checkpoint: a big_vision "
            "sincos2d model; pass config=ViTConfig(..., posemb='sincos_2d', img_size=...) "
            "since its size cannot be inferred"
        )
    tokens = keymap.shape_of(arrays, "Transformer/posembed_input/pos_embedding", 3, source)[1] - (pool == "token")
    grid = math.isqrt(max(tokens, 0))
    if tokens < 1 or grid * grid != tokens:
        raise ValueError(f"position embedding has {tokens} patch rows, not a square grid")
    vit = ViTConfig(
        img_size=grid * patch * stride, patch_size=patch, in_chans=root[2] if root else in_chans, num_classes=classes,
        hidden_size=hidden, depth=depth, num_heads=heads, mlp_dim=mlp, pool=pool, representation_size=rep,
    )  # fmt: skip
    if root is None:
        return vit
    return HybridConfig(vit=vit, resnet_layers=hybrid_layers, width_factor=root[3] // 64)


def _table(config: ViTConfig | HybridConfig) -> dict[str, tuple[str, str]]:
    """KEY_MAP (+ HYBRID_KEY_MAP) written out for `config`, only the keys its model has."""
    vit = config.vit if isinstance(config, HybridConfig) else config
    table, units = dict(KEY_MAP), ()
    if isinstance(config, HybridConfig):
        table.update(HYBRID_KEY_MAP)
        units = config.resnet_layers
    return keymap.restrict(keymap.expand(table, vit.depth, units), config)


# ---- reading and writing ----------------------------------------------------------------------------------


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    """The parameter arrays of an .npz (not an optimizer state beside them, which may inflate to any size and
    is not checked), with pickles refused (`allow_pickle=False`)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            prefix = params_prefix(data.files)
            return {key: data[key] for key in data.files if key.startswith(prefix)}
    except ValueError as err:
        if "allow_pickle" in str(err) or "Object arrays" in str(err):
            raise CheckpointError(f"{path} {headers.PICKLED}") from None
        raise CheckpointError(f"cannot read {path}: {err}") from None
    except headers.ZIP_ERRORS as err:
        problem = f"{type(err).__name__}: {err}"[:200]
        raise CheckpointError(
            f"cannot read {path} as an .npz archive ({problem}); the file is damaged or not an .npz"
        ) from None


def to_vitkit(
    path: str | os.PathLike, config: ViTConfig | HybridConfig | None = None, max_bytes: int | None = None
) -> Checkpoint:
    """Read an official `.npz`; its config is inferred from the shapes unless `config` is given."""
    checkpoint = reading(path).checkpoint(config, max_bytes)
    log.info("read official checkpoint %s: %s", path, checkpoint.config)
    return checkpoint


def reading(path: str | os.PathLike, max_bytes: int | None = None) -> Reading:
    """An official `.npz` opened: its header read, its arrays when asked (`max_bytes`: as the other formats take
    it; an .npz's header is read without its data)."""
    path = Path(path)
    source = str(path)

    def convert(tensors: dict[str, torch.Tensor], config: ViTConfig | HybridConfig | None):
        with naming(source):
            arrays = normalise_layout(tensors)
            config = config or infer_config(arrays, source)
            vit = config.vit if isinstance(config, HybridConfig) else config
            state = keymap.convert(arrays, _table(config), vit.num_heads, source)
            return config, surgery.fuse_qkv(state, vit.depth)

    def load() -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in read_arrays(path).items()}

    def fields(config: ViTConfig | HybridConfig) -> dict[str, Any]:
        return {"provenance": {"source": source, "format": "official"}}

    return Reading(convert, headers.npz_header(path), load, source, fields)


def from_vitkit(checkpoint: Checkpoint) -> dict[str, np.ndarray]:
    """The official arrays of a vitkit model (released vit_jax layout)."""
    model, config = checkpoint.model, checkpoint.model.config
    if not isinstance(config, (ViTConfig, HybridConfig)):
        raise ValueError(f"the official layout holds ViT and hybrid models, not {type(config).__name__}")
    vit = config.vit if isinstance(config, HybridConfig) else config
    if vit.posemb != "learned_1d" or vit.posemb_where != "input":
        raise ValueError(
            "the official layout has learned 1D position embeddings at the input only, "
            f"not {vit.posemb}/{vit.posemb_where}"
        )
    if vit.gelu != "tanh" or vit.layer_norm_eps != 1e-6:
        log.warning(
            "official readers assume tanh GELU and LayerNorm eps 1e-6; this model uses %s / %g",
            vit.gelu,
            vit.layer_norm_eps,
        )
    _warn_unkept(checkpoint)
    state = {k: v.detach().cpu().float() for k, v in model.state_dict().items()}
    if not vit.qkv_bias:  # Flax attention always has biases: zeros compute the same
        state.update({f"blocks.{i}.attn.qkv.bias": torch.zeros(3 * vit.hidden_size) for i in range(vit.depth)})
        with_bias = replace(vit, qkv_bias=True)
        config = replace(config, vit=with_bias) if isinstance(config, HybridConfig) else with_bias
    arrays = keymap.convert_back(surgery.split_qkv(state, vit.depth), _table(config), vit.num_heads)
    return {k: v.numpy() for k, v in arrays.items()}


def _warn_unkept(checkpoint: Checkpoint) -> None:
    """The official .npz holds arrays only: class names and a normalisation other than [-1, 1] are not kept."""
    unkept = []
    if checkpoint.class_names:
        unkept.append(f"class names ({len(checkpoint.class_names)})")
    if any(v != 0.5 for v in (*checkpoint.mean, *checkpoint.std)):
        unkept.append(f"normalisation (mean {tuple(checkpoint.mean)}, std {tuple(checkpoint.std)})")
    if unkept:
        log.warning(
            "the official .npz holds arrays only: %s not kept; a reader assumes pixels in [-1, 1] (mean 0.5, std 0.5)",
            " and ".join(unkept),
        )


def npz_path(path: str | os.PathLike) -> Path:
    """The file `write` writes for `path`: `path` itself where it ends in .npz, else `path` + ".npz"."""
    path = Path(path)
    return path if path.suffix == ".npz" else path.with_suffix(path.suffix + ".npz")


def write(checkpoint: Checkpoint, path: str | os.PathLike) -> Path:
    """Write the official `.npz` atomically."""
    arrays = from_vitkit(checkpoint)
    with_suffix = npz_path(path)

    def _save(tmp: Path) -> None:
        with open(tmp, "wb") as handle:  # a file object: np.savez would append ".npz" to a name
            np.savez(handle, **arrays)

    atomic_write(with_suffix, _save)
    return with_suffix


def looks_official(path: Path) -> bool:
    return path.is_file() and path.suffix == ".npz"
