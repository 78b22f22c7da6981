"""HF transformers ViT directories: `ViTModel` / `ViTForImageClassification` (`model_type: "vit"`).

A directory holds config.json, model.safetensors (or pytorch_model.bin, read weights-only) and
optionally preprocessor_config.json (image_mean / image_std).  Keys on disk keep the names of
`transformers/models/vit/modeling_vit.py` before v5 (`vit.encoder.layer.{i}.attention.attention.query`);
v5 renames them in memory only (`vit.layers.{i}.attention.q_proj`), and both are read.  Numerics:
`hidden_act` "gelu" is exact erf GELU and `layer_norm_eps` defaults to 1e-12; both are carried.
`ViTModel`'s pooler (dense + tanh on the [class] token) is the pre-logits layer of Sec. 3.1.
Reading checks config.json's fields by their HF names, and the weights' header against the model,
before any data is read (tensorfile.py, native.read_checked).
"""

from __future__ import annotations

import json
import logging
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
from vitkit.checkpoints.validate import CheckpointError, mapping, naming, numbers_list, read_json, short
from vitkit.models.configs import ViTConfig

log = logging.getLogger(__name__)

LAYER = "vit.encoder.layer.{i}."
KEY_MAP: dict[str, tuple[str, str]] = {  # HF key -> (vitkit key, layout); q/k/v fused by surgery.fuse_qkv
    "vit.embeddings.cls_token": ("cls_token", "copy"),
    "vit.embeddings.position_embeddings": ("pos_embed", "copy"),
    "vit.embeddings.patch_embeddings.projection.weight": ("patch_embed.proj.weight", "copy"),
    "vit.embeddings.patch_embeddings.projection.bias": ("patch_embed.proj.bias", "copy"),
    **{
        LAYER + f"{theirs}.{kind}": (f"blocks.{{i}}.{ours}.{kind}", "copy")
        for theirs, ours in (
            ("layernorm_before", "norm1"),
            ("attention.attention.query", "attn.q"),
            ("attention.attention.key", "attn.k"),
            ("attention.attention.value", "attn.v"),
            ("attention.output.dense", "attn.proj"),
            ("layernorm_after", "norm2"),
            ("intermediate.dense", "mlp.fc1"),
            ("output.dense", "mlp.fc2"),
        )
        for kind in ("weight", "bias")
    },
    "vit.layernorm.weight": ("norm.weight", "copy"),
    "vit.layernorm.bias": ("norm.bias", "copy"),
    "vit.pooler.dense.weight": ("pre_logits.fc.weight", "copy"),
    "vit.pooler.dense.bias": ("pre_logits.fc.bias", "copy"),
    "classifier.weight": ("head.weight", "copy"),
    "classifier.bias": ("head.bias", "copy"),
}
CONFIG, WEIGHTS, TORCH_WEIGHTS, PREPROCESSOR = (
    "config.json",
    "model.safetensors",
    "pytorch_model.bin",
    "preprocessor_config.json",
)
# transformers v5 in-memory names -> on-disk names
V5_NAMES = [
    (
        r"^vit\.layers\.(\d+)\.attention\.([qkv])_proj\.",
        lambda m: f"vit.encoder.layer.{m[1]}.attention.attention.{dict(q='query', k='key', v='value')[m[2]]}.",
    ),
    (r"^vit\.layers\.(\d+)\.attention\.o_proj\.", r"vit.encoder.layer.\1.attention.output.dense."),
    (r"^vit\.layers\.(\d+)\.mlp\.fc1\.", r"vit.encoder.layer.\1.intermediate.dense."),
    (r"^vit\.layers\.(\d+)\.mlp\.fc2\.", r"vit.encoder.layer.\1.output.dense."),
    (r"^vit\.layers\.(\d+)\.", r"vit.encoder.layer.\1."),
]
ACTIVATIONS = {"gelu": "exact", "gelu_pytorch_tanh": "tanh", "gelu_new": "tanh"}
FIELDS = {  # vitkit ViTConfig field -> HF config.json field, to name a wrong value as the file names it
    "img_size": "image_size", "patch_size": "patch_size", "in_chans": "num_channels", "hidden_size": "hidden_size",
    "depth": "num_hidden_layers", "num_heads": "num_attention_heads", "mlp_dim": "intermediate_size",
    "qkv_bias": "qkv_bias", "layer_norm_eps": "layer_norm_eps", "gelu": "hidden_act",
    "dropout": "hidden_dropout_prob", "attention_dropout": "attention_probs_dropout_prob",
}  # fmt: skip


