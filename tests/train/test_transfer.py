"""The pre-train-then-fine-tune path: the recipes chosen for it, fine-tuning a small checkpoint (head, resolution,
regularisation, pad), the sweep's share of a time budget, and N labelled images per class."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import class_npz, tiny_config

from shardkit import numbered_shards
from vitkit.checkpoints import read
from vitkit.cli import main
from vitkit.data.sources import SourceInfo, load_split
from vitkit.data.subsets import fraction_subset, labelled_parts, per_class_subset
from vitkit.train import sweep, trainer
from vitkit.train.assemble import initial_model, load_splits
from vitkit.train.recipes import auto_recipe_name, get_recipe
from vitkit.train.resolve import Request, resolve
from vitkit.train.sweep import budget_split, final_config, trial_config

SHARDS = Path(__file__).resolve().parents[3] / "shared" / "data" / "tiny-imagenet"
TINY_IMAGENET = SourceInfo(uri="wds:x", num_train=40_400, num_classes=202, image_size=64, channels=3, in_memory=False)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of small-64px-pretrain-tiny: 16 px, pre-logits head, PatchDropout 0.5, 10 classes."""
    out = tmp_path_factory.mktemp("pre") / "run"
    trainer.train(tiny_config(out, "data.steps=2", recipe="small-64px-pretrain-tiny"))
    return out


def test_64px_sources_of_tens_of_thousands_of_images_pretrain_a_vit_with_a_pre_logits_head() -> None:
    assert auto_recipe_name(TINY_IMAGENET) == "small-64px-pretrain"
    assert auto_recipe_name(dataclasses.replace(TINY_IMAGENET, num_train=2_000)) == "small-64px"
    assert auto_recipe_name(dataclasses.replace(TINY_IMAGENET, image_size=32)) == "small-32px"
    config = get_recipe("small-64px-pretrain", TINY_IMAGENET)
    model = config.model
    assert (model.img_size, model.patch_size, model.hidden_size, model.depth, model.num_heads) == (64, 8, 192, 6, 3)
    assert model.representation_size == 192 and model.num_classes == 202 and model.patch_dropout == 0.75
    assert config.optim.name == "muon" and config.augment.pad == 8 and config.model.patch_dropout_until == 0.8
    tuned = get_recipe("finetune-small", TINY_IMAGENET)
    assert (tuned.optim.name, tuned.optim.momentum, tuned.optim.schedule, tuned.optim.weight_decay) == (
        "sgd",
        0.9,
        "cosine",
        0.0,
    )
    assert tuned.data.batch_size == 128 and tuned.optim.clip_norm == 1.0 and tuned.augment.label_smoothing == 0.0


def test_finetune_of_a_small_checkpoint_picks_finetune_small_at_its_resolution(
    pretrained: Path, tmp_path: Path
) -> None:
    data = f"npz:{class_npz(tmp_path / 'four.npz', n=120)}"
    config = resolve(Request(data=data, init_from=str(pretrained), out=str(tmp_path / "ft"))).config  # a RUN dir
    source = read(pretrained / "checkpoints" / "final").model
    assert config.recipe == "finetune-small" and config.run.init_from == str(pretrained)
    assert config.model.img_size == 16 == source.config.img_size and config.augment.pad == 2  # 8 x 16 / 64
    assert config.model.representation_size is None and config.model.num_classes == 4
    assert config.model.patch_dropout_until == 0.8 != source.config.patch_dropout_until  # the recipe's, not carried
    model = initial_model(config)
    assert torch.count_nonzero(model.head.weight) == 0 and model.head.weight.shape == (4, 32)  # Sec. 3.2 zero init
    assert isinstance(model.pre_logits, torch.nn.Identity)
    assert torch.equal(model.blocks[1].attn.qkv.weight, source.blocks[1].attn.qkv.weight)
    larger = resolve(Request(data=data, init_from=str(pretrained), img_size=32, out=str(tmp_path / "x"))).config
    assert larger.model.img_size == 32 and larger.augment.pad == 4
    grown = initial_model(larger).pos_embed
    assert grown.shape == (1, 8 * 8, 32) and source.pos_embed.shape == (1, 4 * 4, 32)  # GAP: no [class] row
    assert torch.equal(grown[0, 0], source.pos_embed[0, 0])  # 2D interpolation: corners map onto corners


