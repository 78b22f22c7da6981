"""The hybrid architecture (Sec. 3.1): a ResNet's feature map, cut into 1x1 patches, is ViT's input sequence.

Option (i) keeps the four stages of a ResNet (stride 32: 7x7 tokens at 224 px); option (ii) drops stage 4
and moves its units into stage 3, (3, 4, 9) for R50 (stride 16: 14x14 tokens), the released R50+ViT-B/16
(Sec. 4.1).  The ResNet is the one in the official code (google-research/vision_transformer,
`vit_jax/models_resnet.py` and the root in `models_vit.py`), which is NOT BiT's pre-activation one:

- root: 7x7/2 StdConv -> GroupNorm -> ReLU -> 3x3/2 max-pool, all with TF "SAME" padding
  (asymmetric: at 224 px the 7x7/2 conv pads 2 before and 3 after, the pool 0 and 1);
- post-activation bottleneck units, stride on the 3x3 conv, relu(shortcut + GN(conv3(...)));
  the projection shortcut (1x1 StdConv + GroupNorm) reads the unit's input;
- weight standardisation (W - mean) / (std + 1e-5); GroupNorm(32 groups, eps 1e-6, Flax's default);
- init: Flax defaults (LeCun-normal kernels, GroupNorm scale 1 and bias 0) except the last GroupNorm
  of every unit, whose scale starts at zero, so that every unit starts as its shortcut.
Module names follow timm's hybrid (`patch_embed.backbone.stem.conv`, `patch_embed.backbone.stages.…`,
`patch_embed.proj`), so its weights map one to one (timm's numerics differ slightly: weight
standardisation / sqrt(var + 1e-8), GroupNorm eps 1e-5).
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.models import kernels
from vitkit.models import posemb as pe
from vitkit.models.configs import HybridConfig
from vitkit.models.resnet import (
    MaxPool2dSame,
    ResNetStage,
    StdConv2d,
    flax_default_init_,
    group_norm,
    lecun_normal_,
    projection,
)

WS_EPS = 1e-5  # models_resnet.weight_standardize(..., eps=1e-5), added to the std
GN_EPS = 1e-6  # flax.linen.GroupNorm default epsilon


def _std_conv(in_chans: int, out_chans: int, kernel_size: int, stride: int = 1) -> StdConv2d:
    return StdConv2d(in_chans, out_chans, kernel_size, stride, padding="same", eps=WS_EPS, eps_on="std")


class Bottleneck(nn.Module):
    """The ViT code's ResidualUnit: relu(shortcut + GN(conv3(relu(GN(conv2(relu(GN(conv1(x))))))))), stride on conv2."""

    def __init__(self, in_chans: int, out_chans: int, stride: int = 1):
        super().__init__()
        mid = out_chans // 4  # `features`; the unit outputs features * 4
        self.conv1 = _std_conv(in_chans, mid, 1)
        self.norm1 = group_norm(mid, GN_EPS)
        self.conv2 = _std_conv(mid, mid, 3, stride)
        self.norm2 = group_norm(mid, GN_EPS)
        self.conv3 = _std_conv(mid, out_chans, 1)
        self.norm3 = group_norm(out_chans, GN_EPS)  # gn3: scale_init zeros (see reset_parameters)
        needs_projection = stride != 1 or in_chans != out_chans
        self.downsample = (
            projection(
                in_chans, out_chans, stride, group_norm(out_chans, GN_EPS), padding="same", eps=WS_EPS, eps_on="std"
            )
            if needs_projection
            else None
        )
        init_official_(self)

    def forward(self, x: Tensor) -> Tensor:
        shortcut = x if self.downsample is None else self.downsample(x)  # conv_proj + gn_proj
        y = F.relu(self.norm1(self.conv1(x)))
        y = F.relu(self.norm2(self.conv2(y)))
        y = self.norm3(self.conv3(y))
        return F.relu(shortcut + y)


class HybridBackbone(nn.Module):
    """Root block and stages of the official ViT code's ResNet: (B, C, H, W) -> (B, 256·w·2^(S-1), H/s, W/s)."""

    def __init__(self, layers: tuple[int, ...], width_factor: int, in_chans: int):
        super().__init__()
        width = 64 * width_factor
        self.stem = nn.Sequential(
            OrderedDict(
                conv=_std_conv(in_chans, width, 7, 2),  # conv_root
                norm=group_norm(width, GN_EPS),  # gn_root
                act=nn.ReLU(),
                pool=MaxPool2dSame(3, 2),  # nn.max_pool(..., padding="SAME")
            )
        )
        stages, channels = [], width
        for index, depth in enumerate(layers):
            out = 4 * width * 2**index  # ResNetStage(nout=width·2^i); units output nout·4
            stride = 1 if index == 0 else 2
            blocks = [Bottleneck(channels if j == 0 else out, out, stride if j == 0 else 1) for j in range(depth)]
            stages.append(ResNetStage(blocks))
            channels = out
        kernels.one_channel_(self.stem.conv)
        self.stages = nn.Sequential(*stages)
        self.num_features = channels
        init_official_(self.stem)  # the units initialised themselves

    def reset_parameters(self) -> None:
        init_official_(self)

    def forward(self, x: Tensor) -> Tensor:
        return self.stages(self.stem(x))


class HybridEmbed(nn.Module):
    """Patch embedding of a hybrid: ResNet feature map -> P x P patches (P = 1 in the paper) -> D-dim tokens.

    `stride` is the number of input pixels per token along a side (backbone stride x P).
    """

    def __init__(self, config: HybridConfig):
        super().__init__()
        vit = config.vit
        self.stride = config.stride * vit.patch_size
        self.backbone = HybridBackbone(config.resnet_layers, config.width_factor, vit.in_chans)
        # models_vit.py "embedding": a VALID conv with kernel = stride = patch size on the feature map
        self.proj = nn.Conv2d(
            self.backbone.num_features, vit.hidden_size, kernel_size=vit.patch_size, stride=vit.patch_size
        )
        self._reset_proj()  # the backbone initialised itself

    @torch.no_grad()
    def reset_parameters(self) -> None:
        self.backbone.reset_parameters()
        self._reset_proj()

    @torch.no_grad()
    def _reset_proj(self) -> None:
        lecun_normal_(self.proj.weight)  # flax.linen.Conv defaults
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        pe.check_images(x, self.backbone.stem.conv.in_channels)
        grid = pe.check_grid(x.shape[-2], x.shape[-1], self.stride)
        x = self.proj(self.backbone(x))  # (B, C, H, W) -> (B, D, H/s, W/s)
        return x.flatten(2).transpose(1, 2), grid  # (B, D, gh, gw) -> (B, N, D)


@torch.no_grad()
def init_official_(module: nn.Module) -> None:
    """Flax defaults (LeCun-normal kernels, GroupNorm scale 1, bias 0), then gn3 scale_init=zeros in every unit,
    so that each unit starts as relu(shortcut)."""
    flax_default_init_(module)
    for child in module.modules():
        if isinstance(child, Bottleneck):
            nn.init.zeros_(child.norm3.weight)
