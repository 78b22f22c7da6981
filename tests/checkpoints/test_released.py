"""Released official checkpoints (`slow`: they are not in the repository and never downloaded by tests).

Put any of these files, under their released names, in ../shared/weights/ beside the checkout:
  ViT-B_16.npz        gs://vit_models/imagenet21k/ViT-B_16.npz            (pre_logits 768, 21843 classes)
  ViT-B_16-224.npz    gs://vit_models/imagenet21k+imagenet2012/ViT-B_16-224.npz  (no pre_logits, 1000 classes)
  R50+ViT-B_16.npz    gs://vit_models/imagenet21k/R50+ViT-B_16.npz        (hybrid, ResNet stages (3, 4, 9))
  Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0.npz  gs://vit_models/augreg/ (ViT-Ti/16)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vitkit.checkpoints import official, read
from vitkit.models.configs import HybridConfig

WEIGHTS = Path(__file__).resolve().parents[3] / "shared" / "weights"
EXPECTED = {  # file -> (hidden, depth, heads, mlp, patch, representation_size, classes, hybrid stages)
    "ViT-B_16.npz": (768, 12, 12, 3072, 16, 768, 21843, None),
    "ViT-B_16-224.npz": (768, 12, 12, 3072, 16, None, 1000, None),
    "R50+ViT-B_16.npz": (768, 12, 12, 3072, 1, 768, 21843, (3, 4, 9)),
    "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0.npz": (192, 12, 3, 768, 16, None, 21843, None),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_released_checkpoint(name):
    path = WEIGHTS / name
    if not path.is_file():
        pytest.skip(f"{path} is not present (released weights are never downloaded by tests)")
    checkpoint = read(path)
    config = checkpoint.config
    vit = config.vit if isinstance(config, HybridConfig) else config
    stages = config.resnet_layers if isinstance(config, HybridConfig) else None
    got = (
        vit.hidden_size,
        vit.depth,
        vit.num_heads,
        vit.mlp_dim,
        vit.patch_size,
        vit.representation_size,
        vit.num_classes,
        stages,
    )
    assert got == EXPECTED[name]
    arrays = official.normalise_layout(official.read_arrays(path))
    back = official.from_vitkit(checkpoint)
    for key, value in back.items():  # official -> vitkit -> official is exact
        assert np.array_equal(value, np.asarray(arrays[key]).reshape(value.shape)), key
    with torch.no_grad():
        logits = checkpoint.model(torch.zeros(1, 3, 224, 224))
    assert torch.isfinite(logits).all() and logits.std() > 0
