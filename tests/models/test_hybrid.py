"""The hybrid (Sec. 3.1): the official ViT code's ResNet as the patch embedding, options (i) and (ii)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from timm_stub import import_timm
from vitkit.models import build_model, create_model
from vitkit.models.configs import HybridConfig, ViTConfig
from vitkit.models.hybrid import Bottleneck, HybridEmbed
from vitkit.models.resnet import StdConv2d, standardize_weight
from vitkit.models.vit import VisionTransformer

TINY_VIT = ViTConfig(img_size=32, patch_size=1, hidden_size=32, depth=1, num_heads=2, mlp_dim=64, num_classes=5)
TINY = HybridConfig(vit=TINY_VIT, resnet_layers=(1, 1))  # stride 4 * 2 = 8: 4x4 tokens at 32 px


def tiny(**vit_overrides) -> VisionTransformer:
    vit = ViTConfig(**{**TINY_VIT.__dict__, **vit_overrides})
    return build_model(HybridConfig(vit=vit, resnet_layers=TINY.resnet_layers)).eval()


@pytest.mark.parametrize(
    "name, option_tokens, stride, channels",
    [("r50_vit_b32", 49, 32, 2048), ("r50_vit_b16", 196, 16, 1024), ("r26_vit_s32", 49, 32, 2048)],
)
def test_sequence_length_at_224(name, option_tokens, stride, channels):
    """Option (i), four stages: 7x7 = 49 tokens; option (ii), three stages (3, 4, 9): 14x14 = 196 tokens."""
    with torch.device("meta"), torch.no_grad():
        model = create_model(name)
        embed = model.patch_embed
        assert isinstance(embed, HybridEmbed) and embed.stride == stride and embed.backbone.num_features == channels
        tokens, grid = embed(torch.empty(2, 3, 224, 224))
        assert tokens.shape == (2, option_tokens, model.encoder_config.hidden_size)
        assert grid == (224 // stride,) * 2
        assert model.pos_embed.shape[1] == 1 + option_tokens


def test_root_only_hybrid_has_stride_four():
    """Official R+ViT-Ti/16: no stages, 8x8 patches on the root's stride-4 map -> stride 32, 7x7 tokens at 224 px."""
    config = HybridConfig(vit=ViTConfig(patch_size=8, hidden_size=192, num_heads=3, mlp_dim=768), resnet_layers=())
    with torch.device("meta"), torch.no_grad():
        embed = HybridEmbed(config)
        tokens, grid = embed(torch.empty(1, 3, 224, 224))
    assert config.stride == 4 and embed.stride == 32 and embed.backbone.num_features == 64
    assert tokens.shape == (1, 49, 192) and grid == (7, 7)


def test_patch_size_on_the_feature_map_multiplies_the_stride():
    config = HybridConfig(vit=ViTConfig(patch_size=2, img_size=224), resnet_layers=(3, 4, 9))
    with torch.device("meta"):
        embed = HybridEmbed(config)
    assert embed.stride == 32 and embed.proj.kernel_size == (2, 2) and embed.proj.stride == (2, 2)


def test_tiny_hybrid_forward_and_resolution_change():
    model = tiny()
    torch.nn.init.normal_(model.head.weight)
    x = torch.randn(2, 3, 32, 32)
    assert model(x).shape == (2, 5)
    named = model.forward_intermediates(torch.randn(2, 3, 48, 48), attention_layers=[0])
    assert named["embed"].shape == (2, 1 + 36, 32)  # 6x6 tokens, E_pos resampled from 4x4
    with pytest.raises(ValueError, match="resize or crop"):
        model(torch.randn(1, 3, 36, 36))


def test_the_builder_gives_the_stem_and_config_stays_the_hybrids():
    model = tiny(representation_size=8)
    assert isinstance(model.patch_embed, HybridEmbed) and isinstance(model.config, HybridConfig)
    assert model.encoder_config is model.config.vit and model.encoder_config.representation_size == 8
    model.reset_head(3)  # Sec. 3.2: the head's fields change inside config.vit, the ResNet fields stay
    assert isinstance(model.config, HybridConfig) and model.config.resnet_layers == TINY.resnet_layers
    assert model.encoder_config.num_classes == 3 and model.encoder_config.representation_size is None
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 3)
    with pytest.raises(ValueError, match="build_model"):  # a HybridConfig alone names no stem
        VisionTransformer(TINY)


@pytest.mark.parametrize("size", [31, 32, 33, 34])
def test_same_padding_sizes_through_the_root(size):
    """Conv 7x7/2 then max-pool 3x3/2, both "SAME": ceil(ceil(n / 2) / 2) for odd and even n."""
    stem = tiny().patch_embed.backbone.stem
    x = torch.randn(1, 3, size, size)
    assert stem.conv(x).shape[-1] == math.ceil(size / 2)
    assert stem(x).shape[-1] == math.ceil(math.ceil(size / 2) / 2)


def test_root_conv_pads_asymmetrically_and_standardises_as_the_official_code():
    conv = tiny().patch_embed.backbone.stem.conv
    x = torch.randn(1, 3, 16, 16)  # total padding 5: 2 before, 3 after, as TF "SAME"
    w = conv.weight
    official = (w - w.mean(dim=(1, 2, 3), keepdim=True)) / (w.std(dim=(1, 2, 3), keepdim=True, unbiased=False) + 1e-5)
    torch.testing.assert_close(conv(x), F.conv2d(F.pad(x, (2, 3, 2, 3)), official, stride=2))


