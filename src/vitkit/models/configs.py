"""Model configurations: one frozen dataclass per family and the named presets of Table 1.

ViT sizes are Table 1 of Dosovitskiy et al. (2021); the numerics (LayerNorm eps 1e-6, tanh GELU)
follow the official google-research/vision_transformer code.  The hybrid backbone follows
`vit_jax/models_resnet.py`; the BiT baseline follows Kolesnikov et al. (2020), "Big Transfer".
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from vitkit.bounds import MAX_CLASSES

Pool = Literal["token", "gap"]
PosEmb = Literal["none", "learned_1d", "learned_2d", "sincos_2d", "relative"]
PosEmbWhere = Literal["input", "per_layer", "shared_per_layer"]
Gelu = Literal["tanh", "exact"]
AttnImpl = Literal["auto", "sdpa", "explicit"]
Init = Literal["official", "mimetic"]
PatchKeep = Literal["random", "content"]

# Ranges of the size fields, generous (ViT-H is L=32, D=1280, 5120 MLP; ImageNet-21k has 21,843 classes):
# they make a config read from a file safe to build on the meta device; the memory limit of
# vitkit.checkpoints.read then refuses the large ones.
MAX_DEPTH, MAX_WIDTH, MAX_MLP, MAX_IMG = 1024, 65536, 262144, 16384
MAX_CHANS, MAX_UNITS, MAX_WIDTH_FACTOR = 4096, 256, 64


class ConfigError(ValueError):
    """A config field of the wrong type or out of range; `field` names it ("vit.depth" inside a hybrid)."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field} {problem}")
        self.field, self.problem = field, problem


def _shown(value: Any) -> str:
    # a config read from a file may hold a megabyte string: messages show its start
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name: str, value: Any, low: int, high: int, *, optional: bool = False) -> None:
    """An integer in [low, high] (None too when `optional`), else a ConfigError naming `name`."""
    if (optional and value is None) or (_integer(value) and low <= value <= high):
        return
    kind = "null or an integer" if optional else "an integer"
    raise ConfigError(name, f"must be {kind} in [{low}, {high}], got {_shown(value)}")


def check_number(
    name: str, value: Any, low: float, high: float, *, open_low: bool = False, open_high: bool = False
) -> None:
    """A finite real number in the interval, else a ConfigError naming `name` (NaN and inf are refused)."""
    real = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if real and (low < value if open_low else low <= value) and (value < high if open_high else value <= high):
        return
    interval = f"{'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
    raise ConfigError(name, f"must be a finite number in {interval}, got {_shown(value)}")


def check_choice(name: str, value: Any, options: tuple[str, ...]) -> None:
    if not (isinstance(value, str) and value in options):
        raise ConfigError(name, f"must be one of {list(options)}, got {_shown(value)}")


