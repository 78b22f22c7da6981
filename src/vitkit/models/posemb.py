"""Position embeddings of Appendix D.4 and their resampling to another patch grid (Sec. 3.2).

Variants (ViTConfig.posemb):
  none        no positional information ("bag of patches").
  learned_1d  one learned D-vector per token, raster order (the paper's default).
  learned_2d  learned X and Y embeddings of D/2 each, concatenated per patch ("2-D positional embedding").
  sincos_2d   fixed 2D sine-cosine embedding (not in the paper; the later big_vision default).
  relative    1D relative attention: a learned vector per query-key offset, dotted with the query,
              added as a bias to the attention logits (see `relative_logits`).
The [class] token gets the first row of a learned 1D table; for the 2D variants it gets none (it is a
learned vector already, so a learned constant added to it would be redundant).

Where (ViTConfig.posemb_where): once at the input (Eq. 1), a learned set before every layer, or one set
added before every layer.  The ViT reads E_pos through one method, `VisionTransformer.position_embeddings(grid)`;
everything that depends on the variant is here: the learned tables and their keys (`learned_tables`,
`relative_table`, `init_`), E_pos for a patch grid (`lookup`) and where it is added (`add`).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.models.configs import PosEmbWhere, ViTConfig

ResampleMethod = Literal["bilinear", "bicubic"]
TABLE_KEYS = ("pos_embed", "pos_embed_x", "pos_embed_y", "rel_pos")  # state-dict names (last part) of learned tables
INIT_STD = 0.02  # AddPositionEmbs: normal(stddev=0.02); the relative tables alike


def learned_tables(
    config: ViTConfig, grid: tuple[int, int], num_prefix_tokens: int
) -> tuple[nn.Parameter | None, nn.Parameter | None, nn.Parameter | None]:
    """The absolute tables of `config.posemb` as (pos_embed, pos_embed_x, pos_embed_y), zero until `init_`.

    learned_1d: pos_embed (S, prefix + gh*gw, D); learned_2d: pos_embed_x (S, gw, D/2) and pos_embed_y
    (S, gh, D/2); other variants learn no absolute table.  S = L with posemb_where="per_layer", else 1.
    """
    sets = config.depth if config.posemb_where == "per_layer" else 1
    width, (gh, gw) = config.hidden_size, grid
    if config.posemb == "learned_1d":
        return nn.Parameter(torch.zeros(sets, num_prefix_tokens + gh * gw, width)), None, None
    if config.posemb == "learned_2d":
        return None, nn.Parameter(torch.zeros(sets, gw, width // 2)), nn.Parameter(torch.zeros(sets, gh, width // 2))
    return None, None, None


def relative_table(config: ViTConfig, num_tokens: int) -> nn.Parameter | None:
    """posemb="relative": one learned D_h-vector per offset i - j in -(T-1) ... T-1 (zero until `init_`)."""
    return nn.Parameter(torch.zeros(2 * num_tokens - 1, config.head_dim)) if config.posemb == "relative" else None


@torch.no_grad()
def init_(model: nn.Module) -> None:
    """Draw every learned position table of `model` (names in TABLE_KEYS) from N(0, 0.02), in registration order."""
    for name, param in model.named_parameters():
        if name.rsplit(".", 1)[-1] in TABLE_KEYS:
            nn.init.normal_(param, std=INIT_STD)


def lookup(
    config: ViTConfig,
    grid: tuple[int, int],
    stored_grid: tuple[int, int],
    num_prefix_tokens: int,
    tables: tuple[Tensor | None, Tensor | None, Tensor | None],
    like: Tensor,
) -> Tensor | None:
    """E_pos for a patch grid: (S, prefix + gh*gw, D), or None (posemb "none" / "relative").

    `tables` are `learned_tables`' (learned at `stored_grid`, resampled in 2D to `grid`, Sec. 3.2);
    the fixed sine-cosine table is made in the dtype and on the device of `like`.
    """
    pos_embed, pos_embed_x, pos_embed_y = tables
    if config.posemb == "learned_1d":
        return resample_pos_embed(pos_embed, grid, stored_grid, num_prefix_tokens)
    if config.posemb == "learned_2d":
        table = learned_2d(pos_embed_x, pos_embed_y, grid)
    elif config.posemb == "sincos_2d":
        table = sincos_2d(grid, config.hidden_size).to(like)
    else:
        return None
    return F.pad(table, (0, 0, num_prefix_tokens, 0))  # the [class] token gets no 2D position


def add(z: Tensor, pos: Tensor | None, where: PosEmbWhere, layer: int | None = None) -> Tensor:
    """z + E_pos where App. D.4 puts it: at the input (layer None) for "input"; before layer `layer` (0-based)
    its own set for "per_layer", the one set for "shared_per_layer".  Elsewhere z itself."""
    if pos is None or (where == "input") != (layer is None):
        return z
    return z + pos[layer if where == "per_layer" else 0]


def resample_pos_embed(
    posemb: Tensor,
    new_grid: tuple[int, int],
    old_grid: tuple[int, int],
    num_prefix_tokens: int = 1,
    method: ResampleMethod = "bilinear",
) -> Tensor:
    """2D-interpolate learned 1D position embeddings to another patch grid (Sec. 3.2).

    The prefix ([class]) rows are kept aside unchanged.  "bilinear" maps corner patches onto corner
    patches (align_corners=True), as the official code's `scipy.ndimage.zoom(order=1)`, so an
    embedding that is linear in (row, col) stays linear; "bicubic" samples pixel centres
    (align_corners=False), as timm does.

    Args:
        posemb: (S, num_prefix_tokens + gh*gw, D), S = number of embedding sets (1, or L per layer).
    Returns:
        (S, num_prefix_tokens + new_gh*new_gw, D); `posemb` itself when the grids are equal.
    """
    if tuple(new_grid) == tuple(old_grid):
        return posemb
    sets, tokens, dim = posemb.shape
    if tokens != num_prefix_tokens + old_grid[0] * old_grid[1]:
        raise ValueError(
            f"position embedding has {tokens} tokens, expected {num_prefix_tokens} + {old_grid[0]}x{old_grid[1]}"
        )
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
    grid = grid.reshape(sets, old_grid[0], old_grid[1], dim).permute(0, 3, 1, 2)  # (S, N, D) -> (S, D, gh, gw)
    align = method == "bilinear"
    grid = F.interpolate(grid.float(), size=tuple(new_grid), mode=method, align_corners=align)
    grid = grid.to(posemb.dtype).permute(0, 2, 3, 1).reshape(sets, -1, dim)  # (S, D, gh', gw') -> (S, N', D)
    return torch.cat([prefix, grid], dim=1)


def resample_1d(table: Tensor, length: int) -> Tensor:
    """Linearly resample a (S, n, d) table along n to `length` rows, end points fixed."""
    if table.shape[1] == length:
        return table
    out = F.interpolate(table.transpose(1, 2).float(), size=length, mode="linear", align_corners=True)
    return out.transpose(1, 2).to(table.dtype)


def learned_2d(pos_x: Tensor, pos_y: Tensor, grid: tuple[int, int]) -> Tensor:
    """Concatenate X and Y embeddings per patch (App. D.4 "2-dimensional positional embedding").

    Args:
        pos_x: (S, gw0, D/2) column embeddings; pos_y: (S, gh0, D/2) row embeddings.
    Returns:
        (S, gh*gw, D) in raster order; the tables are resampled when the grid differs.
    """
    gh, gw = grid
    pos_x, pos_y = resample_1d(pos_x, gw), resample_1d(pos_y, gh)
    sets, _, half = pos_x.shape
    x = pos_x[:, None, :, :].expand(sets, gh, gw, half)  # column c for every row
    y = pos_y[:, :, None, :].expand(sets, gh, gw, half)  # row r for every column
    return torch.cat([x, y], dim=-1).reshape(sets, gh * gw, 2 * half)


def sincos_2d(grid: tuple[int, int], dim: int, temperature: float = 10_000.0) -> Tensor:
    """Fixed 2D sine-cosine embedding, (1, gh*gw, dim): [sin(x w), cos(x w), sin(y w), cos(y w)]."""
    gh, gw = grid
    y, x = torch.meshgrid(torch.arange(gh, dtype=torch.float32), torch.arange(gw, dtype=torch.float32), indexing="ij")
    quarter = dim // 4
    omega = 1.0 / temperature ** (torch.arange(quarter, dtype=torch.float32) / max(quarter - 1, 1))
    x = x.reshape(-1, 1) * omega  # (N, D/4)
    y = y.reshape(-1, 1) * omega
    return torch.cat([x.sin(), x.cos(), y.sin(), y.cos()], dim=1)[None]


def relative_logits(q: Tensor, table: Tensor) -> Tensor:
    """1D relative attention logits (App. D.4): bias[b, h, i, j] = q[b, h, i] . r[i - j].

    The query attends to relative embeddings used as keys; the result is added to the content
    logits before the softmax.

    Args:
        q: (B, k, T, D_h) queries; table: (2*T0 - 1, D_h), offsets -(T0-1) ... T0-1 (resampled if T != T0).
    Returns:
        (B, k, T, T)
    """
    tokens = q.shape[-2]
    table = resample_1d(table[None], 2 * tokens - 1)[0]
    scores = q @ table.T  # (B, k, T, D_h) @ (D_h, 2T-1) -> (B, k, T, 2T-1)
    pos = torch.arange(tokens, device=q.device)
    index = (pos[:, None] - pos[None, :] + tokens - 1).expand(*q.shape[:-2], tokens, tokens)  # (T, T) -> (B, k, T, T)
    return scores.gather(-1, index)


def check_images(x: Tensor, channels: int) -> None:
    """A batch of images (N, C, H, W) of `channels` channels, or a ValueError that names the fix."""
    if x.dim() != 4:
        fix = "add one with x.unsqueeze(0)" if x.dim() == 3 else "resize or stack the images to that shape"
        raise ValueError(f"the model takes a batch of images (N, {channels}, H, W), got shape {tuple(x.shape)}: {fix}")
    if x.shape[1] != channels:
        hint = {1: " (PIL's .convert('L'))", 3: " (PIL's .convert('RGB'), or x.expand(-1, 3, -1, -1) for grayscale)"}
        raise ValueError(
            f"the model takes images of {channels} channels, got {x.shape[1]} (shape {tuple(x.shape)}): convert "
            f"them{hint.get(channels, '')}"
        )


def check_grid(height: int, width: int, stride: int) -> tuple[int, int]:
    """Patch grid of an input, or a ValueError that names the fix."""
    if height % stride or width % stride:
        fix_h = max(stride, round(height / stride) * stride)
        fix_w = max(stride, round(width / stride) * stride)
        raise ValueError(
            f"input of {height}x{width} pixels is not divisible by the patch size {stride}: "
            f"resize or crop it to {fix_h}x{fix_w} (e.g. --img-size {fix_h})"
        )
    return height // stride, width // stride
