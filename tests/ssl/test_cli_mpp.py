"""`vitkit pretrain-mpp`: flags -> one pre-training run; JSON on the last line; clear errors."""

from __future__ import annotations

import json

import numpy as np
import torch

import vitkit
from vitkit.cli import main


def write_npz(path, count=16, side=16):
    rng = np.random.default_rng(0)
    np.savez(
        path,
        x_train=rng.integers(0, 256, (count, side, side, 3), dtype=np.uint8),
        y_train=np.arange(count) % 2,
        x_test=rng.integers(0, 256, (4, side, side, 3), dtype=np.uint8),
        y_test=np.arange(4) % 2,
    )
    return path


def test_pretrain_mpp_verb_writes_a_loadable_encoder(tmp_path, capsys):
    data = write_npz(tmp_path / "tiny.npz")
    out = tmp_path / "run"
    code = main(
        [
            "pretrain-mpp",
            "--data",
            f"npz:{data}",
            "--recipe",
            "small-32px-tiny",
            "--img-size",
            "16",
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--target",
            "downsampled",
            "--corrupt-rate",
            "0.25",
            "--set",
            "run.tensorboard=false",
            "--set",
            "model.patch_size=4",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    printed = capsys.readouterr()
    assert "resumes" not in printed.err  # a new run directory: nothing is resumed
    summary = json.loads(printed.out.strip().splitlines()[-1])
    assert summary["status"] == "finished" and summary["step"] == 2 and summary["steps"] == 2
    model = vitkit.load(summary["checkpoint"])
    assert model.config.patch_size == 4 and model.config.num_classes == 0 and model.config.img_size == 16
    assert model(torch.zeros(1, 3, 16, 16)).shape == (1, 32)  # no head: forward returns the representation
    run_config = json.loads((out / "config.json").read_text())
    assert run_config["mpp"]["target"] == "downsampled" and run_config["mpp"]["corrupt_rate"] == 0.25
    assert run_config["optim"]["lr"] == 2e-4 and run_config["optim"]["name"] == "adamw"  # App. B.1.2


def test_pretrain_mpp_bad_values_exit_2_with_one_line(tmp_path, capsys):
    data = write_npz(tmp_path / "tiny.npz")
    code = main(["pretrain-mpp", "--data", f"npz:{data}", "--corrupt-rate", "0", "--out", str(tmp_path / "r")])
    assert code == 2 and "corrupt_rate" in capsys.readouterr().err
    code = main(["pretrain-mpp", "--data", f"npz:{tmp_path / 'missing.npz'}", "--out", str(tmp_path / "r")])
    assert code == 2 and "missing.npz" in capsys.readouterr().err
    code = main(["pretrain-mpp", "--data", f"npz:{data}", "--set", "optim.nope=1", "--out", str(tmp_path / "r")])
    assert code == 2 and "optim.nope" in capsys.readouterr().err


def test_pretrain_mpp_takes_images_of_one_class(tmp_path, capsys):
    """Masked patch prediction uses no labels: a set of one class (unlabelled images in one folder) trains."""
    data = write_npz(tmp_path / "one.npz")
    with np.load(data) as arrays:
        np.savez(tmp_path / "one.npz", **{**arrays, "y_train": 0 * arrays["y_train"], "y_test": 0 * arrays["y_test"]})
    argv = ["--data", f"npz:{tmp_path / 'one.npz'}", "--recipe", "small-32px-tiny", "--img-size", "16", "--epochs", "1"]
    argv += ["--batch-size", "8", "--set", "model.patch_size=4", "--set", "run.tensorboard=false", "--json"]
    assert main(["pretrain-mpp", *argv, "--out", str(tmp_path / "run")]) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["status"] == "finished"
    assert main(["train", *argv, "--out", str(tmp_path / "classifier")]) == 2  # a classifier still needs two
    assert "at least 2" in capsys.readouterr().err
