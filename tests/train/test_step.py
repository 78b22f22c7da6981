"""train_step and evaluate alone: accumulation, non-finite skipping, metrics against direct computation."""

from __future__ import annotations

import copy
import dataclasses

import torch
import torch.nn.functional as F

from vitkit.data.sources import ImageSet
from vitkit.eval.evaluator import evaluate
from vitkit.models import build_model
from vitkit.models.configs import ViTConfig
from vitkit.train.config import OptimConfig
from vitkit.train.guard import NonFiniteGuard
from vitkit.train.optim import build_optimizer
from vitkit.train.state import TrainState
from vitkit.train.step import StepSpec, loss_fn, train_step

CONFIG = ViTConfig(
    img_size=32, patch_size=8, in_chans=3, num_classes=5, hidden_size=32, depth=2, num_heads=2, mlp_dim=64
)
SPEC = StepSpec(lr=1e-3, clip_norm=1.0, loss="softmax", autocast_dtype=None)


def _state(seed: int = 0, name: str = "adamw") -> TrainState:
    torch.manual_seed(seed)
    model = build_model(CONFIG)
    with torch.no_grad():  # a non-zero head, so every parameter gets a gradient at step 1
        model.head.weight.normal_(std=0.02)
    optimizer = build_optimizer(model, OptimConfig(name=name, weight_decay=0.1), lr=1e-3)
    return TrainState(model=model, module=model, optimizer=optimizer, generator=torch.Generator())


def _batch(n: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, 32, 32, generator=g)
    targets = F.one_hot(torch.randint(0, 5, (n,), generator=g), 5).float() * 0.9 + 0.02
    return images, targets


