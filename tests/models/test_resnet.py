"""BiT ResNet-v2 and the shared pieces: weight standardisation, TF "SAME" padding, pre-activation units."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from timm_stub import import_timm
from vitkit.models import create_model
from vitkit.models.configs import ResNetConfig
from vitkit.models.resnet import (
    MaxPool2dSame,
    PreActBottleneck,
    ResNetV2,
    StdConv2d,
    pad_same,
    same_padding,
    standardize_weight,
)

TINY = ResNetConfig(layers=(1, 1), width_factor=1, img_size=32, num_classes=10)


def tiny(**overrides) -> ResNetV2:
    return ResNetV2(ResNetConfig(**{**TINY.__dict__, **overrides})).eval()


# ---------------------------------------------------------------- weight standardisation


@pytest.mark.parametrize("eps_on", ["variance", "std"])
def test_weight_standardisation_gives_zero_mean_unit_std_kernels(eps_on):
    weight = 3.0 + 0.5 * torch.randn(16, 8, 3, 3)
    out = standardize_weight(weight, eps=1e-10, eps_on=eps_on).reshape(16, -1)
    torch.testing.assert_close(out.mean(dim=1), torch.zeros(16), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.std(dim=1, unbiased=False), torch.ones(16), atol=1e-5, rtol=0)


def test_weight_standardisation_formulas_match_numpy():
    weight = torch.randn(4, 3, 2, 2) * 0.01  # small weights make the two eps placements differ visibly
    w = weight.double().numpy().reshape(4, -1)
    centred = w - w.mean(axis=1, keepdims=True)
    bit = centred / np.sqrt(w.var(axis=1, keepdims=True) + 1e-5)  # big_transfer: / sqrt(var + eps)
    vit = centred / (w.std(axis=1, keepdims=True) + 1e-5)  # models_resnet.weight_standardize: / (std + eps)
    got_bit = standardize_weight(weight.double(), 1e-5, "variance").reshape(4, -1).numpy()
    got_vit = standardize_weight(weight.double(), 1e-5, "std").reshape(4, -1).numpy()
    np.testing.assert_allclose(got_bit, bit, rtol=1e-12)
    np.testing.assert_allclose(got_vit, vit, rtol=1e-12)
    assert np.abs(got_bit - got_vit).max() > 1e-4


# ---------------------------------------------------------------- TF "SAME" padding


@pytest.mark.parametrize(
    "size, kernel, stride, pads",
    [
        (224, 7, 2, (2, 3)),  # the root conv at 224 px: TF puts the odd pixel after
        (225, 7, 2, (3, 3)),
        (112, 3, 2, (0, 1)),  # the root max-pool at 224 px
        (113, 3, 2, (1, 1)),
        (56, 1, 2, (0, 0)),  # strided 1x1 projection: no padding
        (57, 3, 1, (1, 1)),
        (5, 7, 2, (3, 3)),
    ],
)
def test_same_padding_golden(size, kernel, stride, pads):
    assert same_padding(size, kernel, stride) == pads


@pytest.mark.parametrize("size", [7, 8, 9, 10, 15, 16])
@pytest.mark.parametrize("kernel, stride", [(7, 2), (3, 2), (3, 1), (1, 2)])
def test_same_output_is_ceil_of_size_over_stride(size, kernel, stride):
    x = torch.randn(1, 2, size, size + 1)  # odd and even sides at once
    conv = StdConv2d(2, 4, kernel, stride, padding="same")
    expected = (math.ceil(size / stride), math.ceil((size + 1) / stride))
    assert conv(x).shape[-2:] == expected
    assert MaxPool2dSame(kernel, stride)(x).shape[-2:] == expected


def test_same_conv_equals_conv_on_asymmetrically_padded_input():
    conv = StdConv2d(3, 8, 7, 2, padding="same", eps=1e-5, eps_on="std")
    x = torch.randn(2, 3, 16, 16)
    manual = F.conv2d(F.pad(x, (2, 3, 2, 3)), standardize_weight(conv.weight, 1e-5, "std"), stride=2)
    torch.testing.assert_close(conv(x), manual)
    assert torch.equal(pad_same(x, 7, 2), F.pad(x, (2, 3, 2, 3)))


def test_same_max_pool_pads_with_minus_infinity():
    x = torch.full((1, 1, 4, 4), -5.0)  # zero padding would put 0 on the bottom/right border
    assert torch.equal(MaxPool2dSame(3, 2)(x), torch.full((1, 1, 2, 2), -5.0))


# ---------------------------------------------------------------- BiT units and model


def test_preact_unit_equals_hand_computation():
    """BiT: relu(GN) first; the projection reads the pre-activation; stride on the 3x3 conv."""
    unit = PreActBottleneck(64, 256, stride=2).eval()
    with torch.no_grad():
        for norm in (unit.norm1, unit.norm2, unit.norm3):
            norm.weight.normal_()
            norm.bias.normal_()
    x = torch.randn(2, 64, 8, 8)

    def conv(t, module, stride=1, padding=0):
        return F.conv2d(t, standardize_weight(module.weight, 1e-10), stride=stride, padding=padding)

    pre = F.relu(F.group_norm(x, 32, unit.norm1.weight, unit.norm1.bias, 1e-5))
    shortcut = conv(pre, unit.downsample.conv, stride=2)
    y = conv(pre, unit.conv1)
    y = conv(F.relu(F.group_norm(y, 32, unit.norm2.weight, unit.norm2.bias, 1e-5)), unit.conv2, stride=2, padding=1)
    y = conv(F.relu(F.group_norm(y, 32, unit.norm3.weight, unit.norm3.bias, 1e-5)), unit.conv3)
    torch.testing.assert_close(unit(x), y + shortcut)
    assert PreActBottleneck(256, 256).downsample is None  # identity shortcut when shape is kept


def test_bit_stage_shapes_at_224_and_odd_sizes():
    with torch.device("meta"), torch.no_grad():
        model = create_model("bit_r50x1").eval()
        named = model.forward_intermediates(torch.empty(1, 3, 224, 224))
        assert named["stem"].shape == (1, 64, 56, 56)
        assert [named[f"stage{i}"].shape[1:] for i in range(1, 5)] == [
            (256, 56, 56),
            (512, 28, 28),
            (1024, 14, 14),
            (2048, 7, 7),
        ]
        assert named["pre_logits"].shape == (1, 2048) and named["logits"].shape == (1, 1000)
        # 225 px: conv (225 + 6 - 7) // 2 + 1 = 113, zero-pad to 115, pool (115 - 3) // 2 + 1 = 57
        assert model.stem(torch.empty(1, 3, 225, 225)).shape == (1, 64, 57, 57)


def test_tiny_forward_features_and_zero_head():
    model = tiny()
    x = torch.randn(3, 3, 32, 32)
    features = model.forward_features(x)
    assert features.shape == (3, 512) and model.num_features == 512
    assert (features >= 0).all()  # GN + ReLU before pooling
    assert torch.equal(model(x), torch.zeros(3, 10))
    named = model.forward_intermediates(x)
    torch.testing.assert_close(named["pre_logits"], features)


def test_reset_head():
    model = tiny()
    torch.nn.init.normal_(model.head.fc.weight)
    model.reset_head(4)
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(model(x), torch.zeros(2, 4)) and model.config.num_classes == 4
    model.reset_head(0)
    torch.testing.assert_close(model(x), model.forward_features(x))


def test_eval_output_does_not_depend_on_the_batch():
    model = tiny()
    x = torch.randn(4, 3, 32, 32)
    together = model.forward_features(x)
    torch.testing.assert_close(model.forward_features(x[2:3])[0], together[2], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("in_chans", [1, 13])
def test_grayscale_and_multispectral_inputs(in_chans):
    model = tiny(in_chans=in_chans)
    assert model.stem.conv.weight.shape == (64, in_chans, 7, 7)
    assert model.forward_features(torch.randn(2, in_chans, 40, 24)).shape == (2, 512)


def test_init_and_timm_names():
    model = tiny()
    keys = set(model.state_dict())
    expected = {
        "stem.conv.weight",
        "stages.0.blocks.0.norm1.weight",
        "stages.0.blocks.0.conv2.weight",
        "stages.0.blocks.0.downsample.conv.weight",
        "stages.1.blocks.0.conv3.weight",
        "norm.weight",
        "head.fc.weight",
        "head.fc.bias",
    }
    assert expected <= keys
    for module in model.modules():
        if isinstance(module, torch.nn.GroupNorm):
            assert module.num_groups == 32 and module.eps == 1e-5
            assert torch.equal(module.weight, torch.ones_like(module.weight))
    conv2 = model.stages[1].blocks[0].conv2.weight  # LeCun normal: std 1/sqrt(fan_in)
    assert abs(conv2.std().item() * math.sqrt(128 * 9) - 1) < 0.05


def test_matches_timm_resnetv2_bit():
    """Same weights in timm's BiT ResNetV2 (random init) give the same logits; skipped where timm does not import."""
    timm_resnetv2 = import_timm("timm.models.resnetv2")
    from functools import partial

    TimmStdConv2d = timm_resnetv2.StdConv2d

    reference = timm_resnetv2.ResNetV2(
        layers=(2, 1, 1), num_classes=7, stem_type="fixed", conv_layer=partial(TimmStdConv2d, eps=1e-8)
    ).eval()
    model = tiny(layers=(2, 1, 1), num_classes=7)
    state = reference.state_dict()
    assert set(state) == set(model.state_dict())
    model.load_state_dict({k: v.reshape(model.state_dict()[k].shape) for k, v in state.items()})  # head.fc: 1x1 conv
    x = torch.randn(2, 3, 67, 50)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), atol=1e-5, rtol=1e-4)  # WS eps 1e-10 vs timm's 1e-8


def test_reset_head_keeps_the_model_device_and_dtype():
    model = tiny().double()
    model.reset_head(3)
    assert model.head.fc.weight.dtype == torch.float64
    with torch.device("meta"):
        big = create_model("bit_r50x1")
    big.reset_head(10)
    assert big.head.fc.weight.is_meta


def test_a_one_channel_stem_weight_is_laid_out_as_its_gradient():
    """vitkit's batches are permuted from H x W x C (channels-last, the fast layout for a one-channel convolution):
    the stem weight's gradient comes out channels-last, and DDP copies, with a warning, one whose strides differ
    from its parameter's.  The weight is laid out so; its values are the standard layout's."""
    model = tiny(in_chans=1).train()
    x = torch.randn(2, 32, 32, 1).permute(0, 3, 1, 2)  # decoded H x W x 1, then permuted
    model(x).sum().backward()
    weight = model.stem.conv.weight
    assert weight.grad.stride() == weight.stride() == (49, 1, 7, 1)
    plain = tiny(in_chans=1)
    plain.load_state_dict({k: v.contiguous().clone() for k, v in model.state_dict().items()})
    torch.testing.assert_close(plain(x), model.eval()(x), rtol=0, atol=0)
