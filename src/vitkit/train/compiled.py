"""torch.compile for training: the compiler check.

On the CPU, inductor writes C++ and needs a compiler (g++, clang++ or $CXX); without one, or on a
Python that torch.compile does not support, `compile_for_training` warns and keeps the eager
model.  Compiling one graph (forward + backward) takes 20-30 s on a 2-core CPU, and a run needs one
per phase of the schedule (PatchDropout on or off, each training resolution).  Left to the first
step of each phase, that time would count on a fitted budget's clock and eat the warm-up of the
learning rate: the trainer compiles every graph the run still needs in its rehearsal
(train/estimate.py), before the clock starts.
"""

from __future__ import annotations

import logging
import os
import shutil

import torch
from torch import nn

log = logging.getLogger("vitkit.train")


def cpp_compiler() -> str | None:
    """Path of the C++ compiler inductor would use on the CPU, or None."""
    for name in (os.environ.get("CXX"), "g++", "clang++", "c++"):
        path = shutil.which(name) if name else None
        if path:
            return path
    return None


def compile_for_training(model: nn.Module, device: torch.device) -> nn.Module:
    """`torch.compile(model)` with static shapes (one graph per phase), or `model` where it cannot compile."""
    if not torch._dynamo.is_dynamo_supported():  # e.g. a Python version this torch cannot trace
        log.warning("run.compile: torch.compile is not supported on this Python/torch; training eagerly")
        return model
    if device.type == "cpu" and cpp_compiler() is None:
        log.warning("run.compile: no C++ compiler (g++, clang++ or $CXX) for torch.compile's CPU code; "
                    "training eagerly (install g++ to compile)")
        return model
    return torch.compile(model, dynamic=False)