def check_units(name: str, value: Any, fewest: int, most: int) -> tuple[int, ...]:
    """Units per stage: a list of `fewest` to `most` integers in [1, MAX_UNITS], returned as a tuple."""
    ok = isinstance(value, (tuple, list)) and fewest <= len(value) <= most
    if not (ok and all(_integer(v) and 1 <= v <= MAX_UNITS for v in value)):
        what = f"a list of {fewest} to {most} integers in [1, {MAX_UNITS}]"
        raise ConfigError(name, f"must be {what}, got {_shown(value)}")
    return tuple(int(v) for v in value)


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
    # PatchDropout lasts until this fraction of the training schedule, then every patch
    patch_dropout_until: float = 1.0
    layer_norm_eps: float = 1e-6  # official code (Flax default); timm 1e-6, HF 1e-12
    gelu: Gelu = "tanh"  # Flax's nn.gelu is the tanh approximation; timm and HF use exact erf
    qkv_bias: bool = True  # official code has biases on q, k, v and out
    # how Eq. 5-7 are computed (same numbers): fused SDPA kernel, softmax spelt out, or auto = explicit for bf16
    # on CPU (measured faster there, benchmarks/compare.py), SDPA elsewhere
    attn_impl: AttnImpl = "auto"
    # "mimetic": attention weights as trained ViTs show them (Trockman & Kolter 2023; an option)
    init: Init = "official"

    def __post_init__(self) -> None:
        self._check_fields()
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.posemb == "learned_2d" and self.hidden_size % 2:
            raise ValueError("learned_2d position embeddings need an even hidden_size (X and Y halves, App. D.4)")
        if self.posemb == "sincos_2d" and self.hidden_size % 4:
            raise ValueError("sincos_2d position embeddings need hidden_size divisible by 4")
        if self.img_size % self.patch_size:
            below = max(self.img_size // self.patch_size, 1) * self.patch_size  # at least one patch (N >= 1)
            raise ValueError(
                f"img_size {self.img_size} is not divisible by patch_size {self.patch_size}: "
                f"use {below} or {below + self.patch_size}"
            )
        if self.patch_dropout and (self.posemb == "relative" or self.posemb_where != "input"):
            raise ValueError(
                "patch_dropout needs position embeddings added once at the input (posemb_where='input', "
                "not relative): the dropped tokens' positions are not tracked further"
            )

    def _check_fields(self) -> None:
        # every field by type and range first: a config read from a file may hold anything
        sizes = {"img_size": (1, MAX_IMG), "patch_size": (1, MAX_IMG), "in_chans": (1, MAX_CHANS),
                 "num_classes": (0, MAX_CLASSES), "hidden_size": (1, MAX_WIDTH), "depth": (1, MAX_DEPTH),
                 "num_heads": (1, MAX_WIDTH), "mlp_dim": (1, MAX_MLP)}  # fmt: skip
        for name, (low, high) in sizes.items():
            check_int(name, getattr(self, name), low, high)
            object.__setattr__(self, name, int(getattr(self, name)))  # numpy integers -> int (JSON-ready)
        check_int("representation_size", self.representation_size, 1, MAX_WIDTH, optional=True)
        for name in ("dropout", "attention_dropout", "drop_path", "patch_dropout"):
            check_number(name, getattr(self, name), 0.0, 1.0, open_high=True)
        check_number("patch_dropout_until", self.patch_dropout_until, 0.0, 1.0)
        check_number("layer_norm_eps", self.layer_norm_eps, 0.0, 1.0, open_low=True)
        choices = {"pool": Pool, "posemb": PosEmb, "posemb_where": PosEmbWhere, "gelu": Gelu, "attn_impl": AttnImpl,
                   "init": Init, "patch_dropout_keep": PatchKeep}  # fmt: skip
        for name, options in choices.items():
            check_choice(name, getattr(self, name), get_args(options))
        if not isinstance(self.qkv_bias, bool):
            raise ConfigError("qkv_bias", f"must be true or false, got {_shown(self.qkv_bias)}")

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
        try:
            object.__setattr__(self, "layers", check_units("layers", self.layers, 1, 4))  # a JSON list -> tuple
        except ConfigError as err:
            raise ConfigError("layers", f"{err.problem} (bad ResNet layers)") from None
        check_int("width_factor", self.width_factor, 1, MAX_WIDTH_FACTOR)
        check_int("img_size", self.img_size, 1, MAX_IMG)
        check_int("in_chans", self.in_chans, 1, MAX_CHANS)
        check_int("num_classes", self.num_classes, 0, MAX_CLASSES)


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
        if not isinstance(self.vit, ViTConfig):
            raise ConfigError("vit", f"must be a ViTConfig, got {type(self.vit).__name__}")
        try:
            object.__setattr__(self, "resnet_layers", check_units("resnet_layers", self.resnet_layers, 0, 4))
        except ConfigError as err:
            raise ConfigError("resnet_layers", f"{err.problem}: the hybrid backbone needs 0 to 4 stages") from None
        check_int("width_factor", self.width_factor, 1, MAX_WIDTH_FACTOR)
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


FAMILIES: dict[str, type] = {"vit": ViTConfig, "resnet": ResNetConfig, "hybrid": HybridConfig}


def config_from_dict(data: dict[str, Any]) -> ModelConfig:
    """Rebuild a config from `config_to_dict` output (JSON); a wrong field raises a ConfigError naming it.

    Any JSON may arrive here (a hand-edited checkpoint): every field is checked by type and range
    before anything uses it.
    """
    if not isinstance(data, dict):
        raise ValueError(f"a model config must be an object of config fields, got {type(data).__name__}")
    data = dict(data)
    family = data.pop("family", "vit")
    if not isinstance(family, str) or family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r} (expected vit, resnet or hybrid)")
    _reject_unknown(FAMILIES[family], data, family)
    if family != "hybrid":
        return FAMILIES[family](**data)
    vit = data.pop("vit", None)
    if not isinstance(vit, dict):
        raise ValueError(f"vit must be an object of ViT config fields, got {type(vit).__name__}")
    _reject_unknown(ViTConfig, vit, "vit")
    try:
        encoder = ViTConfig(**vit)
    except ConfigError as err:
        raise ConfigError(f"vit.{err.field}", err.problem) from None
    return HybridConfig(vit=encoder, **data)


def _reject_unknown(cls: type, data: dict[str, Any], family: str) -> None:
    unknown = sorted(str(k) for k in set(data) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"model config does not match vitkit's {family} config: unknown field(s) {unknown}")


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
