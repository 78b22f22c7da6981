"""Mean attention distance of a trained arm (Sec. 4.5, Figure 7 right; App. D.7, Figure 11), for the
`attention` study: per layer and head, averaged over a fixed set of test images (inspect/attention.py
holds the definition; this gathers the weights of every layer batch by batch)."""

from __future__ import annotations

import math
from typing import Any

import torch

from vitkit.device import pick_device
from vitkit.eval.features import batches, resolution
from vitkit.inspect.attention import mean_attention_distance, patch_distances


@torch.no_grad()
def attention_distances(checkpoint: Any, images: Any, device: str = "auto", batch_size: int = 32) -> dict[str, Any]:
    """{"per_layer_head": (L, k) pixels, "uniform": the distance of uniform attention, "pixels_per_token", ...}."""
    model = checkpoint.model.eval()
    if not hasattr(model, "forward_intermediates") or not hasattr(model, "blocks"):
        raise ValueError(f"{type(model).__name__} has no attention: the attention study needs a ViT or a hybrid")
    target = pick_device(device)
    model.to(target)
    size, prefix = resolution(checkpoint), model.num_prefix_tokens
    total, count, grid, pixels = None, 0, (0, 0), 0
    for inputs, _ in batches(checkpoint, images, batch_size, size, target):
        named = model.forward_intermediates(inputs)
        attns = [named[f"attn{i:02d}"] for i in range(len(model.blocks))]  # L x (B, k, T, T)
        side = math.isqrt(attns[0].shape[-1] - prefix)
        grid, pixels = (side, side), size / side  # square inputs: input pixels per token along a side
        distances = torch.stack([mean_attention_distance(a, grid, pixels, prefix) for a in attns])  # (L, k)
        total = distances * len(inputs) if total is None else total + distances * len(inputs)
        count += len(inputs)
    if total is None:
        raise ValueError("no images to measure attention distances on")
    per = (total / count).cpu()
    return {
        "per_layer_head": per.tolist(),
        "uniform": float(patch_distances(grid, pixels).mean()),
        "pixels_per_token": pixels,
        "grid": list(grid),
        "img_size": size,
        "images": count,
    }