# ---- quirks -----------------------------------------------------------------------------------------------


def add_vit_prefix(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    # ViTModel saves its own keys (embeddings., encoder., layernorm., pooler.); ViTFor... nests it under vit.
    if any(k.startswith("vit.") for k in state):
        return dict(state)
    return {f"vit.{k}": v for k, v in state.items()}


def rename_v5(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    # transformers >= 5 names layers vit.layers.{i}.attention.q_proj ... in memory; files keep the old names
    out = {}
    for key, value in state.items():
        for pattern, repl in V5_NAMES:
            key, hits = re.subn(pattern, repl, key)
            if hits:
                break
        out[key] = value
    return out


def drop_unused(state: dict[str, Tensor], source: str) -> dict[str, Tensor]:
    """What HF's own classes do not compute: ViTForMaskedImageModeling's [mask] token and pixel decoder (its
    encoder is the model), and a pooler beside a classifier (ViTForImageClassification has none: HF leaves
    those tensors out as unexpected, and so does vitkit, said)."""
    kept = {k: v for k, v in state.items() if k != "vit.embeddings.mask_token" and not k.startswith("decoder.")}
    if "classifier.weight" in kept and any(k.startswith("vit.pooler.") for k in kept):
        log.warning("%s: vit.pooler.* beside a classifier is left out, as ViTForImageClassification does", source)
        kept = {k: v for k, v in kept.items() if not k.startswith("vit.pooler.")}
    return kept


# ---- config -----------------------------------------------------------------------------------------------


def to_vit_config(hf: Mapping[str, Any], state: Mapping[str, Tensor], source: str) -> ViTConfig:
    """HF ViTConfig fields -> vitkit ViTConfig (numerics carried); head and pooler from the tensors (`source`)."""
    act = hf.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise ValueError(f"hidden_act {short(act)} has no vitkit equivalent (supported: {sorted(ACTIVATIONS)})")
    pooler = "vit.pooler.dense.weight" in state
    if pooler and hf.get("pooler_act", "tanh") != "tanh":
        raise ValueError(f"pooler_act {short(hf.get('pooler_act'))}: vitkit's pre-logits layer is dense + tanh")
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    missing = [k for k in required if k not in hf]
    if missing:
        raise ValueError(f"lacks the field(s) {missing}")
    rep = keymap.shape_of(state, "vit.pooler.dense.weight", 2, source)[0] if pooler else None
    head = keymap.shape_of(state, "classifier.weight", 2, source)[0] if "classifier.weight" in state else 0
    return ViTConfig(
        img_size=_square(hf.get("image_size", 224), "image_size"),
        patch_size=_square(hf.get("patch_size", 16), "patch_size"), in_chans=hf.get("num_channels", 3),
        hidden_size=hf["hidden_size"], depth=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], mlp_dim=hf["intermediate_size"], pool="token",
        representation_size=rep, num_classes=head, qkv_bias=hf.get("qkv_bias", True),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-12), gelu=ACTIVATIONS[act],
        dropout=hf.get("hidden_dropout_prob", 0.0), attention_dropout=hf.get("attention_probs_dropout_prob", 0.0),
    )  # fmt: skip


