"""MPP pre-training on the engine's parts: paper settings, resume, checkpoints that load as a plain ViT."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file

import vitkit
from vitkit.data.sources import ImageSet
from vitkit.data.transforms import AugmentConfig
from vitkit.models import create_model
from vitkit.models.configs import ViTConfig
from vitkit.ssl.masked_patch import MaskedPatchPrediction, MPPConfig
from vitkit.ssl.pretrain import MPPState, mpp_train_config, pretrain, train_step, warmup_of
from vitkit.train.config import DataConfig, OptimConfig, RunConfig, TrainConfig
from vitkit.train.optim import build_optimizer

TINY = {"hidden_size": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64}


def tiny_config(out, epochs: float = 2, **run) -> TrainConfig:
    """A supervised tiny config (as a recipe would give), turned into an MPP one."""
    base = TrainConfig(
        model=ViTConfig(img_size=32, patch_size=8, num_classes=10, representation_size=32, **TINY),
        data=DataConfig(uri="npz:unused", batch_size=8, epochs=epochs, workers=0),
        augment=AugmentConfig(crop="none", flip=True, mixup=0.8, label_smoothing=0.1),
        optim=OptimConfig(name="sgd", lr=0.1, weight_decay=0.0),
        run=RunConfig(out=str(out), log_every=1, checkpoint_every=100, progress=False, tensorboard=False, **run),
    )
    return mpp_train_config(base)


def image_set(count: int = 32, channels: int = 3, seed: int = 0) -> ImageSet:
    images = torch.randint(0, 256, (count, channels, 32, 32), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return ImageSet(images=images, labels=torch.arange(count) % 2, class_names=["a", "b"])


def test_paper_settings_replace_the_supervised_ones(tmp_path):
    config = tiny_config(tmp_path)
    assert config.model.num_classes == 0 and config.model.representation_size is None
    optim = config.optim
    assert (optim.name, optim.lr, optim.betas, optim.schedule, optim.clip_norm, optim.weight_decay) == (
        "adamw", 2e-4, (0.9, 0.999), "cosine", 1.0, 0.1)
    assert config.augment.mixup == 0 and config.augment.label_smoothing == 0 and config.augment.flip
    assert warmup_of(config, 1_000_000) == 10_000  # the paper's 10k of 1M
    assert warmup_of(config, 1000) == 50  # scaled down: 5% of a small run
    assert warmup_of(mpp_train_config(config, warmup_steps=7), 1000) == 7


def test_checkpoint_loads_as_plain_vit_without_mpp_keys(tmp_path):
    summary = pretrain(tiny_config(tmp_path / "run"), MPPConfig(), train=image_set(), held_out=image_set(8, seed=1))
    assert summary["status"] == "finished" and summary["step"] == 8
    final = tmp_path / "run" / "checkpoints" / "final"
    assert summary["checkpoint"] == str(final)
    keys = set(load_file(str(final / "model.safetensors")))
    reference = create_model("vit_ti16", img_size=32, patch_size=8, num_classes=0, **TINY)
    assert keys == set(reference.state_dict())  # exactly a ViT's keys: no mask_token, no MPP head
    model = vitkit.load(final)
    assert isinstance(model, vitkit.models.VisionTransformer)
    assert model.forward_features(torch.zeros(2, 3, 32, 32)).shape == (2, 32)
    meta = json.loads((final / "config.json").read_text())
    assert meta["provenance"]["objective"] == "masked_patch_prediction"
    assert meta["provenance"]["mpp"]["target"] == "mean_color"
    assert not torch.equal(model.patch_embed.proj.weight, reference.patch_embed.proj.weight)  # it trained
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == list(range(1, 9))
    assert records[0]["loss"] == pytest.approx(math.log(512), abs=1e-5)  # zero head: uniform over 512 colours
    assert records[-1]["split"] == "test" and 0 <= records[-1]["top1"] <= records[-1]["top5"] <= 1
    state = torch.load(final.parent / "step_0000008" / "train_state.pt", weights_only=True)
    assert set(state["mpp"]) == {"mask_token", "head.weight", "head.bias"}  # the MPP parts live in the train state


def test_interrupted_run_resumes_bit_identically(tmp_path):
    pretrain(tiny_config(tmp_path / "straight"), MPPConfig(), train=image_set(), eval_images=0)
    first = pretrain(tiny_config(tmp_path / "resumed", max_minutes=1e-9), MPPConfig(), train=image_set(), eval_images=0)
    assert first["status"] == "time_budget" and first["step"] == 1  # stops after one step, checkpoint saved
    second = pretrain(tiny_config(tmp_path / "resumed"), MPPConfig(), train=image_set(), eval_images=0)
    assert second["status"] == "finished" and second["step"] == 8
    a = load_file(str(tmp_path / "straight" / "checkpoints" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "checkpoints" / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    sa = torch.load(tmp_path / "straight" / "checkpoints" / "step_0000008" / "train_state.pt", weights_only=True)
    sb = torch.load(tmp_path / "resumed" / "checkpoints" / "step_0000008" / "train_state.pt", weights_only=True)
    assert all(torch.equal(sa["mpp"][k], sb["mpp"][k]) for k in sa["mpp"])


def test_resume_refuses_another_configuration(tmp_path):
    pretrain(tiny_config(tmp_path, epochs=1), MPPConfig(), train=image_set(), eval_images=0)
    with pytest.raises(ValueError, match="another configuration"):
        pretrain(tiny_config(tmp_path, epochs=1), MPPConfig(target="pixels"), train=image_set(), eval_images=0)


def test_pixels_target_and_grayscale_run(tmp_path):
    config = tiny_config(tmp_path, epochs=1)
    config = config.__class__(**{**config.__dict__, "model": ViTConfig(img_size=32, patch_size=8, in_chans=1, num_classes=0, **TINY),
                                 "data": DataConfig(uri="npz:unused", batch_size=8, epochs=1, mean=(0.5,), std=(0.5,))})
    summary = pretrain(config, MPPConfig(target="pixels"), train=image_set(16, 1), held_out=image_set(4, 1))
    assert summary["status"] == "finished" and summary["test"]["top1"] is None and summary["test"]["loss"] > 0
    assert vitkit.load(tmp_path / "checkpoints" / "final").config.in_chans == 1


def test_non_finite_loss_skips_the_update(tmp_path):
    model = MaskedPatchPrediction(create_model("vit_ti16", img_size=32, patch_size=8, num_classes=0, **TINY), MPPConfig())
    optimizer = build_optimizer(model, tiny_config(tmp_path).optim, 1e-3)
    before = [p.detach().clone() for p in model.parameters()]
    out = train_step(model, optimizer, [torch.full((2, 3, 32, 32), float("nan"))], torch.Generator().manual_seed(0), 1e-3, 1.0, None)
    assert out["skipped"] and not math.isfinite(out["loss"])
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    good = train_step(model, optimizer, [torch.rand(2, 3, 32, 32)], torch.Generator().manual_seed(0), 1e-3, 1.0, None)
    assert not good["skipped"] and good["loss"] == pytest.approx(math.log(512), abs=1e-5)


def test_mpp_state_refuses_a_mismatched_head(tmp_path):
    pixels = MaskedPatchPrediction(create_model("vit_ti16", img_size=32, patch_size=8, num_classes=0, **TINY), MPPConfig(target="pixels"))
    colours = MaskedPatchPrediction(create_model("vit_ti16", img_size=32, patch_size=8, num_classes=0, **TINY), MPPConfig())
    make = lambda m: MPPState(model=m, module=m.encoder, optimizer=torch.optim.AdamW(m.parameters()),  # noqa: E731
                              generator=torch.Generator(), mpp=m)
    with pytest.raises(ValueError, match="do not fit"):
        make(colours).load_state_dict(make(pixels).state_dict())


def test_mpp_config_keeps_hybrids_and_refuses_resnets(tmp_path):
    from vitkit.models.configs import HybridConfig, ResNetConfig

    base = tiny_config(tmp_path)
    hybrid = HybridConfig(vit=ViTConfig(img_size=32, patch_size=1, num_classes=10, representation_size=32, **TINY),
                          resnet_layers=(1, 1))
    converted = mpp_train_config(base.__class__(**{**base.__dict__, "model": hybrid}))
    assert converted.model.vit.num_classes == 0 and converted.model.vit.representation_size is None
    assert converted.model.resnet_layers == (1, 1)
    with pytest.raises(ValueError, match="ViT or hybrid"):
        mpp_train_config(base.__class__(**{**base.__dict__, "model": ResNetConfig(num_classes=10)}))
