"""MPP pre-training on the engine: paper settings, resume, checkpoints that load as a plain ViT."""

from __future__ import annotations

import dataclasses
import json
import logging
import math

import pytest
import torch
from safetensors.torch import load_file

import vitkit
from signalkit import sigterm_on_first_call
from vitkit.data.sources import ImageSet
from vitkit.data.transforms import AugmentConfig
from vitkit.models import create_model
from vitkit.models.configs import ViTConfig
from vitkit.ssl.masked_patch import MaskedPatchPrediction, MPPConfig
from vitkit.train.assemble import Splits
from vitkit.train.config import DataConfig, OptimConfig, RunConfig, TrainConfig
from vitkit.train.objectives import MaskedPatchObjective, mpp_train_config
from vitkit.train.optim import build_optimizer
from vitkit.train.plan import warmup_steps
from vitkit.train.state import TrainState
from vitkit.train.step import StepSpec, train_step
from vitkit.train.trainer import train

TINY = {"hidden_size": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64}


def tiny_config(out, epochs: float = 2, **run) -> TrainConfig:
    """A supervised tiny config (as a recipe would give), turned into an MPP one.  Precision and compilation are
    pinned (fp32, eager): "auto" measures the host, and two runs compared for bit-identity must not differ there."""
    run = {"precision": "fp32", "compile": "off", **run}
    base = TrainConfig(
        model=ViTConfig(img_size=32, patch_size=8, num_classes=10, representation_size=32, **TINY),
        data=DataConfig(uri="npz:unused", batch_size=8, epochs=epochs, workers=0),
        augment=AugmentConfig(crop="none", flip=True, mixup=0.8, label_smoothing=0.1),
        optim=OptimConfig(name="sgd", lr=0.1, weight_decay=0.0),
        run=RunConfig(out=str(out), log_every=1, checkpoint_every=100, progress=False, tensorboard=False, **run),
    )
    return mpp_train_config(base)


def image_set(count: int = 32, channels: int = 3, seed: int = 0) -> ImageSet:
    images = torch.randint(
        0, 256, (count, channels, 32, 32), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8
    )
    return ImageSet(images=images, labels=torch.arange(count) % 2, class_names=["a", "b"])


def no_eval(config: TrainConfig) -> TrainConfig:
    return dataclasses.replace(config, mpp=dataclasses.replace(config.mpp, eval_images=0))


def test_paper_settings_replace_the_supervised_ones(tmp_path):
    config = tiny_config(tmp_path)
    assert config.model.num_classes == 0 and config.model.representation_size is None
    optim = config.optim
    assert (optim.name, optim.lr, optim.betas, optim.schedule, optim.clip_norm, optim.weight_decay) == (
        "adamw",
        2e-4,
        (0.9, 0.999),
        "cosine",
        1.0,
        0.1,
    )
    assert config.augment.mixup == 0 and config.augment.label_smoothing == 0 and config.augment.flip
    assert config.mpp == MPPConfig()  # the paper's objective (App. B.1.2) by default
    assert warmup_steps(config, 1_000_000) == 10_000  # the paper's 10k of 1M
    assert warmup_steps(config, 1000) == 50  # scaled down: 5% of a small run
    assert warmup_steps(mpp_train_config(config, warmup_steps=7), 1000) == 7


