"""What every recipe module builds its configs from: the data group, the tiny test model, the flip rule."""

from __future__ import annotations

from vitkit.data.sources import SourceInfo, mirror_keeps_label
from vitkit.models.configs import ViTConfig
from vitkit.train.config import DataConfig


def data_config(info: SourceInfo, **fields) -> DataConfig:
    """The data group for `info`'s source, normalised as the official code (x / 127.5 - 1) for its channels."""
    norm = (0.5,) * info.channels
    return DataConfig(uri=info.uri, mean=norm, std=norm, **fields)


def tiny_vit(info: SourceInfo, img_size: int = 32, patch_size: int = 8, **fields) -> ViTConfig:
    """The -tiny recipes' model (D=32, L=2, k=2): seconds on a CPU."""
    return ViTConfig(
        img_size=img_size,
        patch_size=patch_size,
        in_chans=info.channels,
        num_classes=info.num_classes,
        hidden_size=32,
        depth=2,
        num_heads=2,
        mlp_dim=64,
        **fields,
    )


def flip(info: SourceInfo) -> bool:
    """Horizontal flips where they keep labels (not digits); the convention (flip) where the source cannot tell."""
    keeps = mirror_keeps_label(info.uri)
    return True if keeps is None else keeps