def _square(value: Any, name: str) -> Any:
    # HF accepts (height, width) pairs; vitkit's models are square (the value's type is checked by ViTConfig)
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(
                f"{name} must be one size or two equal ones (vitkit's models are square), got {short(value)}"
            )
        return value[0]
    return value


def class_names(hf: Mapping[str, Any], num_classes: int, where: str) -> list[str] | None:
    """id2label in index order; None when absent or only HF's placeholder "LABEL_i" names."""
    labels = mapping(hf.get("id2label"), f"{where}: id2label")
    names = [labels.get(str(i), labels.get(i)) for i in range(num_classes)]
    if num_classes and labels and None in names:  # a label file for another head: said, not dropped silently
        log.warning(
            "%s: id2label names %d of the head's %d classes; the class names are left out (predictions show "
            "class indices)", where, num_classes - names.count(None), num_classes,
        )  # fmt: skip
    if not num_classes or None in names or all(n == f"LABEL_{i}" for i, n in enumerate(names)):
        return None
    return [str(n) for n in names]


# ---- reading and writing ----------------------------------------------------------------------------------


def looks_hf(path: Path) -> bool:
    try:
        return path.is_dir() and read_json(path / CONFIG).get("model_type") == "vit"
    except CheckpointError:
        return False


def weights_file(directory: Path) -> Path:
    """The weights of an HF directory: model.safetensors where it has one, else pytorch_model.bin; neither is a
    FileNotFoundError (a download that stopped after config.json)."""
    weights = directory / WEIGHTS if (directory / WEIGHTS).is_file() else directory / TORCH_WEIGHTS
    if not weights.is_file():
        raise FileNotFoundError(f"{directory} has neither {WEIGHTS} nor {TORCH_WEIGHTS}")
    return weights


def to_vitkit(path: str | os.PathLike, config: ViTConfig | None = None, max_bytes: int | None = None) -> Checkpoint:
    """Read an HF ViT directory: config.json and the header first, data once the model is known to fit."""
    return reading(path, max_bytes).checkpoint(config, max_bytes)


def reading(path: str | os.PathLike, max_bytes: int | None = None) -> Reading:
    """An HF ViT directory opened: config.json and the weights' header read, their data when asked."""
    directory = Path(path)
    hf, where = read_json(directory / CONFIG), str(directory / CONFIG)
    weights = weights_file(directory)
    source = str(weights)

    def convert(tensors: dict[str, Tensor], config: ViTConfig | None) -> tuple[ViTConfig, dict[str, Tensor]]:
        state = drop_unused(rename_v5(add_vit_prefix(tensors)), source)
        if config is None:
            with naming(where, FIELDS):
                config = to_vit_config(hf, state, source)
        table = keymap.restrict(keymap.expand(KEY_MAP, config.depth), config)
        with naming(source):
            return config, surgery.fuse_qkv(keymap.convert(state, table, config.num_heads, source), config.depth)

    def fields(config: ViTConfig) -> dict[str, Any]:
        extra: dict[str, Any] = {"provenance": {"source": str(directory), "format": "hf"}}
        extra["class_names"] = class_names(hf, config.num_classes, where)
        pre_path = directory / PREPROCESSOR
        if pre_path.exists() or pre_path.is_symlink():  # a folder or dangling link there is damage, not absence
            pre, counts = read_json(pre_path), tuple(sorted({1, 3, config.in_chans}))
            if "image_mean" in pre and "image_std" in pre:
                extra.update(
                    mean=numbers_list(pre["image_mean"], f"{pre_path}: image_mean", counts),
                    std=numbers_list(pre["image_std"], f"{pre_path}: image_std", counts, positive=True),
                )
        return extra

    header, load = open_tensors(weights, max_bytes)
    return Reading(convert, header, load, source, fields)


