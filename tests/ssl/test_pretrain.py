"""MPP pre-training runs: schedule, resume, and checkpoints that load as a plain ViT."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

import vitkit
from vitkit.models import create_model
from vitkit.ssl.masked_patch import MPPConfig
from vitkit.ssl.pretrain import PretrainConfig, learning_rate, pretrain

TINY = {"hidden_size": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64}


def tiny_config(**fields) -> PretrainConfig:
    base = dict(model="vit_ti16", img_size=32, patch_size=8, model_overrides=TINY, epochs=2, batch_size=8,
                log_every=1, checkpoint_every=100, eval_images=0)
    return PretrainConfig(**{**base, **fields})


@pytest.fixture
def images() -> torch.Tensor:
    return torch.randint(0, 256, (32, 3, 32, 32), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)


def test_schedule_warmup_then_cosine():
    assert learning_rate(0, 100, 10, 2e-4) == pytest.approx(2e-5)
    assert learning_rate(9, 100, 10, 2e-4) == pytest.approx(2e-4)
    assert learning_rate(55, 100, 10, 2e-4) == pytest.approx(1e-4)  # halfway through the cosine
    assert learning_rate(100, 100, 10, 2e-4) == pytest.approx(0.0, abs=1e-12)


def test_checkpoint_loads_as_plain_vit_without_mpp_keys(tmp_path, images):
    summary = pretrain(tiny_config(), tmp_path, images=images)
    assert summary["finished"] and summary["step"] == 8
    final = tmp_path / "checkpoints" / "final"
    keys = set(load_file(str(final / "model.safetensors")))
    reference = create_model("vit_ti16", img_size=32, patch_size=8, num_classes=0, **TINY)
    assert keys == set(reference.state_dict())  # exactly a ViT's keys: no mask_token, no MPP head
    model = vitkit.load(final)
    assert isinstance(model, vitkit.models.VisionTransformer)
    assert model.forward_features(torch.zeros(2, 3, 32, 32)).shape == (2, 32)
    meta = json.loads((final / "config.json").read_text())
    assert meta["provenance"]["objective"] == "masked_patch_prediction" and meta["provenance"]["step"] == 8
    assert not torch.equal(model.patch_embed.proj.weight, reference.patch_embed.proj.weight)  # it trained
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 9))
    assert records[0]["loss"] == pytest.approx(math.log(512), abs=1e-5)  # zero head: uniform over 512 colours


def test_interrupted_run_resumes_bit_identically(tmp_path, images):
    pretrain(tiny_config(), tmp_path / "straight", images=images)
    first = pretrain(tiny_config(max_minutes=1e-9), tmp_path / "resumed", images=images)  # stops after one step
    assert not first["finished"] and first["step"] == 1
    assert (tmp_path / "resumed" / "checkpoints" / "last" / "train_state.pt").is_file()
    second = pretrain(tiny_config(), tmp_path / "resumed", images=images)
    assert second["finished"] and second["step"] == 8
    a = load_file(str(tmp_path / "straight" / "checkpoints" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "checkpoints" / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_another_configuration(tmp_path, images):
    pretrain(tiny_config(epochs=1), tmp_path, images=images)
    with pytest.raises(ValueError, match="another configuration"):
        pretrain(tiny_config(epochs=1, mpp=MPPConfig(target="pixels")), tmp_path, images=images)


def test_pixels_target_and_grayscale_run(tmp_path):
    gray = torch.randint(0, 256, (16, 1, 32, 32), dtype=torch.uint8)
    summary = pretrain(tiny_config(epochs=1, mpp=MPPConfig(target="pixels")), tmp_path, images=gray, held_out=gray[:4])
    assert summary["finished"] and summary["test_accuracy"] is None and summary["test_loss"] > 0
    assert vitkit.load(tmp_path / "checkpoints" / "final").config.in_chans == 1


def test_bad_inputs_are_refused(tmp_path, images):
    with pytest.raises(ValueError, match="larger than"):
        pretrain(tiny_config(batch_size=64), tmp_path, images=images)
    with pytest.raises(ValueError, match="positive"):
        PretrainConfig(epochs=0)


def test_non_finite_loss_raises_naming_the_step_and_leaves_weights_alone():
    from vitkit.ssl.masked_patch import MaskedPatchPrediction
    from vitkit.ssl.pretrain import make_optimizer, train_step

    model = MaskedPatchPrediction(create_model("vit_ti16", img_size=32, patch_size=8, num_classes=0, **TINY), MPPConfig())
    before = [p.detach().clone() for p in model.parameters()]
    batch = torch.full((2, 3, 32, 32), float("nan"))
    with pytest.raises(ValueError, match="non-finite MPP loss .* at step 3"):
        train_step(model, make_optimizer(model, tiny_config()), batch, torch.Generator().manual_seed(0), 1e-3, 1.0, 3)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
