"""The Vision Transformer: Sec. 3.1, Eq. 1-4, with multihead self-attention as App. A, Eq. 5-8.

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos      Eq. 1
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                   Eq. 2
    z_l = MLP(LN(z'_l)) + z'_l                          Eq. 3
    y = LN(z_L^0)                                       Eq. 4

Numerics and initialisation follow the official code (google-research/vision_transformer,
`vit_jax/models_vit.py`): LayerNorm eps 1e-6, tanh-approximated GELU, Xavier-uniform dense kernels,
MLP biases ~ N(0, 1e-6), LeCun-normal patch embedding, zero [class] token, position embeddings
~ N(0, 0.02), zero-initialised head.  Dropout sits where App. B.1 puts it.  The position-embedding
variants of App. D.4 are posemb.py's; how attention and GELU are computed (the same functions, the
fastest measured way) is kernels.py's; a hybrid's ResNet stem comes from models/__init__.py:build_model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from vitkit.models import kernels
from vitkit.models import posemb as pe
from vitkit.models.configs import HybridConfig, ViTConfig, replace_vit, vit_config
from vitkit.models.mimetic import mimetic_init_


class PatchEmbed(nn.Module):
    """x_p^i E of Eq. 1: a linear map of each flattened P x P x C patch, as a stride-P convolution."""

    def __init__(self, patch_size: int, in_chans: int, hidden_size: int):
        super().__init__()
        self.stride = patch_size  # pixels per token along each side
        self.proj = nn.Conv2d(in_chans, hidden_size, kernel_size=patch_size, stride=patch_size)
        kernels.one_channel_(self.proj)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        _lecun_normal_(self.proj.weight, self.proj.weight[0].numel())  # models_vit.py: nn.Conv defaults
        nn.init.zeros_(self.proj.bias)

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        pe.check_images(x, self.proj.in_channels)
        grid = pe.check_grid(x.shape[-2], x.shape[-1], self.stride)
        x = self.proj(x)  # (B, C, H, W) -> (B, D, H/P, W/P)
        return x.flatten(2).transpose(1, 2), grid  # (B, D, gh, gw) -> (B, N, D)


class Attention(nn.Module):
    """Multihead self-attention (App. A, Eq. 5-8) with fused q, k, v projections."""

    def __init__(self, config: ViTConfig, num_tokens: int):
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.scale = self.head_dim**-0.5  # 1 / sqrt(D_h), Eq. 5
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.qkv_bias)  # [U_q U_k U_v]
        self.attn_drop = config.attention_dropout
        self.attn_impl = config.attn_impl  # fused SDPA kernel or Eq. 5-7 spelt out (kernels.attention); equal results
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)  # U_msa
        self.proj_drop = nn.Dropout(config.dropout)  # App. B.1: after every dense layer except qkv
        self.rel_pos = pe.relative_table(config, num_tokens)  # App. D.4 relative attention: (2T-1, D_h), or None

    def forward(self, x: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, self.head_dim)  # (B, T, 3·D) -> (B, T, 3, k, D_h)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, T, 3, k, D_h) -> 3 x (B, k, T, D_h), Eq. 5
        bias = pe.relative_logits(q, self.rel_pos) * self.scale if self.rel_pos is not None else None
        drop = self.attn_drop if self.training else 0.0
        out, weights = kernels.attention(q, k, v, bias, drop, self.attn_impl, need_weights)  # Eq. 6-7: A v
        out = out.transpose(1, 2).reshape(batch, tokens, dim)  # (B, k, T, D_h) -> (B, T, D), Eq. 8 concatenation
        return self.proj_drop(self.proj(out)), weights  # Eq. 8: [SA_1; ...; SA_k] U_msa


class Mlp(nn.Module):
    """Two dense layers with a GELU non-linearity (Sec. 3.1), dropout after each (App. B.1)."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.mlp_dim)
        self.approximate: kernels.Approximate = "tanh" if config.gelu == "tanh" else "none"  # Flax nn.gelu: tanh
        self.drop1 = nn.Dropout(config.dropout)
        self.fc2 = nn.Linear(config.mlp_dim, config.hidden_size)
        self.drop2 = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        hidden = kernels.linear_gelu(x, self.fc1, self.approximate)  # GELU(x W_1 + b_1): (B, T, mlp_dim)
        return self.drop2(self.fc2(self.drop1(hidden)))


