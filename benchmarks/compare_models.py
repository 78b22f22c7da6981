"""The ViTs that benchmarks/compare.py measures: the shapes (`Spec`, `SPECS`) and each library's build of one.

`build(library, spec)` gives vitkit's VisionTransformer ("vitkit", or "vitkit_erf" with exact GELU),
timm's `timm.models.vision_transformer.VisionTransformer` ("timm") or transformers'
`ViTForImageClassification` ("hf", returning the logits tensor), each with its library defaults.

timm imports torchvision at import time, and there is no CPU torchvision here: `import_timm_vit` stubs
`torchvision` and its submodules in `sys.modules` while timm's ViT module imports (timm's ViT itself
uses no torchvision code), and removes the stub again afterwards.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.machinery
import sys
import types
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from vitkit.models import create_model


@dataclass(frozen=True, kw_only=True)
class Spec:
    """One ViT shape (Table 1 names) and the batch it is measured with."""

    img_size: int
    patch_size: int  # P
    hidden_size: int  # D
    depth: int  # L
    num_heads: int  # k
    mlp_dim: int
    num_classes: int  # K
    batch_size: int


SPECS = {
    # A CIFAR-size ViT (32x32, patch 4, 192 wide, 6 deep, 3 heads, MLP 768).
    "cifar": Spec(
        img_size=32, patch_size=4, hidden_size=192, depth=6, num_heads=3, mlp_dim=768, num_classes=10, batch_size=64
    ),
    # ViT-Ti/16 at 224 px, 1000 classes.
    "ti224": Spec(
        img_size=224,
        patch_size=16,
        hidden_size=192,
        depth=12,
        num_heads=3,
        mlp_dim=768,
        num_classes=1000,
        batch_size=32,
    ),
}
# ViT-B/16 at 224 px, 1000 classes: the GPU comparison (compare.py --device cuda --compile).
SPECS["b16"] = dataclasses.replace(SPECS["ti224"], hidden_size=768, num_heads=12, mlp_dim=3072, batch_size=128)


# ---------------------------------------------------------------------------------------------
# timm without torchvision: a finder that answers every `torchvision...` import with an empty module


class _Placeholder:
    """Stands for any torchvision name timm touches at import time; using one raises."""

    def __init__(self, *args: object, **kwargs: object):
        raise ImportError("torchvision is stubbed in benchmarks/compare.py and cannot be used")


class _TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def attribute(name: str) -> Any:  # a distinct class per name (timm keys dicts by them)
            if name.startswith("__"):
                raise AttributeError(name)
            value = _placeholder_class(name)
            setattr(module, name, value)
            return value

        module.__getattr__ = attribute  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


class _PlaceholderMeta(type):
    def __getattr__(cls, name: str) -> Any:  # e.g. InterpolationMode.BILINEAR: distinct members
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder_class(name)
        setattr(cls, name, value)
        return value


def _placeholder_class(name: str) -> type:
    return _PlaceholderMeta(name, (_Placeholder,), {})


def import_timm_vit() -> type:
    """timm's VisionTransformer class, stubbing torchvision during timm's import only if it is not installed.

    The stub is removed again afterwards, so that other libraries (transformers probes for
    torchvision) still see that there is none.
    """
    try:
        import torchvision  # noqa: F401
    except ImportError:
        stub = _TorchvisionStub()
        sys.meta_path.insert(0, stub)
        try:
            from timm.models.vision_transformer import VisionTransformer
        finally:
            sys.meta_path.remove(stub)
            for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
                del sys.modules[name]
        return VisionTransformer
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer


# ---------------------------------------------------------------------------------------------
# The three models


class _LogitsOnly(nn.Module):
    """HF models return an output object; the step functions want the logits tensor."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images: Tensor) -> Tensor:
        return self.model(pixel_values=images).logits


def build(library: str, spec: Spec) -> nn.Module:
    if library.startswith("vitkit"):  # "vitkit_erf": exact-erf GELU as timm and HF (vitkit's default is tanh, as Flax)
        return create_model(
            "vit_ti16",
            num_classes=spec.num_classes,
            img_size=spec.img_size,
            patch_size=spec.patch_size,
            hidden_size=spec.hidden_size,
            depth=spec.depth,
            num_heads=spec.num_heads,
            mlp_dim=spec.mlp_dim,
            gelu="exact" if library == "vitkit_erf" else "tanh",
        )
    if library == "timm":
        timm_vit = import_timm_vit()
        return timm_vit(
            img_size=spec.img_size,
            patch_size=spec.patch_size,
            embed_dim=spec.hidden_size,
            depth=spec.depth,
            num_heads=spec.num_heads,
            mlp_ratio=spec.mlp_dim / spec.hidden_size,
            num_classes=spec.num_classes,
        )
    from transformers import ViTConfig as HFViTConfig
    from transformers import ViTForImageClassification

    config = HFViTConfig(
        image_size=spec.img_size,
        patch_size=spec.patch_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.depth,
        num_attention_heads=spec.num_heads,
        intermediate_size=spec.mlp_dim,
        num_labels=spec.num_classes,
    )
    return _LogitsOnly(ViTForImageClassification(config))
