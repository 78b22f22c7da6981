"""BiT ResNet-v2 (Kolesnikov et al. 2020, "Big Transfer"): the paper's CNN baseline (Sec. 4.1, Table 2).

Also the pieces the hybrid (models/hybrid.py) shares with it: weight-standardised convolution,
TF "SAME" padding, a stage of residual units.  Facts from google-research/big_transfer
(`bit_pytorch/models.py`, `bit_jax/models.py`):

- every convolution is weight-standardised per output channel, W <- (W - mean) / sqrt(var + 1e-10);
- GroupNorm with 32 groups and eps 1e-5 wherever BatchNorm would be;
- root: 7x7/2 convolution (padding 3, no norm: the units are pre-activation), zero-pad 1, 3x3/2 max-pool;
- pre-activation bottleneck (He et al. 2016b) with the stride on the 3x3 convolution; the projection
  shortcut reads the pre-activated input GN-ReLU(x);
- stages of width 256·w·2^i (bottleneck width a quarter of that), strides 1, 2, 2, 2;
- a final GroupNorm + ReLU, global average pooling and a zero-initialised dense head.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.models import kernels
from vitkit.models.configs import ResNetConfig
from vitkit.models.posemb import check_images

EpsOn = Literal["variance", "std"]

BIT_WS_EPS = 1e-10  # big_transfer: W / sqrt(var + 1e-10)
BIT_GN_EPS = 1e-5  # big_transfer: GroupNorm eps (PyTorch default, and bit_jax's own GroupNorm)
GN_GROUPS = 32  # Wu & He (2018); BiT and the ViT code use 32 groups everywhere


def standardize_weight(weight: Tensor, eps: float, eps_on: EpsOn = "variance") -> Tensor:
    """Weight standardisation (Qiao et al. 2019): per output channel, zero mean and unit std over (C_in, kh, kw).

    BiT divides by sqrt(var + eps) ("variance"); the ViT code's models_resnet.py divides by std + eps ("std").
    The variance is the population one (numpy/jnp default, unbiased=False in BiT's PyTorch code).
    """
    var, mean = torch.var_mean(weight, dim=(1, 2, 3), keepdim=True, correction=0)  # (O, I, kh, kw) -> (O, 1, 1, 1)
    scale = torch.sqrt(var + eps) if eps_on == "variance" else torch.sqrt(var) + eps
    return (weight - mean) / scale


def same_padding(size: int, kernel_size: int, stride: int) -> tuple[int, int]:
    """TF/Flax "SAME" padding of one dimension: output ceil(size / stride); an odd total puts the extra pixel after."""
    out = -(-size // stride)  # ceil division that also works on symbolic sizes
    total = max((out - 1) * stride + kernel_size - size, 0)
    return total // 2, total - total // 2


def pad_same(x: Tensor, kernel_size: int, stride: int, value: float = 0.0) -> Tensor:
    """Pad (B, C, H, W) as TF "SAME" does before a VALID conv or pool: (B, C, H + ph, W + pw)."""
    top, bottom = same_padding(x.shape[-2], kernel_size, stride)
    left, right = same_padding(x.shape[-1], kernel_size, stride)
    return F.pad(x, (left, right, top, bottom), value=value)


class StdConv2d(nn.Conv2d):
    """Bias-free convolution whose kernel is weight-standardised at every call (BiT, Sec. 2 of Kolesnikov et al.).

    `padding="same"` pads as TF/Flax "SAME" (asymmetric for even inputs), which the ViT code's ResNet uses.
    """

    def __init__(
        self,
        in_chans: int,
        out_chans: int,
        kernel_size: int,
        stride: int = 1,
        padding: int | Literal["same"] = 0,
        *,
        eps: float = BIT_WS_EPS,
        eps_on: EpsOn = "variance",
    ):
        super().__init__(
            in_chans, out_chans, kernel_size, stride=stride, padding=0 if padding == "same" else padding, bias=False
        )
        self.same = padding == "same"
        self.eps, self.eps_on = eps, eps_on

    def forward(self, x: Tensor) -> Tensor:
        if self.same:
            x = pad_same(x, self.kernel_size[0], self.stride[0])
        weight = standardize_weight(self.weight, self.eps, self.eps_on)
        return F.conv2d(x, weight, None, self.stride, self.padding)


class MaxPool2dSame(nn.Module):
    """Max-pooling with TF "SAME" padding: padded cells are -inf, so they never win (Flax nn.max_pool)."""

    def __init__(self, kernel_size: int, stride: int):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride

    def forward(self, x: Tensor) -> Tensor:
        x = pad_same(x, self.kernel_size, self.stride, value=-math.inf)
        return F.max_pool2d(x, self.kernel_size, self.stride)


def group_norm(channels: int, eps: float) -> nn.GroupNorm:
    """GroupNorm with BiT's 32 groups (both BiT and the ViT code use 32 everywhere)."""
    return nn.GroupNorm(GN_GROUPS, channels, eps=eps)


def projection(
    in_chans: int, out_chans: int, stride: int, norm: nn.Module | None = None, **conv_kw: Any
) -> nn.Sequential:
    """Projection shortcut: a strided 1x1 StdConv (`downsample.conv`), with a GroupNorm (`downsample.norm`) if given."""
    layers: OrderedDict[str, nn.Module] = OrderedDict(conv=StdConv2d(in_chans, out_chans, 1, stride, **conv_kw))
    if norm is not None:
        layers["norm"] = norm
    return nn.Sequential(layers)


class PreActBottleneck(nn.Module):
    """BiT's pre-activation bottleneck unit: x + conv3(GN-ReLU(conv2(GN-ReLU(conv1(GN-ReLU(x)))))).

    The stride sits on the 3x3 convolution (BiT; the original ResNet-v2 had it on conv1).
    """

    def __init__(self, in_chans: int, out_chans: int, stride: int = 1):
        super().__init__()
        mid = out_chans // 4  # bottleneck width
        self.norm1 = group_norm(in_chans, BIT_GN_EPS)
        self.conv1 = StdConv2d(in_chans, mid, 1)
        self.norm2 = group_norm(mid, BIT_GN_EPS)
        self.conv2 = StdConv2d(mid, mid, 3, stride, padding=1)
        self.norm3 = group_norm(mid, BIT_GN_EPS)
        self.conv3 = StdConv2d(mid, out_chans, 1)
        needs_projection = stride != 1 or in_chans != out_chans
        self.downsample = projection(in_chans, out_chans, stride) if needs_projection else None

    def forward(self, x: Tensor) -> Tensor:
        preact = F.relu(self.norm1(x))
        shortcut = x if self.downsample is None else self.downsample(preact)  # BiT: projection of the pre-activation
        y = self.conv1(preact)
        y = self.conv2(F.relu(self.norm2(y)))
        y = self.conv3(F.relu(self.norm3(y)))
        return y + shortcut


class ResNetStage(nn.Module):
    """A sequence of residual units (`blocks.{j}`); the first one changes width and stride."""

    def __init__(self, blocks: Sequence[nn.Module]):
        super().__init__()
        self.blocks = nn.Sequential(*blocks)

    def forward(self, x: Tensor) -> Tensor:
        return self.blocks(x)


@torch.no_grad()
def flax_default_init_(module: nn.Module) -> None:
    """Flax's defaults for every conv and GroupNorm below `module`: LeCun-normal kernels, scale 1, bias 0."""
    for child in module.modules():
        if isinstance(child, nn.Conv2d):
            lecun_normal_(child.weight)
        elif isinstance(child, nn.GroupNorm):
            nn.init.ones_(child.weight)
            nn.init.zeros_(child.bias)


class ResNetV2(nn.Module):
    """BiT ResNet-v2 R{50,101,152,200}x{1..4}.  `forward(x)` takes a normalised (B, C, H, W) tensor, returns logits.

    Parameter names follow timm's `resnetv2` (`stem.conv`, `stages.{i}.blocks.{j}.{norm1,conv1,…,downsample.conv}`,
    `norm`, `head.fc`), except that `head.fc` is a Linear layer (timm: a 1x1 convolution of the same weights).
    """

    def __init__(self, config: ResNetConfig):
        super().__init__()
        self.config = config
        width = 64 * config.width_factor
        self.stem = nn.Sequential(
            OrderedDict(
                conv=StdConv2d(config.in_chans, width, 7, 2, padding=3),
                pad=nn.ConstantPad2d(
                    1, 0.0
                ),  # BiT pads with zeros, then pools VALID ("subtly not the same" as padding=1)
                pool=nn.MaxPool2d(3, 2),
            )
        )
        stages, channels = [], width
        for index, depth in enumerate(config.layers):
            out = 256 * config.width_factor * 2**index
            stride = 1 if index == 0 else 2  # the stem already downsampled 4x
            blocks = [PreActBottleneck(channels if j == 0 else out, out, stride if j == 0 else 1) for j in range(depth)]
            stages.append(ResNetStage(blocks))
            channels = out
        kernels.one_channel_(self.stem.conv)
        self.stages = nn.Sequential(*stages)
        self.norm = group_norm(channels, BIT_GN_EPS)  # pre-activation units leave the last output un-normalised
        self.num_features = channels
        self.head = linear_head(channels, config.num_classes)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise as bit_jax: LeCun-normal kernels (Flax default), GroupNorm 1 / 0, zero head."""
        flax_default_init_(self)
        zero_head_(self.head)

    def forward_stages(self, x: Tensor) -> dict[str, Tensor]:
        """Feature maps after the stem and after each stage: "stem", "stage1", … (B, C_i, H_i, W_i)."""
        check_images(x, self.stem.conv.in_channels)
        x = self.stem(x)  # (B, C, H, W) -> (B, 64w, H/4, W/4)
        named = {"stem": x}
        for index, stage in enumerate(self.stages):
            x = stage(x)
            named[f"stage{index + 1}"] = x
        return named

    def pool(self, x: Tensor) -> Tensor:
        """Final GroupNorm + ReLU and global average pooling: (B, F, h, w) -> (B, F)."""
        return F.relu(self.norm(x)).mean(dim=(2, 3))

    def forward_features(self, x: Tensor) -> Tensor:
        """The pooled representation the head reads, (B, num_features)."""
        check_images(x, self.stem.conv.in_channels)
        return self.pool(self.stages(self.stem(x)))

    def forward_head(self, features: Tensor) -> Tensor:
        return self.head(features)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.forward_features(x))

    def forward_intermediates(self, x: Tensor) -> dict[str, Tensor]:
        """Named tensors for inspection and few-shot: "stem", "stageN", "pre_logits" (pooled), "logits"."""
        named = self.forward_stages(x)
        features = self.pool(named[f"stage{len(self.stages)}"])
        return {**named, "pre_logits": features, "logits": self.head(features)}

    def reset_head(self, num_classes: int) -> None:
        """Fine-tuning: a fresh zero-initialised head with `num_classes` outputs (0: no head)."""
        reference = self.norm.weight  # the new head lives on the model's device, in its dtype
        self.head = linear_head(self.num_features, num_classes).to(device=reference.device, dtype=reference.dtype)
        zero_head_(self.head)
        self.config = replace(self.config, num_classes=num_classes)


def linear_head(features: int, num_classes: int) -> nn.Module:
    """`head.fc`: F -> K dense layer, or the identity when num_classes is 0."""
    if not num_classes:
        return nn.Identity()
    return nn.Sequential(OrderedDict(fc=nn.Linear(features, num_classes)))


@torch.no_grad()
def zero_head_(head: nn.Module) -> None:
    """Zero every head parameter, so that fine-tuning starts from zero logits."""
    for param in head.parameters():  # BiT fine-tunes from a zero head (and so does ViT, Sec. 3.2)
        param.zero_()


@torch.no_grad()
def lecun_normal_(weight: Tensor) -> None:
    """Flax's default kernel init: normal truncated at +-2 std, rescaled to variance 1 / fan_in."""
    std = math.sqrt(1.0 / weight[0].numel()) / 0.87962566103423978
    nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)
