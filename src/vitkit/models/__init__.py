"""Model families: ViT (vit.py), BiT ResNet (resnet.py), hybrid ResNet + ViT (hybrid.py)."""

from __future__ import annotations

import difflib
from typing import Any

from torch import nn

from vitkit.models.configs import PRESETS, HybridConfig, ModelConfig, ResNetConfig, ViTConfig, with_overrides
from vitkit.models.hybrid import HybridEmbed
from vitkit.models.resnet import ResNetV2
from vitkit.models.vit import VisionTransformer

__all__ = [
    "build_model",
    "create_model",
    "list_models",
    "VisionTransformer",
    "ResNetV2",
    "ViTConfig",
    "ResNetConfig",
    "HybridConfig",
]


def build_model(config: ModelConfig) -> nn.Module:
    """The model a config describes, freshly initialised as the official code does.

    A hybrid is a ViT whose patch embedding is a ResNet stem (Sec. 3.1): the stem is built here and
    given to the ViT, which records the whole HybridConfig as its `config`.
    """
    if isinstance(config, ResNetConfig):
        return ResNetV2(config)
    if isinstance(config, HybridConfig):
        return VisionTransformer(config, patch_embed=HybridEmbed(config))
    return VisionTransformer(config)


def preset_config(
    name: str, num_classes: int | None = None, img_size: int | None = None, **overrides: Any
) -> ModelConfig:
    """A named preset (see `list_models()`) with fields overridden."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=4) or [n for n in PRESETS if n[:4] == name[:4]][:8]
        raise ValueError(f"unknown model {name!r}; e.g. {close or list(PRESETS)[:8]} (vitkit models lists all)")
    return with_overrides(PRESETS[name], num_classes=num_classes, img_size=img_size, **overrides)


def create_model(name: str, num_classes: int | None = None, img_size: int | None = None, **overrides: Any) -> nn.Module:
    """Build a preset, e.g. `create_model("vit_b16", num_classes=10, img_size=384, pool="gap")`."""
    return build_model(preset_config(name, num_classes=num_classes, img_size=img_size, **overrides))


def list_models() -> list[str]:
    return list(PRESETS)
