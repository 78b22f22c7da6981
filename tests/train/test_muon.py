"""optim.name="muon": Muon on the encoder blocks' matrices, AdamW on everything else, saved and loaded as one."""

from __future__ import annotations

import copy
import dataclasses
import io
import math
from pathlib import Path

import pytest
import torch
from tests.train.helpers import tiny_config

from vitkit.device import native_bf16
from vitkit.models import build_model
from vitkit.models.configs import ViTConfig
from vitkit.train import muon, trainer
from vitkit.train.config import OptimConfig
from vitkit.train.muon import StackedMuon, orthogonalise
from vitkit.train.optim import OptimizerSet, build_optimizer, is_hidden_matrix, set_lr

LR, WD = 0.01, 0.05
NS = (3.4445, -4.775, 2.0315)  # torch.optim.Muon's default coefficients


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    model = build_model(
        ViTConfig(
            img_size=8,
            patch_size=4,
            in_chans=1,
            num_classes=3,
            hidden_size=16,
            depth=2,
            num_heads=2,
            mlp_dim=32,
            pool="gap",
        )
    )
    torch.nn.init.normal_(model.head.weight, std=0.5)  # not the zero head: every parameter gets a gradient at once
    return model


def _step(model: torch.nn.Module, optimizer, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    images, labels = torch.randn(64, 1, 8, 8, generator=generator), torch.randint(0, 3, (64,), generator=generator)
    optimizer.zero_grad(set_to_none=True)
    torch.nn.functional.cross_entropy(model(images), labels).backward()
    optimizer.step()


def test_the_encoder_matrices_go_to_muon_and_every_other_parameter_to_adamw() -> None:
    model = _model()
    optimizer = build_optimizer(model, OptimConfig(name="muon", lr=LR, weight_decay=WD), LR)
    assert isinstance(optimizer, OptimizerSet)
    muon, adamw = optimizer.parts
    assert isinstance(muon, StackedMuon) and isinstance(adamw, torch.optim.AdamW)
    names = {id(p): n for n, p in model.named_parameters()}
    in_muon = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    in_adamw = {names[id(p)] for g in adamw.param_groups for p in g["params"]}
    assert in_muon == {
        f"blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")
    }
    assert in_muon.isdisjoint(in_adamw) and in_muon | in_adamw == set(names.values())
    decayed = {names[id(p)] for g in adamw.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == {"patch_embed.proj.weight", "head.weight"}  # the kernels that are not encoder matrices
    assert all(group["lr"] == LR for group in optimizer.param_groups)


def test_first_step_orthogonalises_the_matrices_and_sign_steps_the_rest() -> None:
    """Independent checks of each update: Muon's first update of an A x B matrix is lr * 0.2 * sqrt(max(A, B))
    times an approximately orthogonal matrix (five Newton-Schulz iterations put every singular value that is at
    least 1% of the gradient's largest in about [0.5, 1.5], however spread they were: that is what is checked;
    weaker directions are lifted less); AdamW's first
    update of a parameter is lr * sign(gradient) (m / sqrt(v) = g / |g|)."""
    model = _model()
    before = copy.deepcopy(dict(model.named_parameters()))
    optimizer = build_optimizer(model, OptimConfig(name="muon", lr=LR, weight_decay=WD), LR)
    _step(model, optimizer, 0)
    for name, param in model.named_parameters():
        old = before[name].detach()
        if is_hidden_matrix(name, param):
            scale = LR * 0.2 * math.sqrt(max(param.shape))
            update = (old * (1 - LR * WD) - param.detach()) / scale
            singular, of_grad = torch.linalg.svdvals(update), torch.linalg.svdvals(param.grad)
            strong = int((of_grad > 0.01 * of_grad[0]).sum())  # 5 iterations lift these to ~1, not weaker ones
            assert strong >= min(param.shape) // 2, (name, of_grad)
            assert singular[:strong].min() > 0.5 and singular.max() < 1.6, (name, singular)
        else:
            decay = WD if name in ("patch_embed.proj.weight", "head.weight") else 0.0
            update = (old * (1 - LR * decay) - param.detach()) / LR
            clear = param.grad.abs() > 1e-6  # far above Adam's eps
            assert clear.any(), name
            assert torch.allclose(update[clear], torch.sign(param.grad[clear]), atol=1e-3), name


def test_muon_lr_scale_multiplies_the_matrices_steps_and_leaves_adamws_alone() -> None:
    """With muon_lr_scale s every encoder matrix moves exactly s times as far in its first step (the update and
    its decoupled decay both follow the lr) and every other parameter moves as it does at s = 1; the schedule's
    set_lr keeps the factor."""
    moves = {}
    for scale in (1.0, 3.0):
        model = _model()
        before = copy.deepcopy(dict(model.named_parameters()))
        optimizer = build_optimizer(model, OptimConfig(name="muon", lr=LR, weight_decay=WD, muon_lr_scale=scale), LR)
        set_lr(optimizer, LR / 2)
        muon, adamw = optimizer.parts
        assert [g["lr"] for g in muon.param_groups] == [scale * LR / 2]
        assert all(g["lr"] == LR / 2 for g in adamw.param_groups)
        _step(model, optimizer, 0)
        moves[scale] = {name: (before[name] - param).detach() for name, param in model.named_parameters()}
    for name, move in moves[3.0].items():
        factor = 3.0 if is_hidden_matrix(name, move) else 1.0
        assert move.abs().max() > 0, name
        assert torch.allclose(move, factor * moves[1.0][name], rtol=1e-4, atol=1e-7), name
    with pytest.raises(ValueError, match="muon_lr_scale"):
        OptimConfig(name="muon", muon_lr_scale=0.0)


def test_state_dict_round_trip_continues_identically_and_rejects_another_optimizer() -> None:
    config = OptimConfig(name="muon", lr=LR, weight_decay=WD)
    model = _model()
    optimizer = build_optimizer(model, config, LR)
    for seed in range(3):
        _step(model, optimizer, seed)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    twin = _model()
    twin.load_state_dict(saved["model"])
    twin_optimizer = build_optimizer(twin, config, LR)
    twin_optimizer.load_state_dict(saved["optimizer"])
    _step(model, optimizer, 7)
    _step(twin, twin_optimizer, 7)
    for (name, ours), theirs in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(ours, theirs), name
    adamw_state = build_optimizer(_model(), dataclasses.replace(config, name="adamw"), LR).state_dict()
    with pytest.raises(ValueError, match="optim.name"):
        twin_optimizer.load_state_dict(adamw_state)


def test_muon_refuses_settings_it_cannot_honour(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="muon"):
        tiny_config(tmp_path / "run", "optim.name=muon", "run.nan_check=deferred")
    with pytest.raises(ValueError, match="no Transformer encoder matrices"):
        build_optimizer(torch.nn.Linear(3, 3), OptimConfig(name="muon"), LR)


def test_a_muon_run_trains_the_tiny_recipe(tmp_path: Path) -> None:
    """The whole loop with Muon: the final test top-1 beats chance by far (AdamW: 45.1% in this setting)."""
    config = tiny_config(tmp_path / "run", "optim.name=muon", "data.steps=300", "data.batch_size=64")
    result = trainer.train(config)
    assert result["status"] == "finished" and result["step"] == 300
    assert result["test"]["top1"] > 0.35  # 10 classes: chance is 0.1; 47.6% when written


def test_the_batched_iteration_matches_torch_muon_per_matrix() -> None:
    """orthogonalise (one call for a stack; fp32 below 128 wide, bf16 from 128) against torch.optim.Muon's own
    iteration (bf16, one matrix): the same result up to bf16 rounding, for wide, tall and square matrices."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    generator = torch.Generator().manual_seed(0)
    for shape in ((64, 192), (192, 64), (48, 48), (128, 320), (320, 128)):
        stack = torch.randn(3, *shape, generator=generator)
        ours = orthogonalise(stack, NS, 5, 1e-7)
        assert ours.dtype == (torch.bfloat16 if min(shape) >= 128 and native_bf16(stack.device) else torch.float32)
        for matrix, result in zip(stack, ours):
            theirs = _zeropower_via_newtonschulz(matrix, NS, 5, 1e-7).float()
            assert theirs.shape == result.shape == matrix.shape
            assert (result - theirs).norm() < 0.02 * theirs.norm(), shape


def test_without_native_bf16_every_iteration_runs_in_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU without native bf16 (AVX2) emulates bf16 matmuls 10-20x slower than fp32: the iteration stays in fp32
    at every width, and gives the fp32 result of the same iteration."""
    wide = torch.randn(2, 192, 384, generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(muon, "native_bf16", lambda device: True)
    assert muon.iteration_dtype(wide) == torch.bfloat16 and muon.iteration_dtype(wide[:, :64, :64]) == torch.float32
    fast = orthogonalise(wide, NS, 5, 1e-7)
    monkeypatch.setattr(muon, "native_bf16", lambda device: False)
    assert muon.iteration_dtype(wide) == torch.float32
    plain = orthogonalise(wide, NS, 5, 1e-7)
    assert plain.dtype == torch.float32 and fast.dtype == torch.bfloat16
    x = wide / wide.norm(dim=(-2, -1), keepdim=True)  # the same iteration written out in fp32
    for _ in range(5):
        gram = x @ x.mT
        x = NS[0] * x + (NS[1] * gram + NS[2] * gram @ gram) @ x
    torch.testing.assert_close(plain, x, rtol=1e-4, atol=1e-5)
    assert (fast.float() - plain).norm() < 0.02 * plain.norm()  # bf16 rounding only


@pytest.mark.parametrize("nesterov", [True, False])
def test_stacked_muon_steps_as_torch_muon_does(nesterov: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three steps of StackedMuon against torch.optim.Muon from the same start, torch's iteration swapped for the
    same fp32 one (so that what differs is only the rest: stacking, momentum, Nesterov, lr rule, weight decay):
    equal parameters, momentum buffers and saved groups."""
    import torch.optim._muon as torch_muon

    monkeypatch.setattr(
        torch_muon,
        "_zeropower_via_newtonschulz",
        lambda grad, coefficients, steps, eps: orthogonalise(grad[None], coefficients, steps, eps)[0],
    )
    ours, theirs = _model(), _model()
    kwargs = dict(lr=LR, weight_decay=WD, momentum=0.95, nesterov=nesterov, adjust_lr_fn="match_rms_adamw")
    matrices = lambda model: [p for n, p in model.named_parameters() if is_hidden_matrix(n, p)]  # noqa: E731
    stacked, reference = StackedMuon(matrices(ours), **kwargs), torch.optim.Muon(matrices(theirs), **kwargs)
    start = [p.detach().clone() for p in matrices(ours)]
    for seed in range(3):
        _step(ours, stacked, seed)
        _step(theirs, reference, seed)
    for before, a, b in zip(start, matrices(ours), matrices(theirs)):
        assert (b - before).norm() > 1e-3
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(
            stacked.state[a]["momentum_buffer"], reference.state[b]["momentum_buffer"], rtol=1e-5, atol=1e-7
        )
    assert stacked.state_dict()["param_groups"] == reference.state_dict()["param_groups"]
