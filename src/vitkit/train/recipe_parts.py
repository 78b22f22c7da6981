"""What every recipe module builds its configs from: the data group, the small and tiny models, Muon, the flip rule."""

from __future__ import annotations

from vitkit.data.sources import SourceInfo, mirror_keeps_label
from vitkit.models.configs import ViTConfig
from vitkit.train.config import DataConfig, OptimConfig


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


def small_vit(info: SourceInfo, img_size: int, patch_size: int, **fields) -> ViTConfig:
    """The small recipes' model: ViT D=192 L=6 k=3 with a 384-wide MLP, GAP, stochastic depth 0.1."""
    return ViTConfig(
        img_size=img_size,
        patch_size=patch_size,
        in_chans=info.channels,
        num_classes=info.num_classes,
        hidden_size=192,
        depth=6,
        num_heads=3,
        mlp_dim=384,
        pool="gap",
        drop_path=0.1,
        **fields,
    )


def small_muon() -> OptimConfig:
    """The small recipes' optimiser: Muon for the encoder's matrices at half AdamW's 4e-3 for the rest, weight
    decay 0.05, gradients clipped at norm 1, 5% warm-up, then a linear decay (Muon's)."""
    return OptimConfig(
        name="muon",
        lr=4e-3,
        muon_lr_scale=0.5,
        weight_decay=0.05,
        schedule="linear",
        warmup_fraction=0.05,
        clip_norm=1.0,
    )


def flip(info: SourceInfo) -> bool:
    """Horizontal flips where they keep labels (not digits); the convention (flip) where the source cannot tell."""
    keeps = mirror_keeps_label(info.uri)
    return True if keeps is None else keeps
