"""`vitkit finetune`: head surgery, normalisation and resolution from the checkpoint, the LR sweep, its errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from helpers import class_npz, last_json, tiny_config

import vitkit
from vitkit.checkpoints import read
from vitkit.cli import main
from vitkit.models import build_model
from vitkit.models.configs import ViTConfig
from vitkit.train import trainer
from vitkit.train.assemble import initial_model
from vitkit.train.resolve import Request, resolve


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("pre") / "run"
    trainer.train(tiny_config(out, "data.steps=2", "run.checkpoint_every=2", recipe="paper-pretrain-tiny"))
    return out / "checkpoints" / "step_0000002"


def test_finetune_initialises_by_surgery(pretrained: Path, tmp_path: Path) -> None:
    data = class_npz(tmp_path / "four.npz")
    resolved = resolve(
        Request(data=f"npz:{data}", recipe="paper-finetune-tiny", init_from=str(pretrained), out=str(tmp_path / "ft"))
    )
    config = resolved.config
    assert config.model.num_classes == 4 and config.model.img_size == 32 and config.model.representation_size is None
    source = read(pretrained).model
    model = initial_model(config)
    assert source.pre_logits.fc.weight.shape == (32, 32) and isinstance(model.pre_logits, torch.nn.Identity)
    assert torch.count_nonzero(model.head.weight) == 0 and model.head.weight.shape == (4, 32)  # Sec. 3.2 zero init
    assert torch.equal(model.blocks[1].mlp.fc2.weight, source.blocks[1].mlp.fc2.weight)
    assert model.pos_embed.shape == (1, 1 + 8 * 8, 32) and source.pos_embed.shape == (1, 1 + 4 * 4, 32)
    assert torch.equal(model.pos_embed[0, 0], source.pos_embed[0, 0])  # [class] row kept
    assert torch.equal(model.pos_embed[0, 1], source.pos_embed[0, 1])  # corner patches map onto corners


def test_a_head_of_the_same_shape_is_replaced_unless_it_classifies_these_classes(tmp_path: Path) -> None:
    """Sec. 3.2: a new zero-initialised head; another data set's 4-class head had been kept for its shape, and
    then for its names where a source without names calls its classes "0", "1", ..."""
    model = build_model(ViTConfig(img_size=8, patch_size=4, hidden_size=32, depth=1, num_heads=2, mlp_dim=32,
                                  num_classes=4, in_chans=1))  # fmt: skip
    torch.nn.init.normal_(model.head.weight)
    data = f"npz:{class_npz(tmp_path / 'four.npz')}"
    names = ["0", "1", "2", "3"]  # what an npz without class names has
    vitkit.save(model, tmp_path / "own", class_names=names, provenance={"data": data})
    vitkit.save(model, tmp_path / "other", class_names=names, provenance={"data": "npz:/elsewhere/four.npz"})
    for source, kept in (("own", True), ("other", False)):
        config = resolve(Request(data=data, init_from=str(tmp_path / source), out=str(tmp_path / "ft"))).config
        head = initial_model(config, names).head.weight
        assert torch.equal(head, model.head.weight) if kept else torch.count_nonzero(head) == 0, source
        assert torch.count_nonzero(initial_model(config, ["a", "b", "c", "d"]).head.weight) == 0  # other classes
        assert torch.count_nonzero(initial_model(config).head.weight) == 0  # classes unknown


def test_a_fine_tune_normalises_as_its_checkpoint_was_trained(tmp_path: Path) -> None:
    """A checkpoint's recorded mean and std (a timm or HF model's) had been replaced by 0.5 / 0.5."""
    model = build_model(ViTConfig(img_size=8, patch_size=4, hidden_size=32, depth=1, num_heads=2, mlp_dim=32,
                                  num_classes=4, in_chans=1))  # fmt: skip
    vitkit.save(model, tmp_path / "c", mean=(0.1307,), std=(0.3081,))
    data = f"npz:{class_npz(tmp_path / 'four.npz')}"
    request = Request(data=data, init_from=str(tmp_path / "c"), out=str(tmp_path / "ft"))
    assert (resolve(request).config.data.mean, resolve(request).config.data.std) == ((0.1307,), (0.3081,))
    chosen = dataclasses.replace(request, overrides=("data.mean=0.4", "data.std=0.2"))
    assert (resolve(chosen).config.data.mean, resolve(chosen).config.data.std) == ((0.4,), (0.2,))  # --set wins


def test_finetune_cli_with_lr_sweep(pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    data = class_npz(tmp_path / "four.npz")
    out = tmp_path / "ft"
    code = main(
        [
            "finetune",
            str(pretrained),
            "--data",
            f"npz:{data}",
            "--recipe",
            "paper-finetune-tiny",
            "--lr-sweep",
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
    result = last_json(capsys.readouterr().out)
    sweep = json.loads((out / "sweep.json").read_text())
    assert set(sweep["val_top1"]) == {"0.001", "0.003", "0.01", "0.03"} and result["best_lr"] == sweep["best_lr"]
    assert sorted(p.name for p in (out / "sweep").iterdir()) == ["lr_0.001", "lr_0.003", "lr_0.01", "lr_0.03"]
    trial = json.loads((out / "sweep" / "lr_0.01" / "config.json").read_text())
    final = json.loads((out / "config.json").read_text())
    assert trial["data"]["val_fraction"] == 0.1 and final["data"]["val_fraction"] == 0.0
    assert final["optim"]["lr"] == sweep["best_lr"] and result["test"]["count"] == 16  # the fixed 20% test split


def test_an_interrupted_sweep_names_the_command_that_resumes_it(
    pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep's own --out resumes it (finished trials are skipped), not the interrupted trial's directory."""
    import vitkit.train.sweep as sweep

    def interrupted(config, **kwargs):
        return {"status": "interrupted", "step": 1, "steps": 2, "run_dir": config.run.out, "signal": 2}

    monkeypatch.setattr(sweep, "train", interrupted)
    out = tmp_path / "ft"
    args = ["finetune", str(pretrained), "--data", f"npz:{class_npz(tmp_path / 'four.npz')}", "--recipe"]
    code = main([*args, "paper-finetune-tiny", "--lr-sweep", "--out", str(out), "--set", "data.steps=2"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert code == 130 and f"--out {out} to resume" in line and "sweep" in line


def test_automatic_finetune_keeps_a_small_checkpoints_resolution(pretrained: Path, tmp_path: Path) -> None:
    # paper-finetune's 384 px is a step up from 224 px; a 16 px small-data checkpoint must not become 96x96 tokens.
    data = class_npz(tmp_path / "four.npz")
    resolved = resolve(Request(data=f"npz:{data}", init_from=str(pretrained), out=str(tmp_path / "ft")))
    assert resolved.config.recipe == "finetune-small"  # the CPU fine-tuning recipe, chosen for a small checkpoint
    assert resolved.config.model.img_size == read(pretrained).model.config.img_size == 16
    explicit = resolve(Request(data=f"npz:{data}", init_from=str(pretrained), img_size=32, out=str(tmp_path / "x")))
    assert explicit.config.model.img_size == 32


def test_a_sweep_tie_goes_to_the_lower_val_loss_then_to_the_first_rate() -> None:
    """20 held-out images give few distinct top-1 values: 0.01 and 0.03 both at 65%, 0.03 with the lower loss."""
    from vitkit.train.sweep import best_lr

    grid = (0.001, 0.003, 0.01, 0.03)
    scores = {"0.001": 0.40, "0.003": 0.55, "0.01": 0.65, "0.03": 0.65}
    assert best_lr(grid, scores, {"0.001": 2.0, "0.003": 1.9, "0.01": 1.72, "0.03": 1.05}) == 0.03
    assert best_lr(grid, scores, {"0.001": 2.0, "0.003": 1.9, "0.01": 1.0, "0.03": 1.0}) == 0.01  # a full tie
    assert best_lr(grid, {**scores, "0.001": 0.7}, {"0.001": 9.0, "0.003": 1, "0.01": 1, "0.03": 1}) == 0.001


def test_finetune_needs_its_target_data(tmp_path, capsys) -> None:
    """Without --data a fine-tune had trained on the bundled digits without a word."""
    with pytest.raises(SystemExit) as exit_code:
        main(["finetune", str(tmp_path / "none"), "--out", str(tmp_path / "r")])
    assert exit_code.value.code == 2 and "--data" in capsys.readouterr().err and not (tmp_path / "r").exists()