def test_numerics_constants():
    model = tiny()
    convs = [m for m in model.patch_embed.backbone.modules() if isinstance(m, StdConv2d)]
    norms = [m for m in model.patch_embed.backbone.modules() if isinstance(m, torch.nn.GroupNorm)]
    assert convs and all(c.same and c.eps == 1e-5 and c.eps_on == "std" for c in convs)
    assert norms and all(n.eps == 1e-6 and n.num_groups == 32 for n in norms)


def test_units_start_as_their_shortcut():
    """gn3 scale starts at zero (models_resnet.py), so at init a unit is relu(shortcut)."""
    model = tiny()
    stages = model.patch_embed.backbone.stages
    first, kept = stages[0].blocks[0], Bottleneck(256, 256).eval()
    x = torch.randn(2, 64, 8, 8)
    assert torch.equal(first.norm3.weight, torch.zeros(256))
    torch.testing.assert_close(first(x), F.relu(first.downsample(x)))
    y = torch.randn(2, 256, 4, 4)
    assert kept.downsample is None
    torch.testing.assert_close(kept(y), F.relu(y))


def test_bottleneck_equals_hand_computation():
    unit = Bottleneck(64, 256, stride=2).eval()
    with torch.no_grad():
        for module in unit.modules():
            if isinstance(module, torch.nn.GroupNorm):
                module.weight.normal_()
                module.bias.normal_()
    x = torch.randn(1, 64, 8, 8)

    def conv(t, module, kernel=1, stride=1):
        pad = (0, 0, 0, 0) if kernel == 1 else (0, 1, 0, 1) if stride == 2 else (1, 1, 1, 1)  # SAME at 8 px
        return F.conv2d(F.pad(t, pad), standardize_weight(module.weight, 1e-5, "std"), stride=stride)

    def gn(t, norm):
        return F.group_norm(t, 32, norm.weight, norm.bias, 1e-6)

    shortcut = gn(conv(x, unit.downsample.conv, 1, 2), unit.downsample.norm)  # conv_proj reads the unit's input
    y = F.relu(gn(conv(x, unit.conv1), unit.norm1))
    y = F.relu(gn(conv(y, unit.conv2, 3, 2), unit.norm2))  # stride on the 3x3 conv
    y = gn(conv(y, unit.conv3), unit.norm3)
    torch.testing.assert_close(unit(x), F.relu(shortcut + y))


def test_reset_parameters_reaches_the_backbone():
    model = tiny()
    block = model.patch_embed.backbone.stages[1].blocks[0]
    with torch.no_grad():
        block.norm3.weight.fill_(3.0)
        model.patch_embed.proj.bias.fill_(1.0)
    model.reset_parameters()
    assert torch.equal(block.norm3.weight, torch.zeros_like(block.norm3.weight))
    assert torch.equal(model.patch_embed.proj.bias, torch.zeros(32))
    fan_in = model.patch_embed.proj.weight[0].numel()
    assert abs(model.patch_embed.proj.weight.std().item() * math.sqrt(fan_in) - 1) < 0.05  # LeCun normal


def test_timm_hybrid_names():
    keys = set(tiny().state_dict())
    expected = {
        "patch_embed.backbone.stem.conv.weight",
        "patch_embed.backbone.stem.norm.weight",
        "patch_embed.backbone.stages.0.blocks.0.conv1.weight",
        "patch_embed.backbone.stages.0.blocks.0.norm3.bias",
        "patch_embed.backbone.stages.0.blocks.0.downsample.conv.weight",
        "patch_embed.backbone.stages.0.blocks.0.downsample.norm.weight",
        "patch_embed.backbone.stages.1.blocks.0.conv2.weight",
        "patch_embed.proj.weight",
        "patch_embed.proj.bias",
        "cls_token",
        "pos_embed",
    }
    assert expected <= keys


@pytest.mark.parametrize("in_chans", [1, 13])
def test_grayscale_and_multispectral_inputs(in_chans):
    model = tiny(in_chans=in_chans)
    assert model.patch_embed.backbone.stem.conv.weight.shape == (64, in_chans, 7, 7)
    assert model.forward_features(torch.randn(2, in_chans, 32, 32)).shape == (2, 32)


def test_eval_output_does_not_depend_on_the_batch():
    model = tiny()
    x = torch.randn(3, 3, 32, 32)
    together = model.forward_features(x)
    # Batched and single-image convolutions sum in different orders across threads: fp32 rounding only.
    torch.testing.assert_close(model.forward_features(x[1:2])[0], together[1], atol=1e-5, rtol=1e-4)


def test_matches_timm_hybrid():
    """timm's R26+ViT-S/32 (random init) with our weights; eps set to timm's; skipped where timm does not import."""
    timm = import_timm("timm")
    reference = timm.create_model("vit_small_r26_s32_224", pretrained=False, img_size=64, num_classes=5).eval()
    model = create_model("r26_vit_s32", img_size=64, num_classes=5, gelu="exact").eval()
    for module in model.modules():  # timm: WS / sqrt(var + 1e-8), GroupNorm eps 1e-5
        if isinstance(module, StdConv2d):
            module.eps, module.eps_on = 1e-8, "variance"
        elif isinstance(module, torch.nn.GroupNorm):
            module.eps = 1e-5
    state = reference.state_dict()
    assert set(state) == set(model.state_dict())
    model.load_state_dict({k: v.reshape(model.state_dict()[k].shape) for k, v in state.items()})
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), atol=1e-5, rtol=1e-4)