def test_finetune_small_drops_half_the_patches_for_most_of_its_schedule(pretrained: Path, tmp_path: Path) -> None:
    """The CPU fine-tuning recipe's PatchDropout (0.5 until 80%) replaces the checkpoint's (tiny: 0.5 throughout)."""
    source = read(pretrained / "checkpoints" / "final").model.config
    data = f"npz:{class_npz(tmp_path / 'four.npz', n=120)}"
    request = Request(data=data, init_from=str(pretrained), recipe="finetune-small", out=str(tmp_path / "ft"))
    model = resolve(request).config.model
    assert (source.patch_dropout, source.patch_dropout_until) == (0.5, 1.0)
    assert (model.patch_dropout, model.patch_dropout_until) == (0.5, 0.8) and model.img_size == source.img_size


def test_a_swept_run_shares_its_time_budget_between_trials_and_the_final_run(
    pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config = resolve(
        Request(data="digits", init_from=str(pretrained), lr_sweep=True, max_minutes=16, out=str(tmp_path / "s"))
    ).config
    assert budget_split(config) == (2.0, 8.0) and config.data.val_fraction == 0.1
    assert trial_config(config, 0.01).run.max_minutes == 2.0 and final_config(config, 0.01).run.max_minutes == 8.0
    out = tmp_path / "ft"
    code = main(
        [
            "finetune",
            str(pretrained),
            "--data",
            f"npz:{class_npz(tmp_path / 'f.npz', n=120)}",
            "--recipe",
            "finetune-small-tiny",
            "--lr-sweep",
            "--max-minutes",
            "8",
            "--out",
            str(out),
            "--json",
            "--set",
            "data.steps=2",
            "--set",
            "run.threads=1",
        ]
    )
    assert code == 0, capsys.readouterr().err[-2000:]
    sweep = json.loads((out / "sweep.json").read_text())
    assert (sweep["trial_minutes"], sweep["final_minutes"]) == (1.0, 4.0)
    assert json.loads((out / "sweep" / "lr_0.003" / "config.json").read_text())["run"]["max_minutes"] == 1.0
    assert json.loads((out / "config.json").read_text())["run"]["max_minutes"] == 4.0


def test_a_sweep_over_one_label_per_class_is_refused_before_any_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One image per class leaves the class-stratified hold-out empty: no trial could be scored."""
    config = tiny_config(tmp_path / "s", "data.labels_per_class=1", "data.val_fraction=0.1", "optim.lr_sweep=0.01,0.1")
    monkeypatch.setattr(sweep, "train", lambda *a, **k: pytest.fail("a trial trained"))
    with pytest.raises(ValueError) as refused:
        sweep.train_with_sweep(config)
    assert str(refused.value) == (
        "--lr-sweep scores each learning rate on a class-stratified hold-out of the labelled images, and with "
        "1 label per class that hold-out is empty (every class keeps its one image for training): use "
        "--labels-per-class 2 or more, or leave out --lr-sweep"
    )


def test_labels_per_class_are_exact_nested_and_fixed() -> None:
    train = load_split("digits", "train")
    parts = {n: per_class_subset(train, n) for n in (10, 100)}
    assert set(Counter(parts[10].labels.tolist()).values()) == {10}
    assert set(Counter(parts[100].labels.tolist()).values()) == {100}
    ids = {n: {tuple(image.flatten().tolist()) for image in part.images} for n, part in parts.items()}
    assert ids[10] < ids[100] and len(ids[10]) > 90  # nested (digits has a few duplicate images)
    assert torch.equal(per_class_subset(train, 10).images, parts[10].images)  # the same draw every time
    half = fraction_subset(train, 0.5)  # every digit class has > 100 images: 10 per class lies inside half of it
    assert ids[10] <= {tuple(image.flatten().tolist()) for image in half.images}
    kept, held = labelled_parts(train, 10, 0.1, seed=0)
    assert len(kept) == 90 and set(Counter(held.labels.tolist()).values()) == {1}  # the hold-out comes out of the 10
    assert "a fixed 10 images per class" in kept.origin


def test_labels_per_class_flag_reaches_the_run_and_its_splits(tmp_path: Path) -> None:
    config = resolve(
        Request(data="digits", recipe="small-8px-tiny", labels_per_class=20, lr_sweep=True, out=str(tmp_path / "r"))
    ).config
    assert config.data.labels_per_class == 20 and config.data.val_fraction == 0.1  # 200 labelled: App. B.1.1's 10%
    splits = load_splits(trial_config(config, 0.01))
    assert set(Counter(splits.train.labels.tolist()).values()) == {18}
    assert len(splits.test) == 20 and set(Counter(splits.test.labels.tolist()).values()) == {2}  # scored on the 20
    final = load_splits(final_config(config, 0.01))
    assert len(final.train) == 200 and len(final.test) == 359  # then all 20 per class, tested on the fixed hold-out
    with pytest.raises(ValueError, match="not combined with train_fraction"):
        resolve(Request(data="digits", labels_per_class=5, overrides=("data.train_fraction=0.5",), out="x"))


def test_train_only_shards_train_and_report_their_fixed_hold_out(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    numbered_shards(tmp_path / "wds", [30, 30], classes=4)  # 15 images a class, train-* shards only
    code = main(
        [
            "train",
            "--data",
            f"wds:{tmp_path / 'wds'}",
            "--recipe",
            "small-8px-tiny",
            "--out",
            str(tmp_path / "run"),
            "--json",
            "--set",
            "data.steps=2",
            "--set",
            "run.threads=1",
        ]
    )
    assert code == 0, capsys.readouterr().err[-2000:]
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["test"]["count"] == 12 and result["plan"]["num_train"] == 48  # 3 of every 15 held out


@pytest.mark.slow  # reads the labels of 50,500 shard samples: about 4 s
@pytest.mark.skipif(not SHARDS.is_dir(), reason="the Tiny-ImageNet shards (../shared/data) are absent")
def test_the_tiny_imagenet_shards_pick_the_pretraining_recipe() -> None:
    resolved = resolve(Request(data=f"wds:{SHARDS}", max_minutes=60, out="x"))
    # Its own 60 epochs bound the run under the budget too (LENGTH_BOUNDS_BUDGET): whichever comes first.
    config = resolved.config
    assert config.recipe == "small-64px-pretrain" and config.data.epochs == 60 and config.run.max_minutes == 60
    assert (resolved.info.num_train, resolved.info.num_classes, resolved.info.image_size) == (40_400, 202, 64)


def test_the_commands_start_up_is_charged_to_the_final_run_not_to_one_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first trial paid it: 547 steps against 704-731 for the others, in a 1-minute sweep, tilting the
    comparison towards the later rates."""
    config = tiny_config(tmp_path / "s", "data.val_fraction=0.1", "optim.lr_sweep=0.01,0.1,1", "run.max_minutes=1")
    charged: list[tuple[float, float]] = []

    clock = [100.0]

    def fake_train(trial, spent_s=0.0, **kwargs):
        charged.append((trial.optim.lr, spent_s))
        clock[0] += 3.0  # each trial (and the final run) takes 3 s, within its share
        return {"status": "finished", "val": {"top1": trial.optim.lr, "loss": 1.0}, "wall_minutes": 0.3}

    monkeypatch.setattr(sweep, "train", fake_train)
    monkeypatch.setattr(sweep, "now", lambda: clock[0])
    result = sweep.train_with_sweep(config, spent_s=3.0)
    assert charged == [(0.01, 0.0), (0.1, 0.0), (1.0, 0.0), (1.0, 3.0)]  # three equal trials, then the final run
    # the final line gave the final run's minutes alone: 0.99 min where the command took 1.5
    assert result["sweep_minutes"] == pytest.approx(0.15) and result["wall_minutes"] == pytest.approx(0.45)


def test_a_sweep_whose_trials_mostly_start_up_stops_and_trains_the_recipes_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With --max-minutes 1 each of 4 trials had 7.5 s and spent 21-143 s starting up: each trained 2-3 steps,
    all scored alike (the pick was a coin toss), and the command ran past 5 minutes."""
    import logging

    config = tiny_config(tmp_path / "s", "data.val_fraction=0.1", "optim.lr_sweep=0.01,0.1,1", "run.max_minutes=1")
    config = dataclasses.replace(config, optim=dataclasses.replace(config.optim, lr=0.05))
    ran: list[float] = []

    def fake_train(trial, spent_s=0.0, **kwargs):
        ran.append(trial.optim.lr)
        # of the trial's 10 s; run.budget_schedule=cut ends a trial "time_budget": a whole trial all the same
        return {"status": "time_budget", "val": {"top1": 0.5, "loss": 1.0}, "startup_seconds": 6.0}

    monkeypatch.setattr(sweep, "train", fake_train)
    with caplog.at_level(logging.WARNING):
        result = sweep.train_with_sweep(config)
    assert ran == [0.01, 0.05] and result["final_lr"] == 0.05  # one trial, then the final run at the set rate
    assert result["best_lr"] is None  # no rate was compared: the set rate had been recorded as the best
    assert "spent 6 s of its 10-s budget starting up" in caplog.text
    assert "--max-minutes 3 or more, with a new --out" in caplog.text
    record = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert record["best_lr"] is None and record["final_lr"] == 0.05 and "starting up" in record["stopped"]


def test_a_stopped_sweep_leaves_its_unused_time_to_the_final_run(tmp_path: Path, monkeypatch) -> None:
    """With --max-minutes 1 the sweep stopped after one trial, and the final run still had its half alone: 0.5
    minutes of a 1-minute command, its start-up taking all of it."""
    config = tiny_config(tmp_path / "s", "data.val_fraction=0.1", "optim.lr_sweep=0.01,0.1,1", "run.max_minutes=1")
    clock, budgets, charged = [100.0], [], []

    def fake_train(trial, spent_s=0.0, **kwargs):
        budgets.append(trial.run.max_minutes)
        charged.append(spent_s)
        clock[0] += 14.0  # 14 s of its 10, 6 of them starting up
        return {"status": "time_budget", "val": {"top1": 0.5, "loss": 1.0}, "startup_seconds": 6.0}

    monkeypatch.setattr(sweep, "now", lambda: clock[0])
    monkeypatch.setattr(sweep, "train", fake_train)
    sweep.train_with_sweep(config)
    assert budgets == [pytest.approx(10 / 60), pytest.approx(0.5 + 20 / 60)]  # its half, and 2 trials' 10 s
    assert charged == [0.0, pytest.approx(4.0)]  # the one trial's 4 s past its own share, once
    assert json.loads((tmp_path / "s" / "sweep.json").read_text())["final_minutes"] == pytest.approx(0.5 + 20 / 60)


def test_trials_that_run_past_their_share_are_charged_to_the_final_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The final run kept its half of the budget whatever the trials took, so the command ended late."""
    config = tiny_config(tmp_path / "s", "data.val_fraction=0.1", "optim.lr_sweep=0.01,0.1,1", "run.max_minutes=1")
    clock = [100.0]
    charged: list[float] = []

    def fake_train(trial, spent_s=0.0, **kwargs):
        charged.append(spent_s)
        clock[0] += 14.0  # each trial: 14 s of its 10
        return {"status": "finished", "val": {"top1": trial.optim.lr, "loss": 1.0}}

    monkeypatch.setattr(sweep, "now", lambda: clock[0])
    monkeypatch.setattr(sweep, "train", fake_train)
    sweep.train_with_sweep(config, spent_s=3.0)
    assert charged == [0.0, 0.0, 0.0, pytest.approx(3.0 + 42.0 - 30.0)]  # the trials' 12 s past their 30


def test_a_sweep_over_a_folder_with_its_own_val_split_scores_on_it(tmp_path: Path) -> None:
    """photos/train, val and test: the guide says val/ is for model selection, yet the sweep scored a 10%
    hold-out of train/ and never read val/."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", 12), ("val", 3), ("test", 4)):
        for cls in ("a", "b"):
            (tmp_path / "photos" / split / cls).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / "photos" / split / cls / f"{i}.png")
    uri = f"folder:{tmp_path / 'photos'}"
    config = resolve(Request(data=uri, recipe="small-8px-tiny", lr_sweep=True, out=str(tmp_path / "r"))).config
    assert config.data.val_fraction == 0.0
    sweep.check_hold_out(config)  # the source's own val split: nothing to hold out
    splits = load_splits(trial_config(config, 0.01))
    assert len(splits.train) == 24 and len(splits.test) == 6 and "val" in splits.test.origin


def test_every_run_of_a_sweep_trains_at_the_precision_its_first_trial_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """run.precision=auto was chosen again by each trial's timing: trials 1, 3 and 4 ran fp32 and trial 2 and the
    final run bf16, so the rates were compared across precisions.  The first trial's choice holds for the rest."""
    config = tiny_config(tmp_path / "s", "data.val_fraction=0.1", "optim.lr_sweep=0.01,0.1,1", "run.precision=auto")
    seen: list[str] = []

    def fake_train(trial, spent_s=0.0, **kwargs):
        seen.append(trial.run.precision)
        chosen = "fp32" if len(seen) == 1 else "bf16"  # what a noisy timing would pick after the first
        picked = chosen if trial.run.precision == "auto" else trial.run.precision
        return {"status": "finished", "val": {"top1": trial.optim.lr, "loss": 1.0}, "plan": {"precision": picked}}

    monkeypatch.setattr(sweep, "train", fake_train)
    with caplog.at_level(logging.INFO, logger="vitkit"):
        sweep.train_with_sweep(config)
    assert seen == ["auto", "fp32", "fp32", "fp32"]  # three trials, then the final run
    assert "the other trials and the final run train in fp32, as precision auto chose for the first" in caplog.text
    pinned = tiny_config(tmp_path / "p", "data.val_fraction=0.1", "optim.lr_sweep=0.01,0.1", "run.precision=bf16")
    seen.clear()
    sweep.train_with_sweep(pinned)
    assert seen == ["bf16", "bf16", "bf16"]  # the user's choice is left as it is


def test_a_grayscale_checkpoint_fine_tuned_on_colour_images_says_it_drops_the_colour(
    pretrained: Path, tmp_path: Path
) -> None:
    """Only the plan's "1 channel (grayscale)" told that an MPP encoder of MNIST saw colour photos in gray."""
    rng = np.random.default_rng(0)
    labels = np.arange(80) % 4
    np.savez(tmp_path / "rgb.npz", images=rng.integers(0, 255, (80, 8, 8, 3), dtype=np.uint8), labels=labels)
    assert read(pretrained / "checkpoints" / "final").config.in_chans == 1
    warnings = resolve(Request(data=f"npz:{tmp_path / 'rgb.npz'}", init_from=str(pretrained))).warnings
    assert any("the checkpoint reads 1 channel (grayscale): the 3-channel images of npz:" in w for w in warnings)
    gray = resolve(Request(data=f"npz:{class_npz(tmp_path / 'gray.npz')}", init_from=str(pretrained))).warnings
    assert not any("grayscale" in w for w in gray)