def to_hf_config(checkpoint: Checkpoint) -> dict[str, Any]:
    """config.json of the HF model equivalent to `checkpoint`; raises for what HF's ViT cannot hold."""
    config = checkpoint.model.config
    if not isinstance(config, ViTConfig):
        raise ValueError(f"HF ViT export covers plain ViT models, not {type(config).__name__}")
    if config.pool != "token":
        raise ValueError("HF's ViT classifies from the [class] token; a 'gap' model has no HF equivalent")
    if config.posemb != "learned_1d" or config.posemb_where != "input":
        raise ValueError(
            f"HF's ViT has learned 1D position embeddings at the input, not {config.posemb}/{config.posemb_where}"
        )
    if config.representation_size and config.num_classes:
        raise ValueError(
            "HF's ViTForImageClassification has no pre-logits layer: convert with --pre-logits drop --num-classes K "
            "(new head) or --num-classes 0 --pre-logits keep (features model, exported as ViTModel with its pooler)"
        )
    names = checkpoint.class_names or [f"LABEL_{i}" for i in range(config.num_classes)]
    out = {
        "architectures": ["ViTForImageClassification" if config.num_classes else "ViTModel"],
        "model_type": "vit",
        "hidden_size": config.hidden_size, "num_hidden_layers": config.depth,
        "num_attention_heads": config.num_heads, "intermediate_size": config.mlp_dim,
        "hidden_act": "gelu" if config.gelu == "exact" else "gelu_pytorch_tanh",
        "layer_norm_eps": config.layer_norm_eps, "image_size": config.img_size, "patch_size": config.patch_size,
        "num_channels": config.in_chans, "qkv_bias": config.qkv_bias,
        "hidden_dropout_prob": config.dropout, "attention_probs_dropout_prob": config.attention_dropout,
        "id2label": {str(i): n for i, n in enumerate(names)}, "label2id": {n: i for i, n in enumerate(names)},
    }  # fmt: skip
    if config.representation_size:
        out.update(pooler_output_size=config.representation_size, pooler_act="tanh")
    return out


def from_vitkit(checkpoint: Checkpoint) -> dict[str, Tensor]:
    """HF (on-disk names) state dict of a vitkit ViT."""
    to_hf_config(checkpoint)  # validates
    config = checkpoint.model.config
    state = {k: v.detach().cpu() for k, v in checkpoint.model.state_dict().items()}
    table = keymap.restrict(keymap.expand(KEY_MAP, config.depth), config)
    state = keymap.convert_back(surgery.split_qkv(state, config.depth), table, config.num_heads)
    if not config.num_classes:  # ViTModel keeps its own keys, without the "vit." of the classifier wrapper
        state = {k.removeprefix("vit."): v for k, v in state.items()}
    return state


def write(checkpoint: Checkpoint, directory: str | os.PathLike) -> Path:
    """A directory `transformers.ViTForImageClassification.from_pretrained` (or ViTModel) loads."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf_config = to_hf_config(checkpoint)
    state = {k: v.contiguous() for k, v in from_vitkit(checkpoint).items()}
    atomic_write(directory / WEIGHTS, lambda tmp: save_file(state, str(tmp), metadata={"format": "pt"}))
    atomic_write_text(directory / CONFIG, json.dumps(hf_config, indent=2) + "\n")
    size = checkpoint.model.config.img_size
    pre = {
        "image_processor_type": "ViTImageProcessor", "do_resize": True, "size": {"height": size, "width": size},
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "image_mean": list(checkpoint.mean), "image_std": list(checkpoint.std),
    }  # fmt: skip
    atomic_write_text(directory / PREPROCESSOR, json.dumps(pre, indent=2) + "\n")
    config = checkpoint.model.config
    if not config.num_classes and not config.representation_size:  # ViTModel would draw a pooler at random
        log.warning(
            "%s: this encoder has no pre-logits layer for ViTModel's pooler; load it with "
            "ViTModel.from_pretrained(DIR, add_pooling_layer=False) and read last_hidden_state[:, 0], its "
            "representation (a default load draws the pooler at random)",
            directory,
        )
    return directory
