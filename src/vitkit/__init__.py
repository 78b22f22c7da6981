"""vitkit: the Vision Transformer of "An Image is Worth 16x16 Words" (Dosovitskiy et al., ICLR 2021).

Public API: `create_model`, `list_models`, `load`, `save`.
"""

from vitkit.checkpoints import load, save
from vitkit.models import create_model, list_models

__all__ = ["create_model", "list_models", "load", "save"]
__version__ = "0.1.0"
