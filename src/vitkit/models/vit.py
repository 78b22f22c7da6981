"""The Vision Transformer: Sec. 3.1, Eq. 1-4, with multihead self-attention as App. A, Eq. 5-8.

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos      Eq. 1
    z'_l = MSA(LN(z_{l-1})) + z_{l-1}                   Eq. 2
    z_l = MLP(LN(z'_l)) + z'_l                          Eq. 3
    y = LN(z_L^0)                                       Eq. 4

Numerics and initialisation follow the official code (google-research/vision_transformer,
`vit_jax/models_vit.py`): LayerNorm eps 1e-6, tanh-approximated GELU, Xavier-uniform dense kernels,
MLP biases ~ N(0, 1e-6), LeCun-normal patch embedding, zero [class] token, position embeddings
~ N(0, 0.02), zero-initialised head.  Dropout sits where App. B.1 puts it.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.models import posemb as pe
from vitkit.models.configs import HybridConfig, ViTConfig


class PatchEmbed(nn.Module):
    """x_p^i E of Eq. 1: a linear map of each flattened P x P x C patch, as a stride-P convolution."""

    def __init__(self, patch_size: int, in_chans: int, hidden_size: int):
        super().__init__()
        self.stride = patch_size  # pixels per token along each side
        self.proj = nn.Conv2d(in_chans, hidden_size, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        grid = pe.check_grid(x.shape[-2], x.shape[-1], self.stride)
        x = self.proj(x)  # (B, C, H, W) -> (B, D, H/P, W/P)
        return x.flatten(2).transpose(1, 2), grid  # (B, D, gh, gw) -> (B, N, D)


class Attention(nn.Module):
    """Multihead self-attention (App. A, Eq. 5-8) with fused q, k, v projections."""

    def __init__(self, config: ViTConfig, num_tokens: int):
        super().__init__()
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.scale = self.head_dim**-0.5  # 1 / sqrt(D_h), Eq. 5
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.qkv_bias)
        self.attn_drop = config.attention_dropout
        self.attn_impl = config.attn_impl  # fused SDPA kernel or Eq. 5-7 spelt out; equal results
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.proj_drop = nn.Dropout(config.dropout)  # App. B.1: after every dense layer except qkv
        # App. D.4 relative attention: one learned D_h-vector per offset i - j in -(T-1) ... T-1.
        self.rel_pos = nn.Parameter(torch.zeros(2 * num_tokens - 1, self.head_dim)) if config.posemb == "relative" else None

    def forward(self, x: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # (B, T, 3, k, D_h) -> 3 x (B, k, T, D_h)
        bias = pe.relative_logits(q, self.rel_pos) * self.scale if self.rel_pos is not None else None
        drop = self.attn_drop if self.training else 0.0
        weights = None
        if need_weights or self.explicit(q):  # Eq. 5-6 spelt out; the only path that can return A
            logits = (q * self.scale) @ k.transpose(-2, -1)  # (B, k, T, T); scaling q is the cheaper side
            weights = _softmax(logits if bias is None else logits + bias)
            out = F.dropout(weights, drop, self.training) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=drop)
        out = out.transpose(1, 2).reshape(batch, tokens, dim)  # (B, k, T, D_h) -> (B, T, D), Eq. 8 concat
        return self.proj_drop(self.proj(out)), weights if need_weights else None  # Eq. 8: [SA_1; ...; SA_k] U_msa

    def explicit(self, q: Tensor) -> bool:
        """Whether Eq. 5-7 run as plain matmuls + softmax rather than the fused SDPA kernel.

        "auto" picks the explicit path for bf16/fp16 queries on the CPU: there torch's SDPA kernel is
        2-6x slower than matmul + softmax (forward and, above all, backward; benchmarks/compare.py);
        in fp32 and on CUDA (flash / memory-efficient kernels) SDPA is as fast or faster.
        """
        if self.attn_impl == "auto":
            return q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)
        return self.attn_impl == "explicit"


BF16_SOFTMAX_MIN_TOKENS = 32  # CPU rows shorter than this: softmax in fp32 (see `_softmax`)


def _softmax(logits: Tensor) -> Tensor:
    """Softmax over the last axis, in the logits' dtype.

    On the CPU, torch's bf16 softmax kernel processes rows shorter than one 512-bit vector (32 bf16
    values) element by element: there, as for the 17-25 tokens of small-28px under PatchDropout,
    computing in fp32 and rounding back is 2-2.5x faster forward + backward; from 32 tokens up the
    bf16 kernel is faster (3x at 197 tokens).  benchmarks/cpu_kernels.py measures both sides.
    """
    if logits.dtype == torch.bfloat16 and logits.device.type == "cpu" and logits.shape[-1] < BF16_SOFTMAX_MIN_TOKENS:
        return logits.softmax(dim=-1, dtype=torch.float32).to(logits.dtype)
    return logits.softmax(dim=-1)


class Mlp(nn.Module):
    """Two dense layers with a GELU non-linearity (Sec. 3.1), dropout after each (App. B.1)."""

    def __init__(self, config: ViTConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.mlp_dim)
        self.act = nn.GELU(approximate="tanh" if config.gelu == "tanh" else "none")
        self.drop1 = nn.Dropout(config.dropout)
        self.fc2 = nn.Linear(config.mlp_dim, config.hidden_size)
        self.drop2 = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        hidden = _fused_linear_gelu(x, self.fc1, self.act.approximate) if _cpu_inference(x) else None
        if hidden is None:
            hidden = self.act(self.fc1(x))
        return self.drop2(self.fc2(self.drop1(hidden)))


def _cpu_inference(x: Tensor) -> bool:
    """No autograd, eager, on the CPU: where oneDNN's fused dense + GELU can replace the two ops."""
    return (
        x.device.type == "cpu"
        and not torch.is_grad_enabled()
        and not torch.compiler.is_compiling()  # compile / export / ONNX trace the plain ops
        and not torch.jit.is_tracing()
        and not torch.onnx.is_in_onnx_export()
    )