class DropPath(nn.Module):
    """Stochastic depth: drop a residual branch per sample, rescaling the kept ones (an option, not in the paper)."""

    def __init__(self, rate: float):
        super().__init__()
        self.rate = float(rate)

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.rate <= 0.0:
            return x
        keep = torch.rand((x.shape[0],) + (1,) * (x.ndim - 1), device=x.device) >= self.rate
        return x * keep.to(x.dtype) / (1.0 - self.rate)


def drop_path_rates(rate: float, depth: int) -> list[float]:
    """Stochastic depth per block: 0 at the first, growing linearly to `rate` at the last."""
    return [rate * i / max(depth - 1, 1) for i in range(depth)]


class Block(nn.Module):
    """One pre-LayerNorm encoder layer (Eq. 2-3)."""

    def __init__(self, config: ViTConfig, num_tokens: int, drop_path: float = 0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attn = Attention(config, num_tokens)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = Mlp(config)
        self.drop_path = DropPath(drop_path)

    def forward(self, z: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        attn, weights = self.attn(self.norm1(z), need_weights)
        z = z + self.drop_path(attn)  # Eq. 2
        z = z + self.drop_path(self.mlp(self.norm2(z)))  # Eq. 3
        return z, weights


class PreLogits(nn.Module):
    """The pre-training head's hidden layer: dense + tanh (Sec. 3.1, "MLP with one hidden layer")."""

    def __init__(self, hidden_size: int, representation_size: int):
        super().__init__()
        self.fc = nn.Linear(hidden_size, representation_size)

    def forward(self, y: Tensor) -> Tensor:
        return torch.tanh(self.fc(y))


class VisionTransformer(nn.Module):
    """ViT (Sec. 3.1).  `forward(x)` takes a normalised (B, C, H, W) float tensor and returns logits.

    Any H, W divisible by the patch size is accepted: learned position embeddings are resampled in
    2D on the fly (Sec. 3.2).  `patch_embed` replaces the linear patch embedding: `build_model` gives
    a hybrid its ResNet stem this way (Sec. 3.1), and `config` is then the whole HybridConfig.
    """

    def __init__(self, config: ViTConfig | HybridConfig, patch_embed: nn.Module | None = None):
        super().__init__()
        self.config = config  # the whole model's config (what checkpoints record); the ViT's part: encoder_config
        vit = self.encoder_config
        if patch_embed is None:
            if vit is not config:
                raise ValueError(
                    "a hybrid's ResNet stem comes from its config: build it with vitkit.models.build_model"
                )
            patch_embed = PatchEmbed(vit.patch_size, vit.in_chans, vit.hidden_size)
        self.patch_embed = patch_embed  # x_p^i E of Eq. 1; a hybrid's: 1x1 patches of ResNet features (Sec. 3.1)
        self.grid_size = (vit.img_size // self.patch_embed.stride,) * 2  # grid the stored embeddings belong to
        self.num_prefix_tokens = 1 if vit.pool == "token" else 0
        num_tokens = self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]
        self.cls_token = nn.Parameter(torch.zeros(1, 1, vit.hidden_size)) if vit.pool == "token" else None
        # App. D.4: learned E_pos tables (state-dict keys of official/timm checkpoints), None where the variant has none
        self.pos_embed, self.pos_embed_x, self.pos_embed_y = pe.learned_tables(
            vit, self.grid_size, self.num_prefix_tokens
        )
        self.pos_drop = nn.Dropout(vit.dropout)  # App. B.1: dropout right after adding position embeddings
        self.blocks = nn.ModuleList(Block(vit, num_tokens, rate) for rate in drop_path_rates(vit.drop_path, vit.depth))
        self.norm = nn.LayerNorm(vit.hidden_size, eps=vit.layer_norm_eps)
        rep = vit.representation_size
        self.pre_logits = PreLogits(vit.hidden_size, rep) if rep else nn.Identity()
        self.num_features = rep or vit.hidden_size
        self.head = nn.Linear(self.num_features, vit.num_classes) if vit.num_classes else nn.Identity()
        self.reset_parameters()

    @property
    def encoder_config(self) -> ViTConfig:
        """The transformer's fields of `config` (for a hybrid, `config.vit`)."""
        return vit_config(self.config)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise as the official code (models_vit.py); the head is zero, as Sec. 3.2 asks for fine-tuning."""
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                if name.endswith("attn.qkv"):  # Flax inits q, k and v as three separate D x D kernels
                    for chunk in module.weight.chunk(3, dim=0):
                        nn.init.xavier_uniform_(chunk)
                elif name.endswith("pre_logits.fc"):  # Flax nn.Dense default: LeCun normal
                    _lecun_normal_(module.weight, module.in_features)
                else:
                    nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
                if ".mlp." in f".{name}":  # MlpBlock: bias_init normal(stddev=1e-6)
                    nn.init.normal_(module.bias, std=1e-6)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        self.patch_embed.reset_parameters()  # LeCun normal; a hybrid's ResNet as models_resnet.py
        pe.init_(self)  # AddPositionEmbs: N(0, 0.02), also the relative tables
        if self.encoder_config.init == "mimetic":
            mimetic_init_(self.blocks)
        if isinstance(self.head, nn.Linear):
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

    def position_embeddings(self, grid: tuple[int, int]) -> Tensor | None:
        """E_pos for a patch grid: (S, prefix + gh*gw, D) with S sets, or None (posemb none / relative)."""
        tables = (self.pos_embed, self.pos_embed_x, self.pos_embed_y)
        return pe.lookup(self.encoder_config, grid, self.grid_size, self.num_prefix_tokens, tables, self.norm.weight)

    def encode(
        self, x: Tensor, attention_layers: Sequence[int] = (), patch_dropout: float | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Eq. 1-3 and the final LayerNorm on images (B, C, H, W); see `encode_patches`."""
        tokens, grid = self.patch_embed(x)  # x_p^i E: (B, C, H, W) -> (B, N, D)
        rate = self._patch_dropout_rate(patch_dropout)
        content = None
        if rate > 0 and self.encoder_config.patch_dropout_keep == "content":
            content = patch_content(x, self.patch_embed.stride)
        return self.encode_patches(tokens, grid, attention_layers, rate, content)

    def encode_patches(
        self,
        tokens: Tensor,
        grid: tuple[int, int],
        attention_layers: Sequence[int] = (),
        patch_dropout: float | None = None,
        content: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Eq. 1-3 and the final LayerNorm from the patch embeddings x_p^i E (B, N, D) of a gh x gw grid.

        Returns LN(z_L) (B, T, D) and named intermediates: "embed" (z_0), "blockNN" (z_l, l = NN + 1)
        and, for the layers listed in `attention_layers`, "attnNN" (B, k, T, T), the weights A (Eq. 6).
        `patch_dropout` is the PatchDropout rate: None takes the config's in training and 0 in eval mode;
        `content` (B, N), 1 for the patches PatchDropout keeps first (see `patch_content`), or None.
        """
        where = self.encoder_config.posemb_where
        pos = self.position_embeddings(grid)  # (S, T, D) or None
        if self.cls_token is not None:
            tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)  # (B, N+1, D)
        z = self.pos_drop(pe.add(tokens, pos, where))  # Eq. 1: z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos
        patch_dropout = self._patch_dropout_rate(patch_dropout)
        if patch_dropout > 0:
            z = self.drop_patches(z, patch_dropout, content)
        named: dict[str, Tensor] = {"embed": z}
        for index, block in enumerate(self.blocks):  # l = 1 ... L
            z, weights = block(pe.add(z, pos, where, index), need_weights=index in attention_layers)  # Eq. 2-3
            named[f"block{index:02d}"] = z
            if weights is not None:
                named[f"attn{index:02d}"] = weights
        return self.norm(z), named

    def _patch_dropout_rate(self, rate: float | None) -> float:
        """The PatchDropout rate of a pass: the one asked for, else the config's in training and 0 in eval mode."""
        if rate is not None:
            return rate
        return self.encoder_config.patch_dropout if self.training else 0.0

    def drop_patches(self, z: Tensor, rate: float, content: Tensor | None = None) -> Tensor:
        """PatchDropout (Liu et al., WACV 2023; not in the paper): keep a uniformly random round(N (1 - rate))
        of each image's N patch tokens, position embeddings already added; the [class] token always stays.
        With `content` (B, N) in {0, 1}, the patches marked 1 are kept first, in random order, then the others."""
        prefix = self.num_prefix_tokens
        batch, tokens, dim = z.shape
        keep = max(1, round((tokens - prefix) * (1.0 - rate)))
        priority = torch.rand(batch, tokens - prefix, device=z.device)  # uniform in [0, 1): random order
        if content is not None:
            priority = priority + content.to(priority.dtype)  # content patches rank above every flat one
        index = priority.topk(keep, dim=1).indices + prefix  # (B, keep)
        kept = z.gather(1, index.unsqueeze(-1).expand(-1, -1, dim))  # (B, keep) -> (B, keep, D)
        return torch.cat([z[:, :prefix], kept], dim=1) if prefix else kept

    def pool(self, z: Tensor) -> Tensor:
        """Eq. 4: y = LN(z_L)^0, or the mean of the patch tokens after the final LN ("gap")."""
        return z[:, 0] if self.encoder_config.pool == "token" else z.mean(dim=1)

    def forward_features(self, x: Tensor, *, patch_dropout: float | None = None) -> Tensor:
        """The representation the head reads, (B, num_features): y, through the pre-logits layer if any."""
        z, _ = self.encode(x, patch_dropout=patch_dropout)
        return self.pre_logits(self.pool(z))

    def forward_head(self, features: Tensor) -> Tensor:
        return self.head(features)

    def forward(self, x: Tensor, *, patch_dropout: float | None = None) -> Tensor:
        """Logits (B, K).  `patch_dropout`: the PatchDropout rate of this pass (None: the config's in training)."""
        return self.head(self.forward_features(x, patch_dropout=patch_dropout))

    def forward_intermediates(self, x: Tensor, attention_layers: Sequence[int] | None = None) -> dict[str, Tensor]:
        """Named tensors for inspection and few-shot: "embed", "blockNN", "attnNN" (all layers unless
        `attention_layers` narrows them), "encoder_norm" (LN(z_L)), "y" (Eq. 4), "pre_logits", "logits"."""
        layers = range(len(self.blocks)) if attention_layers is None else attention_layers
        z, named = self.encode(x, layers)
        y = self.pool(z)
        features = self.pre_logits(y)
        return {**named, "encoder_norm": z, "y": y, "pre_logits": features, "logits": self.head(features)}

    def reset_head(self, num_classes: int) -> None:
        """Sec. 3.2 fine-tuning: replace the whole head (pre-logits too) by one zero-initialised D x K layer."""
        width = self.encoder_config.hidden_size
        self.pre_logits = nn.Identity()
        self.num_features = width
        reference = self.norm.weight  # the new head lives on the model's device, in its dtype
        self.head = (
            nn.Linear(width, num_classes, device=reference.device, dtype=reference.dtype)
            if num_classes
            else nn.Identity()
        )
        if num_classes:
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)
        self.config = replace_vit(self.config, num_classes=num_classes, representation_size=None)


FLAT_TOLERANCE = 0.02  # a patch whose pixels span less than 2% of the batch's pixel range counts as flat


def patch_content(x: Tensor, stride: int) -> Tensor:
    """(B, N) float: 1 where the stride x stride pixel block under a token varies, 0 where it is flat.

    Flat means every pixel of the block, in every channel, lies within FLAT_TOLERANCE of the batch's
    pixel range of each other: blank background such as MNIST's (63% of its 4x4 patches are all zero)."""
    batch, channels, height, width = x.shape
    blocks = x.detach().reshape(batch, channels, height // stride, stride, width // stride, stride)
    spread = blocks.amax(dim=(1, 3, 5)) - blocks.amin(dim=(1, 3, 5))  # (B, gh, gw)
    tolerance = FLAT_TOLERANCE * (x.detach().amax() - x.detach().amin())
    return (spread > tolerance).flatten(1).float()  # row-major, as the patch tokens


def _lecun_normal_(weight: Tensor, fan_in: int) -> None:
    """Flax's lecun_normal: a normal truncated at +-2 std, rescaled to variance 1 / fan_in."""
    std = math.sqrt(1.0 / fan_in) / 0.87962566103423978
    nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)
