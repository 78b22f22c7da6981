"""How large a model a checkpoint may ask for: its size is computed on the meta device (shapes, no
memory) and refused above a limit before anything real is built; so is a model whose one image would take
absurd work (check_work), which a few kB of config can ask for.

The default limit is the memory available now (MemAvailable, or a container's own limit): a model
larger than that cannot be built here at all.  It is a guard against absurd sizes, not a promise:
reading holds the file's tensors and the model at once.  `max_bytes=` on `vitkit.load` /
`vitkit.checkpoints.read` (the CLI's `--max-model-gb`) sets another.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from vitkit.checkpoints.validate import CheckpointError
from vitkit.host import available_memory
from vitkit.models import build_model
from vitkit.models.configs import HybridConfig, ModelConfig, ResNetConfig, ViTConfig, image_size, in_channels
from vitkit.models.flops import backbone_bound, vit_flops

HOW_TO_RAISE = (
    "pass max_bytes= to vitkit.load / vitkit.checkpoints.read, or --max-model-gb to vitkit convert / export-onnx"
)


class _NoRandomInit(TorchFunctionMode):
    """Skips random initialisers on meta tensors, which hold no values: torch's meta `normal_` runs
    through its Python reference kernels and imports the compiler (~2 s) for nothing."""

    SKIPPED = frozenset({Tensor.normal_, Tensor.uniform_, nn.init.normal_, nn.init.uniform_, nn.init.trunc_normal_})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")
        if func in self.SKIPPED and isinstance(target, Tensor) and target.is_meta:
            return target
        return func(*args, **kwargs)


def meta_model(config: ModelConfig) -> nn.Module:
    """The model `config` describes, on the meta device: every shape, no memory."""
    with torch.device("meta"), _NoRandomInit():
        return build_model(config)


def model_bytes(config: ModelConfig) -> int:
    """Bytes of the model's parameters and buffers (float32)."""
    return sum(t.numel() * t.element_size() for t in meta_model(config).state_dict().values())


def resolve(max_bytes: int | None) -> tuple[int, str]:
    """The limit in bytes and where it comes from."""
    if max_bytes is None:
        return available_memory(), "the memory available now"
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, float)) or not max_bytes >= 0:  # NaN too
        raise ValueError(f"max_bytes must be a number of bytes >= 0 (inf: no limit), got {max_bytes!r}")
    if math.isinf(max_bytes):
        return sys.maxsize, "no limit"
    return int(max_bytes), "the limit given"


def size_words(count: int) -> str:
    """A byte count in the unit that keeps its digits: 1.2 GB, 21.9 MB, 100 bytes."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"


def check_model(config: ModelConfig, source: str, max_bytes: int | None) -> dict[str, Tensor]:
    """The model's state dict on the meta device, once its size and its work per image are within limits."""
    check_work(config, source)
    state = meta_model(config).state_dict()
    need = sum(t.numel() * t.element_size() for t in state.values())
    limit, why = resolve(max_bytes)
    if need > limit:
        raise CheckpointError(
            f"{source}: the model needs {size_words(need)} ({need} bytes of float32 weights), above the limit "
            f"of {size_words(limit)} ({why}); if this machine can hold it, {HOW_TO_RAISE}"
        )
    return state


def check_file(path: Path, max_bytes: int | None) -> None:
    """A file read whole into memory (a legacy torch pickle) is refused above the limit."""
    size = path.stat().st_size
    limit, why = resolve(max_bytes)
    if size > limit:
        raise CheckpointError(
            f"{path}: {size_words(size)} would be read into memory, above the limit of {size_words(limit)} ({why}); "
            f"if this machine can hold it, {HOW_TO_RAISE}"
        )


# One image's work above these is no model of the paper's practice but a damaged or hostile config: ViT-G/14 at
# 518 px, larger than any released checkpoint, takes about 6 TFLOP and 0.2 GB for its attention maps.
MAX_IMAGE_FLOPS = 5 * 10**13
MAX_IMAGE_BYTES = 4 << 30
ATTENTION_FLOOR = 64  # a token pair costs at least what it does at this width: narrower ones run no faster


def image_work(config: ModelConfig) -> tuple[int, int]:
    """(FLOPs, bytes) of one image through the model, closed-form bounds: its forward FLOPs, with every token
    pair of attention counted at least ATTENTION_FLOOR wide; the largest of its input, a convolution's output,
    a layer's token activations and one layer's attention maps (float32, as `inspect` and `serve` keep them)."""
    side = image_size(config)
    flops, biggest = 0, in_channels(config) * side * side * 4
    if isinstance(config, ResNetConfig | HybridConfig):
        layers = config.layers if isinstance(config, ResNetConfig) else config.resnet_layers
        flops, activations = backbone_bound(layers, config.width_factor, in_channels(config), side)
        biggest = max(biggest, activations)
    if isinstance(config, ViTConfig | HybridConfig):
        vit = config.vit if isinstance(config, HybridConfig) else config
        stride = config.stride if isinstance(config, HybridConfig) else 1
        grid = vit.img_size // (vit.patch_size * stride)
        flops += vit_flops(vit, grid * vit.patch_size)  # the encoder sees the backbone's grid as its image
        if isinstance(config, HybridConfig):  # whose channels are the backbone's, not the image's
            stages = len(config.resnet_layers)
            channels = 64 * config.width_factor * (4 * 2 ** (stages - 1) if stages else 1)
            flops += 2 * grid * grid * vit.patch_size**2 * vit.hidden_size * (channels - vit.in_chans)
        tokens = grid * grid + 1
        flops += vit.depth * 4 * tokens * tokens * max(ATTENTION_FLOOR - vit.hidden_size, 0)
        biggest = max(biggest, tokens * max(vit.mlp_dim, 3 * vit.hidden_size) * 4, vit.num_heads * tokens**2 * 4)
    return flops, biggest


def check_work(
    config: ModelConfig, source: str, remedy: str = "the checkpoint's config is damaged or not a model to run"
) -> None:
    """Refuses a model whose one image would take more than MAX_IMAGE_FLOPS or MAX_IMAGE_BYTES: a checkpoint of a
    few kB (an 8192-px ViT without position embeddings) can ask for hours of compute an image."""
    flops, biggest = image_work(config)
    if flops > MAX_IMAGE_FLOPS or biggest > MAX_IMAGE_BYTES:
        raise CheckpointError(
            f"{source}: one {image_size(config)}-px image through this model would take {flops / 1e12:,.1f} TFLOP "
            f"and {size_words(biggest)} for one activation, above vitkit's bounds of "
            f"{MAX_IMAGE_FLOPS / 1e12:.0f} TFLOP and {size_words(MAX_IMAGE_BYTES)} (several times the "
            f"largest released ViT at its largest resolution): {remedy}"
        )