def _fused_linear_gelu(x: Tensor, fc: nn.Linear, approximate: str) -> Tensor | None:
    """GELU(x W^T + b) in one oneDNN kernel (the GELU applied to the matmul's fp32 accumulator).

    Same function as `act(fc(x))`: fp32 results agree to ~5e-7, and with bf16 autocast the output is
    rounded to bf16 once instead of twice.  It removes the separate pass over the (B, T, mlp_dim)
    activation, the largest tensor of the block: on this CPU the stand-alone tanh GELU costs about
    half as much as the fc1 matmul it follows (benchmarks/compare.py).  Returns None where the fused
    kernel is unavailable, so the caller falls back to the two ops.
    """
    op = getattr(torch.ops.mkldnn, "_linear_pointwise", None) if torch.backends.mkldnn.is_available() else None
    if op is None:
        return None
    weight, bias = fc.weight, fc.bias
    if torch.is_autocast_enabled("cpu"):  # the fused op is not on autocast's list: cast as autocast would
        dtype = torch.get_autocast_dtype("cpu")
        x, weight = x.to(dtype), weight.to(dtype)
        bias = bias.to(dtype) if bias is not None else None
    if x.dtype != weight.dtype or x.dtype not in (torch.float32, torch.bfloat16):
        return None
    return op(x, weight, bias, "gelu", [], approximate)