def test_checkpoint_loads_as_plain_vit_without_mpp_keys(tmp_path):
    result = train(tiny_config(tmp_path / "run"), data=Splits(train=image_set(), test=image_set(8, seed=1)))
    assert result["status"] == "finished" and result["step"] == 8
    final = tmp_path / "run" / "checkpoints" / "final"
    assert result["checkpoint"] == str(final)
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
    train(no_eval(tiny_config(tmp_path / "straight")), data=Splits(train=image_set(), test=None))
    cut = no_eval(tiny_config(tmp_path / "resumed", max_minutes=1e-9, budget_schedule="cut"))
    first = train(cut, data=Splits(train=image_set(), test=None))
    assert first["status"] == "time_budget" and first["step"] == 1  # stops after one step, checkpoint saved
    second = train(no_eval(tiny_config(tmp_path / "resumed")), data=Splits(train=image_set(), test=None))
    assert second["status"] == "finished" and second["step"] == 8
    a = load_file(str(tmp_path / "straight" / "checkpoints" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "resumed" / "checkpoints" / "final" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    sa = torch.load(tmp_path / "straight" / "checkpoints" / "step_0000008" / "train_state.pt", weights_only=True)
    sb = torch.load(tmp_path / "resumed" / "checkpoints" / "step_0000008" / "train_state.pt", weights_only=True)
    assert all(torch.equal(sa["mpp"][k], sb["mpp"][k]) for k in sa["mpp"])


def test_resume_keeps_the_runs_own_configuration(tmp_path, caplog):
    """One resume policy for every objective: the run directory's config wins, and the change is named."""
    train(no_eval(tiny_config(tmp_path, epochs=1)), data=Splits(train=image_set(), test=None))
    pixels = dataclasses.replace(tiny_config(tmp_path, epochs=1), mpp=MPPConfig(target="pixels", eval_images=0))
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        result = train(pixels, data=Splits(train=image_set(), test=None))
    assert "mpp.target" in caplog.text and "resuming it with its own config" in caplog.text
    assert result["status"] == "finished"
    assert json.loads((tmp_path / "config.json").read_text())["mpp"]["target"] == "mean_color"


def test_pixels_target_and_grayscale_run(tmp_path):
    config = dataclasses.replace(
        tiny_config(tmp_path, epochs=1),
        mpp=MPPConfig(target="pixels"),
        model=ViTConfig(img_size=32, patch_size=8, in_chans=1, num_classes=0, **TINY),
        data=DataConfig(uri="npz:unused", batch_size=8, epochs=1, mean=(0.5,), std=(0.5,)),
    )
    result = train(config, data=Splits(train=image_set(16, 1), test=image_set(4, 1)))
    assert result["status"] == "finished" and result["test"]["top1"] is None and result["test"]["loss"] > 0
    assert vitkit.load(tmp_path / "checkpoints" / "final").config.in_chans == 1


def _mpp_state(target: str = "mean_color") -> TrainState:
    model = MaskedPatchPrediction(
        create_model("vit_ti16", img_size=32, patch_size=8, num_classes=0, **TINY), MPPConfig(target=target)
    )
    optimizer = build_optimizer(model, OptimConfig(weight_decay=0.1), 1e-3)
    return TrainState(model=model, module=model.encoder, optimizer=optimizer, generator=torch.Generator())


def test_non_finite_loss_skips_the_update():
    state = _mpp_state()
    generator = torch.Generator().manual_seed(0)
    loss_of = lambda model, images: (model(images, generator)["loss"], {})  # noqa: E731
    spec = StepSpec(lr=1e-3, clip_norm=1.0)
    before = [p.detach().clone() for p in state.model.parameters()]
    out = train_step(state, [torch.full((2, 3, 32, 32), float("nan"))], spec, loss_of)
    assert out["skipped"] and not math.isfinite(float(out["loss"]))
    assert all(torch.equal(a, b) for a, b in zip(before, state.model.parameters(), strict=True))
    good = train_step(state, [torch.rand(2, 3, 32, 32)], spec, loss_of)
    assert not good["skipped"] and float(good["loss"]) == pytest.approx(math.log(512), abs=1e-5)


def test_mpp_state_refuses_a_mismatched_head(tmp_path):
    def objective(target: str) -> MaskedPatchObjective:
        config = dataclasses.replace(tiny_config(tmp_path), mpp=MPPConfig(target=target))
        made = MaskedPatchObjective(config, channels=3)
        made.network(create_model("vit_ti16", img_size=32, patch_size=8, num_classes=0, **TINY))
        return made

    with pytest.raises(ValueError, match="do not fit"):
        objective("mean_color").load_state_dict(objective("pixels").state_dict())


def test_mpp_config_keeps_hybrids_and_refuses_resnets(tmp_path):
    from vitkit.models.configs import HybridConfig, ResNetConfig

    base = tiny_config(tmp_path)
    hybrid = HybridConfig(
        vit=ViTConfig(img_size=32, patch_size=1, num_classes=10, representation_size=32, **TINY), resnet_layers=(1, 1)
    )
    converted = mpp_train_config(dataclasses.replace(base, model=hybrid))
    assert converted.model.vit.num_classes == 0 and converted.model.vit.representation_size is None
    assert converted.model.resnet_layers == (1, 1)
    with pytest.raises(ValueError, match="ViT or hybrid"):
        mpp_train_config(dataclasses.replace(base, model=ResNetConfig(num_classes=10)))


def test_sigterm_in_a_periodic_evaluation_saves_at_once_and_the_run_resumes(tmp_path, monkeypatch):
    """As a classifier's: the evaluation ends before its next batch, the run saves at that step, and the re-run
    evaluates that step before its first."""
    from vitkit.runs import RunDir
    from vitkit.ssl import masked_patch

    terminated, calls = sigterm_on_first_call(masked_patch.eval_transform)
    monkeypatch.setattr(masked_patch, "eval_transform", terminated)
    base = tiny_config(tmp_path / "run")
    config = dataclasses.replace(
        base,
        eval=dataclasses.replace(base.eval, every_epochs=1.0),
        mpp=dataclasses.replace(base.mpp, eval_images=300),
    )
    splits = Splits(train=image_set(), test=image_set(8, seed=1), evals={"val": image_set(300, seed=2)})  # 2 batches
    result = train(config, data=splits)
    every = result["plan"]["eval_every"]
    assert result["status"] == "interrupted" and result["step"] == every and len(calls) == 1
    assert RunDir(tmp_path / "run").latest().name == f"step_{every:07d}"
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert not [r for r in records if r.get("split") == "val"]  # the cut one: no record
    resumed = train(config, data=splits)
    assert resumed["status"] == "finished" and resumed["step"] == result["steps"] == 2 * every
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r.get("split") == "val"] == [every]  # not at the last step: the final one
