"""Presets and configs: golden parameter counts for every preset, official where the official code has one."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import pytest
import torch

from vitkit.models import build_model, create_model, preset_config
from vitkit.models.configs import (
    PRESETS,
    ConfigError,
    HybridConfig,
    ResNetConfig,
    ViTConfig,
    config_from_dict,
    config_to_dict,
    with_overrides,
)

GOLDEN = json.loads((Path(__file__).parents[1] / "golden" / "param_counts.json").read_text())["presets"]

# google-research/vision_transformer, vit_jax/models_test.py MODEL_SIZES (1000 classes, 224 px).
OFFICIAL = {
    "vit_ti16": 5_717_416,  # ViT-Ti_16
    "vit_s16": 22_050_664,  # ViT-S_16
    "vit_s32": 22_878_952,  # ViT-S_32
    "vit_b8": 86_576_872,  # ViT-B_8
    "vit_b16": 86_567_656,  # ViT-B_16
    "vit_b32": 88_224_232,  # ViT-B_32
    "vit_l16": 304_326_632,  # ViT-L_16
    "vit_l32": 306_535_400,  # ViT-L_32
    "vit_h14": 632_045_800,  # ViT-H_14
    "r26_vit_s32": 36_431_912,  # R26+ViT-S_32
    "r26_vit_b32": 101_383_976,  # R26+ViT-B_32
    "r50_vit_b16": 98_659_112,  # R50+ViT-B_16
    "r50_vit_l32": 328_994_856,  # R50+ViT-L_32
}
# Official variants that are a preset with overrides (models_test.py names in the comments).
OFFICIAL_VARIANTS = [
    ("vit_b16", {"pool": "gap"}, 86_566_120),  # ViT-B_16-gap-norep
    ("vit_b32", {"pool": "gap"}, 88_222_696),  # ViT-B_32-gap-norep
    ("vit_s16", {"pool": "gap"}, 22_049_896),  # ViT-S_16-gap-norep
    ("vit_s32", {"pool": "gap"}, 22_878_184),  # ViT-S_32-gap-norep
    # "testing": D=10, MLP 10, k=2, L=1, /16
    ("vit_b16", {"hidden_size": 10, "mlp_dim": 10, "num_heads": 2, "depth": 1}, 21_390),
    # R+ViT-Ti_16: the ResNet root alone (no stages) and 8x8 patches on its stride-4 map (49 tokens at 224 px)
    (
        "r26_vit_s32",
        {"hidden_size": 192, "mlp_dim": 768, "num_heads": 3, "patch_size": 8, "resnet_layers": ()},
        6_337_704,
    ),
]
# timm 1.0.31 BiT models built with random init (resnetv2_{50x1,50x3,101x1,101x3,152x2,152x4}_bit).
TIMM_BIT = {
    "bit_r50x1": 25_549_352,
    "bit_r50x3": 217_319_080,
    "bit_r101x1": 44_541_480,
    "bit_r101x3": 387_934_888,
    "bit_r152x2": 236_335_208,
    "bit_r152x4": 936_533_224,
}


@functools.cache
def count_params(config) -> int:
    with torch.device("meta"):  # no memory, no init arithmetic: instant even for ViT-H
        return sum(p.numel() for p in build_model(config).parameters())


def vit_closed_form(c: ViTConfig) -> int:
    """Independent count: patch embedding, [class], E_pos, L blocks, final LN, head (learned 1D E_pos only)."""
    d, m = c.hidden_size, c.mlp_dim
    patches = (c.img_size // c.patch_size) ** 2
    tokens = patches + (c.pool == "token")
    block = (4 * d * d + 4 * d) + (2 * d * m + m + d) + 2 * 2 * d  # attention (q, k, v, out), MLP, 2 LayerNorms
    return (
        c.patch_size**2 * c.in_chans * d
        + d
        + (c.pool == "token") * d
        + tokens * d
        + c.depth * block
        + 2 * d
        + (d + 1) * c.num_classes
    )


def bottleneck_closed_form(cin: int, cout: int, projection: bool, norm_out: bool) -> int:
    """A bottleneck unit: three bias-free convs and GroupNorms, plus the projection (with a GN for the ViT code's
    unit)."""
    mid = cout // 4
    convs = cin * mid + 9 * mid * mid + mid * cout + (cin * cout if projection else 0)
    if norm_out:  # post-activation (hybrid): GN after conv1, conv2, conv3 and the projection
        norms = 2 * (2 * mid + cout + (cout if projection else 0))
    else:  # pre-activation (BiT): GN before conv1, conv2, conv3
        norms = 2 * (cin + 2 * mid)
    return convs + norms


def resnet_stages_closed_form(layers, width: int, norm_out: bool) -> tuple[int, int]:
    total, channels = 0, width
    for index, depth in enumerate(layers):
        out = 4 * width * 2**index
        for j in range(depth):
            cin = channels if j == 0 else out
            total += bottleneck_closed_form(cin, out, cin != out or (j == 0 and index > 0), norm_out)
        channels = out
    return total, channels


def test_every_preset_has_a_golden_count():
    assert set(PRESETS) == set(GOLDEN), "add the new preset's parameter count to tests/golden/param_counts.json"


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_param_count_is_golden(name):
    assert count_params(PRESETS[name]) == GOLDEN[name]["params"]


@pytest.mark.parametrize("name", list(OFFICIAL))
def test_official_param_counts(name):
    assert GOLDEN[name]["params"] == OFFICIAL[name]
    assert count_params(PRESETS[name]) == OFFICIAL[name]


@pytest.mark.parametrize("name, overrides, expected", OFFICIAL_VARIANTS)
def test_official_variant_param_counts(name, overrides, expected):
    assert count_params(preset_config(name, **overrides)) == expected


@pytest.mark.parametrize("name", list(TIMM_BIT))
def test_bit_param_counts_match_timm(name):
    assert count_params(PRESETS[name]) == TIMM_BIT[name]


@pytest.mark.parametrize("name", [n for n, c in PRESETS.items() if isinstance(c, ViTConfig)])
def test_vit_counts_match_closed_form(name):
    config = PRESETS[name]
    assert count_params(config) == vit_closed_form(config)
    for variant in (dict(num_classes=10, img_size=2 * config.img_size), dict(pool="gap", in_chans=1)):
        changed = with_overrides(config, **variant)
        assert count_params(changed) == vit_closed_form(changed)


@pytest.mark.parametrize("name", [n for n, c in PRESETS.items() if isinstance(c, HybridConfig)])
def test_hybrid_counts_match_closed_form(name):
    config = PRESETS[name]
    vit, width = config.vit, 64 * config.width_factor
    stages, channels = resnet_stages_closed_form(config.resnet_layers, width, norm_out=True)
    stem = 49 * vit.in_chans * width + 2 * width  # 7x7 root conv + its GroupNorm
    # The ViT part is a ViT whose "patch embedding" reads `channels` feature maps at stride `config.stride`.
    as_vit = dataclasses.replace(vit, in_chans=channels, img_size=vit.img_size // config.stride)
    assert count_params(config) == stem + stages + vit_closed_form(as_vit)


@pytest.mark.parametrize("name", [n for n, c in PRESETS.items() if isinstance(c, ResNetConfig)])
def test_bit_counts_match_closed_form(name):
    config = PRESETS[name]
    width = 64 * config.width_factor
    stages, channels = resnet_stages_closed_form(config.layers, width, norm_out=False)
    stem = 49 * config.in_chans * width  # BiT's root has no norm: the first unit pre-activates
    assert count_params(config) == stem + stages + 2 * channels + (channels + 1) * config.num_classes


def test_table1_rounding():
    """Table 1 lists Base 86M, Large 307M, Huge 632M: B/16 and H/14 truncated to millions.

    The official ViT-L/16 has 304.3M (OFFICIAL above), so the table's 307M is not the released L/16;
    the nearest count is ViT-L/32's 306.5M.
    """
    assert GOLDEN["vit_b16"]["params"] // 10**6 == 86
    assert GOLDEN["vit_h14"]["params"] // 10**6 == 632
    assert GOLDEN["vit_l16"]["params"] // 10**6 == 304
    assert round(GOLDEN["vit_l32"]["params"] / 1e6) == 307


def test_table1_sizes():
    expected = {
        "ti": (192, 12, 768, 3),
        "s": (384, 12, 1536, 6),
        "b": (768, 12, 3072, 12),
        "l": (1024, 24, 4096, 16),
        "h": (1280, 32, 5120, 16),
    }
    for size, (hidden, depth, mlp, heads) in expected.items():
        c = PRESETS[f"vit_{size}16"]
        assert (c.hidden_size, c.depth, c.mlp_dim, c.num_heads) == (hidden, depth, mlp, heads)


def test_hybrid_presets_are_options_i_and_ii():
    assert PRESETS["r50_vit_b16"].resnet_layers == (3, 4, 9) and PRESETS["r50_vit_b16"].stride == 16  # option (ii)
    assert PRESETS["r50_vit_b32"].resnet_layers == (3, 4, 6, 3) and PRESETS["r50_vit_b32"].stride == 32  # option (i)
    assert PRESETS["r26_vit_b32"].resnet_layers == (2, 2, 2, 2)


def test_an_img_size_below_the_patch_size_suggests_positive_multiples():
    with pytest.raises(ValueError) as refused:
        ViTConfig(img_size=4, patch_size=8)
    assert str(refused.value) == "img_size 4 is not divisible by patch_size 8: use 8 or 16"


def test_config_validation_messages():
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        ViTConfig(hidden_size=30, num_heads=4)
    with pytest.raises(ValueError, match="use 224 or 240"):
        ViTConfig(img_size=230, patch_size=16)
    with pytest.raises(ValueError, match="dropout"):
        ViTConfig(dropout=1.0)
    with pytest.raises(ValueError, match="0 to 4 stages"):
        HybridConfig(resnet_layers=(1, 1, 1, 1, 1))
    with pytest.raises(ValueError, match="0 to 4 stages"):
        HybridConfig(resnet_layers=(3, 0, 2))
    with pytest.raises(ValueError, match="total stride 16"):
        HybridConfig(vit=ViTConfig(patch_size=1, img_size=200), resnet_layers=(3, 4, 9))
    with pytest.raises(ValueError, match="bad ResNet layers"):
        ResNetConfig(layers=())


def test_overrides_and_unknown_fields():
    c = preset_config("r50_vit_b16", num_classes=10, img_size=384, width_factor=2)
    assert (c.vit.num_classes, c.vit.img_size, c.width_factor, c.vit.patch_size) == (10, 384, 2, 1)
    assert preset_config("bit_r50x1", num_classes=5).num_classes == 5
    with pytest.raises(ValueError, match="unknown field"):
        with_overrides(PRESETS["vit_b16"], hidden=3)
    with pytest.raises(ValueError, match="unknown model 'vit_q16'"):
        create_model("vit_q16")
    with pytest.raises(ValueError, match=r"unknown model 'vit_b17'; e\.g\. \['vit_b16', "):  # the closest first
        create_model("vit_b17")


@pytest.mark.parametrize("name", ["vit_b16", "r50_vit_b16", "bit_r50x1"])
def test_config_dict_round_trip(name):
    config = with_overrides(PRESETS[name], num_classes=7)
    data = json.loads(json.dumps(config_to_dict(config)))  # through JSON: tuples become lists
    assert config_from_dict(data) == config
    with pytest.raises(ValueError, match="does not match"):
        config_from_dict({**data, "bogus": 1})


@pytest.mark.parametrize(
    "field, value, problem",
    [
        ("depth", 1_000_000, r"depth must be an integer in \[1, 1024\], got 1000000"),
        ("depth", -3, r"depth must be an integer in \[1, 1024\], got -3"),
        ("hidden_size", 3_000_000, r"hidden_size must be an integer in \[1, 65536\], got 3000000"),
        ("hidden_size", "192", r"hidden_size must be an integer in \[1, 65536\], got '192'"),
        ("hidden_size", 192.0, r"hidden_size must be an integer in \[1, 65536\], got 192.0"),
        ("num_heads", True, r"num_heads must be an integer in \[1, 65536\], got True"),
        ("representation_size", 0, r"representation_size must be null or an integer in \[1, 65536\], got 0"),
        ("layer_norm_eps", float("nan"), r"layer_norm_eps must be a finite number in \(0, 1\], got nan"),
        ("layer_norm_eps", 0.0, r"layer_norm_eps must be a finite number in \(0, 1\], got 0.0"),
        ("dropout", float("inf"), r"dropout must be a finite number in \[0, 1\), got inf"),
        ("dropout", "0.1", r"dropout must be a finite number in \[0, 1\), got '0.1'"),
        ("pool", "max", r"pool must be one of \['token', 'gap'\], got 'max'"),
        ("gelu", ["tanh"], r"gelu must be one of \['tanh', 'exact'\], got \['tanh'\]"),
        ("qkv_bias", 1, r"qkv_bias must be true or false, got 1"),
    ],
)
def test_vit_config_fields_are_checked_by_type_and_range(field, value, problem):
    with pytest.raises(ConfigError, match=problem) as caught:
        ViTConfig(**{field: value})
    assert caught.value.field == field


def test_nested_and_resnet_fields_are_named():
    vit = config_to_dict(PRESETS["r50_vit_b16"])
    vit["vit"]["depth"] = 0
    with pytest.raises(ConfigError, match=r"^vit\.depth must be an integer in \[1, 1024\], got 0$"):
        config_from_dict(vit)
    with pytest.raises(ConfigError, match=r"layers must be a list of 1 to 4 integers in \[1, 256\], got \[3, '4'\]"):
        ResNetConfig(layers=[3, "4"])
    with pytest.raises(ConfigError, match=r"width_factor must be an integer in \[1, 64\], got 1000"):
        HybridConfig(width_factor=1000)
    with pytest.raises(ValueError, match="must be an object"):
        config_from_dict(["vit"])
    with pytest.raises(ValueError, match="vit must be an object"):
        config_from_dict({"family": "hybrid", "vit": 3})
    assert ResNetConfig(layers=[2, 2]).layers == (2, 2)  # a JSON list becomes the tuple presets use


def test_numpy_integers_are_integers():
    import numpy as np

    config = ViTConfig(depth=np.int64(3), hidden_size=np.int32(64), num_heads=2)
    assert type(config.depth) is int and json.loads(json.dumps(config_to_dict(config)))["hidden_size"] == 64