class DropPath(nn.Module):
    """Stochastic depth: drop a residual branch per sample, rescaling the kept ones (an option, not in the paper)."""

    def __init__(self, rate: float):
        super().__init__()
        self.rate = rate

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.rate == 0.0:
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(1.0 - self.rate)
        return x * keep / (1.0 - self.rate)


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
    2D on the fly (Sec. 3.2).  Given a HybridConfig, the ResNet stem of models/hybrid.py becomes the patch embedding.
    """

    def __init__(self, config: ViTConfig | HybridConfig):
        super().__init__()
        self.config = config  # the whole model's config (what checkpoints record)
        if isinstance(config, HybridConfig):
            from vitkit.models.hybrid import HybridEmbed  # the hybrid only swaps the patch embedding

            patch_embed: nn.Module = HybridEmbed(config)
            config = config.vit
        else:
            patch_embed = PatchEmbed(config.patch_size, config.in_chans, config.hidden_size)
        self.encoder_config = config  # ViT fields, for a plain ViT the same object as self.config
        width, depth = config.hidden_size, config.depth
        self.patch_embed = patch_embed
        self.grid_size = (config.img_size // self.patch_embed.stride,) * 2  # grid the stored embeddings belong to
        self.num_prefix_tokens = 1 if config.pool == "token" else 0
        num_tokens = self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width)) if config.pool == "token" else None
        # App. D.4: one set of embeddings, or one per layer ("per_layer").
        sets = depth if config.posemb_where == "per_layer" else 1
        self.pos_embed = self.pos_embed_x = self.pos_embed_y = None
        if config.posemb == "learned_1d":
            self.pos_embed = nn.Parameter(torch.zeros(sets, num_tokens, width))
        elif config.posemb == "learned_2d":
            self.pos_embed_x = nn.Parameter(torch.zeros(sets, self.grid_size[1], width // 2))
            self.pos_embed_y = nn.Parameter(torch.zeros(sets, self.grid_size[0], width // 2))
        self.pos_drop = nn.Dropout(config.dropout)  # App. B.1: dropout right after adding position embeddings
        rates = [config.drop_path * i / max(depth - 1, 1) for i in range(depth)]  # stochastic depth grows with depth
        self.blocks = nn.ModuleList(Block(config, num_tokens, rate) for rate in rates)
        self.norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        rep = config.representation_size
        self.pre_logits = PreLogits(width, rep) if rep else nn.Identity()
        self.num_features = rep or width
        self.head = nn.Linear(self.num_features, config.num_classes) if config.num_classes else nn.Identity()
        self.reset_parameters()

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
        if isinstance(self.patch_embed, PatchEmbed):
            conv = self.patch_embed.proj
            _lecun_normal_(conv.weight, conv.weight[0].numel())
            nn.init.zeros_(conv.bias)
        else:  # the hybrid's ResNet and projection initialise as models_resnet.py / models_vit.py
            self.patch_embed.reset_parameters()
        for param in (self.pos_embed, self.pos_embed_x, self.pos_embed_y):
            if param is not None:
                nn.init.normal_(param, std=0.02)  # AddPositionEmbs: normal(stddev=0.02)
        for block in self.blocks:
            if block.attn.rel_pos is not None:
                nn.init.normal_(block.attn.rel_pos, std=0.02)
        if isinstance(self.head, nn.Linear):
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)

    def position_embeddings(self, grid: tuple[int, int]) -> Tensor | None:
        """E_pos for a patch grid: (S, prefix + gh*gw, D) with S sets, or None (none / relative)."""
        kind, prefix = self.encoder_config.posemb, self.num_prefix_tokens
        if kind == "learned_1d":
            return pe.resample_pos_embed(self.pos_embed, grid, self.grid_size, prefix)
        if kind == "learned_2d":
            table = pe.learned_2d(self.pos_embed_x, self.pos_embed_y, grid)
        elif kind == "sincos_2d":
            table = pe.sincos_2d(grid, self.encoder_config.hidden_size).to(self.norm.weight)
        else:
            return None
        return F.pad(table, (0, 0, prefix, 0))  # the [class] token gets no 2D position

    def embed(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """Eq. 1 before E_pos: patch tokens with [class] prepended, (B, T, D), and E_pos for them."""
        tokens, grid = self.patch_embed(x)  # (B, N, D)
        if self.cls_token is not None:
            tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)  # (B, N+1, D)
        return tokens, self.position_embeddings(grid)

    def encode(self, x: Tensor, attention_layers: Sequence[int] = (), patch_dropout: float | None = None
               ) -> tuple[Tensor, dict[str, Tensor]]:
        """Eq. 1-3 and the final LayerNorm: returns LN(z_L) (B, T, D) and named intermediates.

        Intermediates hold "embed" (z_0), "blockNN" (z_l, l = NN + 1) and, for the layers listed in
        `attention_layers`, "attnNN" (B, k, T, T) attention weights A (Eq. 6).
        """
        z, pos = self.embed(x)
        where = self.encoder_config.posemb_where
        if pos is not None and where == "input":
            z = z + pos[0]  # Eq. 1: + E_pos
        z = self.pos_drop(z)
        rate = (self.encoder_config.patch_dropout if patch_dropout is None else patch_dropout) if self.training else 0.0
        if rate > 0:  # PatchDropout: training only; the trainer passes the scheduled rate
            z = self.drop_patches(z, rate)
        named: dict[str, Tensor] = {"embed": z}
        wanted = set(attention_layers)
        for index, block in enumerate(self.blocks):  # l = 1 ... L
            if pos is not None and where != "input":  # App. D.4: embeddings added before every layer
                z = z + pos[index if where == "per_layer" else 0]
            z, weights = block(z, need_weights=index in wanted)  # Eq. 2-3
            named[f"block{index:02d}"] = z
            if weights is not None:
                named[f"attn{index:02d}"] = weights
        return self.norm(z), named

    def drop_patches(self, z: Tensor, rate: float) -> Tensor:
        """PatchDropout (Liu et al., WACV 2023): keep a uniformly random round(N (1 - rate)) of each image's
        N patch tokens, position embeddings already added; the [class] token always stays.

        Every later layer then costs about (1 - rate) as much; evaluation sees all patches.
        """
        prefix = self.num_prefix_tokens
        batch, tokens, dim = z.shape
        keep = max(1, round((tokens - prefix) * (1.0 - rate)))
        index = torch.rand(batch, tokens - prefix, device=z.device).topk(keep, dim=1).indices + prefix  # (B, keep)
        kept = z.gather(1, index.unsqueeze(-1).expand(-1, -1, dim))
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
        """Logits; `patch_dropout` overrides the config's PatchDropout rate in training (None: the config's)."""
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
        self.head = nn.Linear(width, num_classes, device=reference.device, dtype=reference.dtype) if num_classes else nn.Identity()
        if num_classes:
            nn.init.zeros_(self.head.weight)
            nn.init.zeros_(self.head.bias)
        self.encoder_config = replace(self.encoder_config, num_classes=num_classes, representation_size=None)
        if isinstance(self.config, HybridConfig):  # a hybrid keeps its ViT fields in config.vit
            self.config = replace(self.config, vit=self.encoder_config)
        else:
            self.config = self.encoder_config


def _lecun_normal_(weight: Tensor, fan_in: int) -> None:
    """Flax's lecun_normal: a normal truncated at +-2 std, rescaled to variance 1 / fan_in."""
    std = math.sqrt(1.0 / fan_in) / 0.87962566103423978
    nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)
