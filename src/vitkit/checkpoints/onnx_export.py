"""ONNX export of a vitkit model (opset >= 17, dynamic batch), checked with onnxruntime when installed.

onnx / onnxruntime are the optional `onnx` extra (`pip install vitkit[onnx]`).
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import math
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from vitkit.atomic import atomic_write
from vitkit.models.configs import image_size, in_channels

log = logging.getLogger(__name__)

MIN_OPSET = 17
INPUT, OUTPUT = "pixels", "logits"
TOLERANCE = 1e-2  # max |logits| difference of a faithful float32 export (1e-6 to 1e-4; a broken one: O(1))


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise ValueError(f"ONNX export needs the '{module}' package: pip install 'vitkit[onnx]'")


class _Logits(nn.Module):
    """forward(pixels) -> logits only: the TorchScript exporter would pass the model's keyword-only
    options (e.g. the training-time `patch_dropout`) positionally."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.model(pixels)


def newest_opset() -> int | None:
    """The newest opset this torch's exporter writes, where it says (None: not said; the exporter decides)."""
    try:
        from torch.onnx import _constants
    except ImportError:
        return None
    newest = getattr(_constants, "ONNX_MAX_OPSET", None)
    return newest if isinstance(newest, int) else None


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike,
    opset: int = MIN_OPSET,
    batch_size: int = 2,
    check: Callable[[Path], None] | None = None,
) -> Path:
    """Write `model` (eval mode, fp32, CPU) as ONNX with a dynamic batch axis; input (B, C, H, W) "pixels".

    The input resolution is the model's `img_size`; change it with `read(..., img_size=N)` first.  `check(file)`
    runs on the written file before it is renamed into place: a check cut short leaves no file.
    """
    _require("onnx")
    if opset < MIN_OPSET:
        raise ValueError(f"opset {opset} is too old: use {MIN_OPSET} or newer")
    newest = newest_opset()
    if newest is not None and opset > newest:
        raise ValueError(f"opset {opset} is newer than this torch exports: use {MIN_OPSET} to {newest}")
    model = model.eval().float().cpu()
    size, chans = image_size(model.config), in_channels(model.config)
    example = torch.zeros(batch_size, chans, size, size)
    path = Path(path)

    def _export(tmp: Path) -> None:
        import onnx

        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # the TorchScript tracer warns about Python-level shape checks
            torch.onnx.export(
                _Logits(model), (example,), str(tmp), opset_version=opset, input_names=[INPUT], output_names=[OUTPUT],
                dynamic_axes={INPUT: {0: "batch"}, OUTPUT: {0: "batch"}}, dynamo=False,
            )  # fmt: skip
        onnx.checker.check_model(str(tmp))
        if check is not None:
            check(tmp)

    before = set(path.parent.iterdir())
    try:
        atomic_write(path, _export)
    except BaseException:  # a model over 2 GB writes its tensors beside the file: not left loose either
        for written in set(path.parent.iterdir()) - before:
            if written.is_file():
                written.unlink(missing_ok=True)
        raise
    log.info("wrote %s (opset %d, input %s x %d x %d)", path, opset, chans, size, size)
    return path


def check_onnx(model: nn.Module, path: str | os.PathLike, batch_size: int = 3, seed: int = 0) -> float:
    """max |logits_onnxruntime - logits_torch| on a random batch (of another size than the export's)."""
    _require("onnxruntime")
    import onnxruntime

    model = model.eval().float().cpu()
    size, chans = image_size(model.config), in_channels(model.config)
    x = torch.randn(batch_size, chans, size, size, generator=torch.Generator().manual_seed(seed))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (onnx_logits,) = session.run([OUTPUT], {INPUT: x.numpy()})
    with torch.no_grad():
        torch_logits = model(x)
    return float((torch.from_numpy(onnx_logits) - torch_logits).abs().max())


def check_export(model: nn.Module, path: str | os.PathLike, opset: int) -> float:
    """`check_onnx` of the file `export_onnx` wrote.  A zero-initialised head (a new one: `--num-classes`) gives
    the same logits for every image, so their agreement says nothing of the encoder: then a copy of the model
    with a random head is exported to a temporary file and checked too, and the larger difference returned."""
    diff = check_onnx(model, path)
    weights = head_weights(model)
    if not weights or any(weight.count_nonzero() > 0 for weight in weights):
        return diff
    probe = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in head_weights(probe):
            weight.normal_(0.0, 1.0, generator=generator)
    with tempfile.TemporaryDirectory(prefix="vitkit-onnx-") as scratch:
        checked = export_onnx(probe, Path(scratch) / "random_head.onnx", opset=opset)
        other = check_onnx(probe, checked)
    return math.nan if math.isnan(diff) or math.isnan(other) else max(diff, other)


def head_weights(model: nn.Module) -> list[torch.Tensor]:
    """The weights of the model's classification head (a ViT's `head`, a ResNet's `head.fc`); none without one."""
    head = getattr(model, "head", None)
    if not isinstance(head, nn.Module):
        return []
    return [param for name, param in head.named_parameters() if name.rsplit(".", 1)[-1] == "weight"]


def verified_export(model: nn.Module, path: str | os.PathLike, opset: int = MIN_OPSET) -> tuple[Path, float | None]:
    """`export_onnx`, then `check_export` where onnxruntime is installed: (the file, the largest |logits|
    difference, None where not checked).  A ValueError where the difference passes TOLERANCE (or is NaN): the
    export is not faithful, and the file is kept to inspect.  The check runs before the file is in place, so an
    interrupted check leaves no unchecked file."""
    found: dict[str, float | None] = {"diff": None}

    def check(written: Path) -> None:
        found["diff"] = check_export(model, written, opset) if onnxruntime_available() else None

    out = export_onnx(model, path, opset=opset, check=check)
    diff = found["diff"]
    if diff is not None and not diff <= TOLERANCE:  # NaN too
        raise ValueError(
            f"wrote {out}, but onnxruntime's logits differ from PyTorch's by up to {diff:.3g}, above the "
            f"tolerance of {TOLERANCE:g}: the export is not faithful to the model (the file is kept to inspect)"
        )
    return out, diff


def onnxruntime_available() -> bool:
    return importlib.util.find_spec("onnxruntime") is not None
