"""Model configurations: one frozen dataclass per family and the named presets of Table 1.

ViT sizes are Table 1 of Dosovitskiy et al. (2021); the numerics (LayerNorm eps 1e-6, tanh GELU)
follow the official google-research/vision_transformer code.  The hybrid backbone follows
`vit_jax/models_resnet.py`; the BiT baseline follows Kolesnikov et al. (2020), "Big Transfer".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

Pool = Literal["token", "gap"]
PosEmb = Literal["none", "learned_1d", "learned_2d", "sincos_2d", "relative"]
PosEmbWhere = Literal["input", "per_layer", "shared_per_layer"]
Gelu = Literal["tanh", "exact"]
AttnImpl = Literal["auto", "sdpa", "explicit"]
Init = Literal["official", "mimetic"]
PatchKeep = Literal["random", "content"]


@dataclass(frozen=True, kw_only=True)
class ViTConfig:
    """Vision Transformer (Sec. 3.1, Eq. 1-4)."""

    img_size: int = 224  # H = W, input resolution in pixels
    patch_size: int = 16  # P (for a hybrid: the patch size on the CNN feature map, 1 in the paper)
    in_chans: int = 3  # C
    num_classes: int = 1000  # K; 0 = no head, forward() returns y
    hidden_size: int = 768  # D
    depth: int = 12  # L
    num_heads: int = 12  # k
    mlp_dim: int = 3072  # MLP size (Table 1)
    pool: Pool = "token"  # Eq. 4 reads z_L^0 ("token") or the mean of the patch tokens ("gap", Sec. 3.1)
    posemb: PosEmb = "learned_1d"  # App. D.4 variants; learned 1D is the paper's default
    posemb_where: PosEmbWhere = "input"  # App. D.4: after the stem / learned per layer / one set at every layer
    representation_size: int | None = None  # pre-logits layer (tanh) used in pre-training (Sec. 3.1, App. B.1)
    dropout: float = 0.0  # after every dense layer but qkv, and after adding position embeddings (App. B.1)
    attention_dropout: float = 0.0  # on attention weights (official code's attention_dropout_rate)
    drop_path: float = 0.0  # stochastic depth, maximal rate at the last block (not in the paper; an option)
    patch_dropout: float = 0.0  # training drops this fraction of each image's patch tokens (Liu et al. 2023; an option)
    patch_dropout_keep: PatchKeep = "random"  # PatchDropout keeps random tokens, or "content": varying pixels first
    layer_norm_eps: float = 1e-6  # official code (Flax default); timm 1e-6, HF 1e-12
    gelu: Gelu = "tanh"  # Flax's nn.gelu is the tanh approximation; timm and HF use exact erf
    qkv_bias: bool = True  # official code has biases on q, k, v and out
    attn_impl: AttnImpl = "auto"  # how Eq. 5-7 are computed (same numbers): fused SDPA kernel, softmax spelt out, or auto = explicit for bf16 on CPU (measured faster there, benchmarks/compare.py), SDPA elsewhere
    init: Init = "official"  # "mimetic": attention weights as trained ViTs show them (Trockman & Kolter 2023; an option)

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.posemb == "learned_2d" and self.hidden_size % 2:
            raise ValueError("learned_2d position embeddings need an even hidden_size (X and Y halves, App. D.4)")
        if self.posemb == "sincos_2d" and self.hidden_size % 4:
            raise ValueError("sincos_2d position embeddings need hidden_size divisible by 4")
        if self.img_size % self.patch_size:
            raise ValueError(
                f"img_size {self.img_size} is not divisible by patch_size {self.patch_size}: "
                f"use {self.img_size // self.patch_size * self.patch_size} or "
                f"{(self.img_size // self.patch_size + 1) * self.patch_size}"
            )
        if self.patch_dropout and (self.posemb == "relative" or self.posemb_where != "input"):
            raise ValueError("patch_dropout needs position embeddings added once at the input (posemb_where='input', "
                             "not relative): the dropped tokens' positions are not tracked further")
        for name in ("dropout", "attention_dropout", "drop_path", "patch_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.attn_impl not in ("auto", "sdpa", "explicit"):
            raise ValueError(f"attn_impl must be auto, sdpa or explicit, got {self.attn_impl!r}")
        if self.patch_dropout_keep not in ("random", "content"):
            raise ValueError(f"patch_dropout_keep must be random or content, got {self.patch_dropout_keep!r}")
        if self.init not in ("official", "mimetic"):
            raise ValueError(f"init must be official or mimetic, got {self.init!r}")
        if self.num_classes < 0 or self.in_chans < 1:
            raise ValueError("num_classes must be >= 0 and in_chans >= 1")

    @property
    def head_dim(self) -> int:  # D_h = D / k
        return self.hidden_size // self.num_heads


@dataclass(frozen=True, kw_only=True)
class ResNetConfig:
    """BiT ResNet-v2 baseline: pre-activation bottlenecks, weight-standardised convs, GroupNorm."""

    layers: tuple[int, ...] = (3, 4, 6, 3)  # bottleneck units per stage (R50)
    width_factor: int = 1  # the "x1", "x2", "x3" of R50x1 ...
    img_size: int = 224
    in_chans: int = 3
    num_classes: int = 1000  # 0 = no head, forward() returns the pooled features

    def __post_init__(self) -> None:
        if not self.layers or min(self.layers) < 1 or self.width_factor < 1:
            raise ValueError(f"bad ResNet layers {self.layers} / width_factor {self.width_factor}")


@dataclass(frozen=True, kw_only=True)
class HybridConfig:
    """ResNet feature map fed to ViT as 1x1 patches (Sec. 3.1 "Hybrid Architecture", Sec. 4.1).

    Four stages is the paper's option (i) (stride 32: 7x7 tokens at 224 px); three stages with
    stage 4's units moved into stage 3, (3, 4, 9), is option (ii) (stride 16: 14x14 tokens), the
    released R50+ViT-B/16.  No stages, (), is the official R+ViT-Ti/16: the root block alone (stride 4).
    """

    vit: ViTConfig = field(default_factory=lambda: ViTConfig(patch_size=1))  # encoder; vit.in_chans = image channels
    resnet_layers: tuple[int, ...] = (3, 4, 9)  # units per stage of the official ViT-code ResNet
    width_factor: int = 1

    def __post_init__(self) -> None:
        if len(self.resnet_layers) > 4 or min(self.resnet_layers, default=1) < 1:
            raise ValueError(f"hybrid backbone needs 0 to 4 stages of >= 1 unit, got {self.resnet_layers}")
        if self.vit.img_size % (self.stride * self.vit.patch_size):
            raise ValueError(
                f"img_size {self.vit.img_size} is not divisible by the hybrid's total stride "
                f"{self.stride * self.vit.patch_size}"
            )

    @property
    def stride(self) -> int:  # root (conv /2, max-pool /2) and one factor 2 per stage after the first
        return 4 * 2 ** max(len(self.resnet_layers) - 1, 0)


ModelConfig = ViTConfig | ResNetConfig | HybridConfig

# Table 1: (hidden_size D, depth L, mlp_dim, num_heads k)
VIT_SIZES: dict[str, tuple[int, int, int, int]] = {
    "ti": (192, 12, 768, 3),  # ViT-Tiny (Steiner et al. 2021, released with the official code)
    "s": (384, 12, 1536, 6),  # ViT-Small (idem)
    "b": (768, 12, 3072, 12),  # ViT-Base, 86M
    "l": (1024, 24, 4096, 16),  # ViT-Large, 307M
    "h": (1280, 32, 5120, 16),  # ViT-Huge, 632M
}
PATCH_SIZES = (8, 14, 16, 32)


def _vit(size: str, patch: int) -> ViTConfig:
    hidden, depth, mlp, heads = VIT_SIZES[size]
    img = 224 if 224 % patch == 0 else patch * (224 // patch + 1)  # patch 14 -> 224, all others divide 224
    return ViTConfig(hidden_size=hidden, depth=depth, mlp_dim=mlp, num_heads=heads, patch_size=patch, img_size=img)


def _hybrid(size: str, layers: tuple[int, ...], width: int = 1) -> HybridConfig:
    return HybridConfig(vit=dataclasses.replace(_vit(size, 16), patch_size=1), resnet_layers=layers, width_factor=width)


PRESETS: dict[str, ModelConfig] = {
    **{f"vit_{size}{patch}": _vit(size, patch) for size in VIT_SIZES for patch in PATCH_SIZES},
    # Hybrids (Table 6 / official configs): "/16" is option (ii) (3 stages), "/32" option (i) (4 stages).
    "r26_vit_s32": _hybrid("s", (2, 2, 2, 2)),
    "r26_vit_b32": _hybrid("b", (2, 2, 2, 2)),
    "r50_vit_b16": _hybrid("b", (3, 4, 9)),
    "r50_vit_b32": _hybrid("b", (3, 4, 6, 3)),
    "r50_vit_l16": _hybrid("l", (3, 4, 9)),
    "r50_vit_l32": _hybrid("l", (3, 4, 6, 3)),
    # BiT baselines (Sec. 4.1, Table 5 and App. D.5).
    "bit_r50x1": ResNetConfig(layers=(3, 4, 6, 3), width_factor=1),
    "bit_r50x2": ResNetConfig(layers=(3, 4, 6, 3), width_factor=2),
    "bit_r50x3": ResNetConfig(layers=(3, 4, 6, 3), width_factor=3),
    "bit_r101x1": ResNetConfig(layers=(3, 4, 23, 3), width_factor=1),
    "bit_r101x3": ResNetConfig(layers=(3, 4, 23, 3), width_factor=3),
    "bit_r152x1": ResNetConfig(layers=(3, 8, 36, 3), width_factor=1),
    "bit_r152x2": ResNetConfig(layers=(3, 8, 36, 3), width_factor=2),
    "bit_r152x4": ResNetConfig(layers=(3, 8, 36, 3), width_factor=4),
    "bit_r200x3": ResNetConfig(layers=(3, 24, 36, 3), width_factor=3),
}


def with_overrides(config: ModelConfig, **overrides: Any) -> ModelConfig:
    """Return `config` with fields replaced; for a hybrid, ViT fields go to `config.vit`.

    `num_classes`, `img_size` and `in_chans` are accepted for every family.  Unknown names raise.
    """
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if isinstance(config, HybridConfig):
        own = {k: overrides.pop(k) for k in list(overrides) if k in ("resnet_layers", "width_factor")}
        vit = with_overrides(config.vit, **overrides) if overrides else config.vit
        return dataclasses.replace(config, vit=vit, **own)
    names = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} for {type(config).__name__}; valid: {sorted(names)}")
    return dataclasses.replace(config, **overrides)


def config_to_dict(config: ModelConfig) -> dict[str, Any]:
    """JSON-ready dict with a "family" tag; inverse of `config_from_dict`."""
    family = {ViTConfig: "vit", ResNetConfig: "resnet", HybridConfig: "hybrid"}[type(config)]
    out = dataclasses.asdict(config)
    return {"family": family, **out}


def config_from_dict(data: dict[str, Any]) -> ModelConfig:
    """Rebuild a config from `config_to_dict` output; unknown fields raise a clear error."""
    data = dict(data)
    family = data.pop("family", "vit")
    try:
        if family == "vit":
            return ViTConfig(**data)
        if family == "resnet":
            return ResNetConfig(**{**data, "layers": tuple(data["layers"])})
        if family == "hybrid":
            vit = ViTConfig(**data.pop("vit"))
            return HybridConfig(vit=vit, **{**data, "resnet_layers": tuple(data["resnet_layers"])})
    except TypeError as err:
        raise ValueError(f"model config does not match vitkit's {family} config: {err}") from None
    raise ValueError(f"unknown model family {family!r} (expected vit, resnet or hybrid)")


def vit_config(config: ViTConfig | HybridConfig) -> ViTConfig:
    """The transformer's fields of a ViT or hybrid config (a hybrid keeps them in `config.vit`)."""
    return config.vit if isinstance(config, HybridConfig) else config


def replace_vit(config: ViTConfig | HybridConfig, **fields: Any) -> ViTConfig | HybridConfig:
    """`config` with transformer fields replaced, inside `config.vit` for a hybrid; None values are set too."""
    if isinstance(config, HybridConfig):
        return dataclasses.replace(config, vit=dataclasses.replace(config.vit, **fields))
    return dataclasses.replace(config, **fields)


def image_size(config: ModelConfig) -> int:
    return config.vit.img_size if isinstance(config, HybridConfig) else config.img_size


def num_classes(config: ModelConfig) -> int:
    return config.vit.num_classes if isinstance(config, HybridConfig) else config.num_classes


def in_channels(config: ModelConfig) -> int:
    return config.vit.in_chans if isinstance(config, HybridConfig) else config.in_chans