def test_accumulating_4_micro_batches_equals_one_big_batch() -> None:
    # Gradients agree to float32 rounding; SGD-momentum weights too.  (Adam is not used for the weight
    # comparison: it divides by sqrt(v), turning ~1e-10 rounding noise in gradients that are zero in
    # exact arithmetic, such as the key bias's, into steps of size lr.)
    images, targets = _batch(32)
    big, small = _state(name="sgd"), _state(name="sgd")
    for _ in range(3):
        out_big = train_step(big, [(images, targets)], SPEC)
        out_small = train_step(small, list(zip(images.split(8), targets.split(8))), SPEC)
        torch.testing.assert_close(out_small["loss"], out_big["loss"], rtol=0, atol=1e-6)
        for (name, a), (_, b) in zip(big.module.named_parameters(), small.module.named_parameters()):
            torch.testing.assert_close(a.grad, b.grad, rtol=0, atol=1e-6, msg=name)
    for (name, a), (_, b) in zip(big.module.named_parameters(), small.module.named_parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    assert big.step == small.step == 3


def test_a_micro_batch_left_empty_adds_no_loss_and_zero_gradients() -> None:
    """Streamed shards whose samples are all unreadable (a stale index) left a micro-batch empty: its mean loss
    was NaN, the step was skipped as non-finite on every process, and five in a row ended the run advising a
    lower learning rate."""
    images, targets = _batch(8)
    empty, spec = (images[:0], targets[:0]), dataclasses.replace(SPEC, clip_norm=0.0)  # gradients as computed
    alone, beside = _state(name="sgd"), _state(name="sgd")
    out_alone = train_step(alone, [(images, targets)], spec)
    out_beside = train_step(beside, [(images, targets), empty], spec)
    assert out_beside["skipped"] is False and out_beside["loss"].item() == out_alone["loss"].item()
    for (name, a), (_, b) in zip(alone.module.named_parameters(), beside.module.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad / 2, rtol=0, atol=1e-7, msg=name)  # one of two micro-batches
    out_none = train_step(_state(name="sgd"), [empty], spec)
    assert out_none["skipped"] is False and out_none["loss"].item() == 0.0 and out_none["grad_norm"].item() == 0.0


def test_non_finite_loss_skips_the_update_and_counts() -> None:
    state = _state()
    train_step(state, [_batch(8)], SPEC)
    before = copy.deepcopy(state.module.state_dict())
    optim_before = copy.deepcopy(state.optimizer.state_dict())
    guard = NonFiniteGuard(state, patience=5)
    images, targets = _batch(8)
    images[0, 0, 0, 0] = float("nan")
    out = train_step(state, [(images, targets)], SPEC)
    guard.observe(state.step, out["skipped"])
    assert guard.flush() == [2]
    assert out["skipped"] and state.nan_streak == 1 and state.skipped_steps == 1 and state.step == 2
    for key, value in state.module.state_dict().items():
        assert torch.equal(value, before[key]), key
    steps = [s["step"] for s in state.optimizer.state_dict()["state"].values()]
    assert all(float(s) == 1.0 for s in steps)  # Adam's step counter did not advance
    assert all(float(s["step"]) == 1.0 for s in optim_before["state"].values())
    out = train_step(state, [_batch(8)], SPEC)
    guard.observe(state.step, out["skipped"])
    assert guard.flush() == []
    assert not out["skipped"] and state.nan_streak == 0 and state.skipped_steps == 1


def test_loss_functions_match_torch() -> None:
    logits = torch.randn(6, 4)
    labels = torch.tensor([0, 1, 2, 3, 0, 1])
    hard = F.one_hot(labels, 4).float()
    torch.testing.assert_close(loss_fn(logits, hard, "softmax"), F.cross_entropy(logits, labels))
    smooth = hard * 0.9 + 0.1 / 4
    torch.testing.assert_close(loss_fn(logits, smooth, "softmax"), F.cross_entropy(logits, labels, label_smoothing=0.1))
    expected = F.binary_cross_entropy_with_logits(logits, hard, reduction="sum") / 6
    torch.testing.assert_close(loss_fn(logits, hard, "sigmoid"), expected)


def test_evaluate_matches_direct_computation() -> None:
    torch.manual_seed(0)
    model = build_model(CONFIG).eval()
    with torch.no_grad():
        model.head.weight.normal_(std=0.5)
    images = torch.randint(0, 256, (23, 3, 32, 32), dtype=torch.uint8)
    labels = torch.randint(0, 5, (23,))
    data = ImageSet(images=images, labels=labels, class_names=list("abcde"))
    result = evaluate(model, data, size=32, mean=(0.5,) * 3, std=(0.5,) * 3, channels=3, batch_size=5).summary()
    with torch.no_grad():
        logits = model(images.float() / 127.5 - 1)
    assert result["count"] == 23
    assert abs(result["top1"] - (logits.argmax(1) == labels).double().mean().item()) < 1e-9
    top5 = (logits.topk(5, 1).indices == labels[:, None]).any(1).double().mean().item()
    assert abs(result["top5"] - top5) < 1e-9
    assert abs(result["loss"] - F.cross_entropy(logits, labels).item()) < 1e-5


def test_polyak_ema_follows_its_formula_and_is_what_gets_saved(tmp_path) -> None:
    from helpers import tiny_config

    from vitkit.checkpoints import read
    from vitkit.train import trainer
    from vitkit.train.ema import ModelEMA

    model = build_model(CONFIG)
    ema = ModelEMA(model, 0.9)
    start = {k: v.clone() for k, v in ema.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    ema.update(model)
    for key, value in ema.state_dict().items():
        torch.testing.assert_close(value, 0.9 * start[key] + 0.1 * model.state_dict()[key])
    run = tmp_path / "run"
    trainer.train(tiny_config(run, "data.steps=3", "optim.ema_decay=0.5"))
    raw = read(run / "checkpoints" / "step_0000003").model.state_dict()
    final = read(run / "checkpoints" / "final").model.state_dict()
    payload = torch.load(run / "checkpoints" / "step_0000003" / "train_state.pt", map_location="cpu", weights_only=True)
    assert all(torch.equal(final[k], payload["ema"][k]) for k in payload["ema"])  # final = the average
    assert any(not torch.equal(final[k], raw[k]) for k in raw)  # the raw weights are kept for resuming
    from vitkit.runs import find_checkpoint

    assert find_checkpoint(run) == run / "checkpoints" / "final"  # what `vitkit eval RUN` evaluates: the average


def test_deferred_skip_happens_on_the_device_without_reading_the_flag() -> None:
    # CUDA's default: the fused optimiser skips via found_inf; the flag comes back as a tensor.
    torch.manual_seed(0)
    model = build_model(CONFIG)
    optimizer = build_optimizer(model, OptimConfig(weight_decay=0.1), lr=1e-3, fused=True)
    state = TrainState(model=model, module=model, optimizer=optimizer, generator=torch.Generator())
    spec = StepSpec(lr=1e-3, clip_norm=1.0, loss="softmax", autocast_dtype=None, deferred=True)
    first = train_step(state, [_batch(8)], spec)
    assert isinstance(first["skipped"], torch.Tensor) and not bool(first["skipped"])
    before = copy.deepcopy(model.state_dict())
    images, targets = _batch(8)
    images[1] = float("inf")
    out = train_step(state, [(images, targets)], spec)
    assert bool(out["skipped"]) and state.step == 2
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(float(s["step"]) == 1.0 for s in optimizer.state_dict()["state"].values())


def test_the_summary_names_the_k_of_its_top_k() -> None:
    """With 3 classes the second figure is top-3 (every image a hit), and the record says so for the log lines."""
    torch.manual_seed(0)
    model = build_model(dataclasses.replace(CONFIG, num_classes=3)).eval()
    images = torch.randint(0, 256, (7, 3, 32, 32), dtype=torch.uint8)
    data = ImageSet(images=images, labels=torch.tensor([0, 1, 2, 0, 1, 2, 0]), class_names=list("abc"))
    result = evaluate(model, data, size=32, mean=(0.5,) * 3, std=(0.5,) * 3, channels=3, batch_size=4).summary()
    assert result["k"] == 3 and result["top5"] == 1.0


def test_the_step_outputs_since_the_last_record_round_trip_through_a_saved_state(tmp_path) -> None:
    """A checkpoint keeps what the next train record averages; a damaged list is dropped, not trusted."""
    state = _state()
    for _ in range(2):
        state.records.append(train_step(state, [_batch(4)], SPEC))
    torch.save(state.state_dict(), tmp_path / "state.pt")
    stored = torch.load(tmp_path / "state.pt", weights_only=True)
    twin = _state()
    twin.load_state_dict(stored)
    assert [float(r["loss"]) for r in twin.records] == [float(r["loss"]) for r in state.records]
    assert [r["lr"] for r in twin.records] == [1e-3, 1e-3]
    damaged_outputs = ([{"loss": torch.zeros(3), "skipped": False}], "records", [{"lr": 1.0}])
    no_norm = [{"loss": torch.tensor(1.0), "lr": 1.0, "skipped": False}]  # the record would miss its grad_norm
    for damaged in (*damaged_outputs, no_norm):
        twin.load_state_dict({**stored, "records": damaged})
        assert twin.records == []
    twin.load_state_dict({k: v for k, v in stored.items() if k != "records"})  # an earlier version's state
    assert twin.records == []
