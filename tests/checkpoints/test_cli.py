"""`vitkit convert` and `vitkit export-onnx`: flags -> read/write, one clear line on errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import vitkit
from vitkit.checkpoints import onnx_export, read
from vitkit.cli import main


def test_convert_to_each_format_and_back(tmp_path, make_vit, images, capsys):
    model = make_vit(gelu="exact")  # timm's numerics (exact GELU, eps 1e-6), which every target can carry
    vitkit.save(model, tmp_path / "src")
    for target in ("timm", "hf", "vitkit"):
        assert main(["convert", str(tmp_path / "src"), str(tmp_path / target), "--to", target, "--json"]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["to"] == target and summary["format"] == "vitkit"
        with torch.no_grad():
            assert torch.equal(read(tmp_path / target).model(images), model(images))


def test_convert_with_surgery(tmp_path, make_vit, capsys):
    vitkit.save(make_vit(representation_size=16), tmp_path / "src")
    args = [
        "convert",
        str(tmp_path / "src"),
        str(tmp_path / "dst"),
        "--img-size",
        "48",
        "--num-classes",
        "3",
        "--pre-logits",
        "drop",
    ]
    assert main(args) == 0
    config = read(tmp_path / "dst").config
    assert (config.img_size, config.num_classes, config.representation_size) == (48, 3, None)


def test_convert_errors_are_one_clear_line(tmp_path, make_vit, capsys):
    assert main(["convert", str(tmp_path / "missing"), str(tmp_path / "dst")]) == 2
    assert "does not exist" in capsys.readouterr().err
    vitkit.save(make_vit(pool="gap"), tmp_path / "gap")
    assert main(["convert", str(tmp_path / "gap"), str(tmp_path / "hf"), "--to", "hf"]) == 2
    assert "gap" in capsys.readouterr().err


def test_export_onnx(tmp_path, make_vit, capsys):
    pytest.importorskip("onnxruntime")
    vitkit.save(make_vit(), tmp_path / "src")
    assert main(["export-onnx", str(tmp_path / "src"), str(tmp_path / "m.onnx"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["opset"] == 17 and result["max_abs_diff"] <= 1e-4


def test_export_onnx_fails_where_onnxruntime_disagrees(tmp_path, make_vit, capsys, monkeypatch):
    pytest.importorskip("onnxruntime")
    vitkit.save(make_vit(), tmp_path / "src")
    monkeypatch.setattr(onnx_export, "check_onnx", lambda model, path: float("nan"))  # as an unfaithful export
    assert main(["export-onnx", str(tmp_path / "src"), str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err
    assert "differ from PyTorch's by up to nan, above the tolerance of 0.01" in err and "m.onnx" in err
    monkeypatch.setattr(onnx_export, "check_onnx", lambda model, path: 0.009)
    assert main(["export-onnx", str(tmp_path / "src"), str(tmp_path / "m.onnx"), "--force"]) == 0


def test_the_python_export_refuses_what_onnxruntime_disagrees_with(tmp_path, make_vit, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.setattr(onnx_export, "check_onnx", lambda model, path: 0.5)
    with pytest.raises(ValueError, match="differ from PyTorch's by up to 0.5, above the tolerance of 0.01"):
        onnx_export.verified_export(make_vit(), tmp_path / "m.onnx")
    assert (tmp_path / "m.onnx").is_file()  # kept to inspect
    monkeypatch.setattr(onnx_export, "check_onnx", lambda model, path: 0.003)
    assert onnx_export.verified_export(make_vit(), tmp_path / "n.onnx") == (tmp_path / "n.onnx", 0.003)


def test_convert_refuses_a_model_above_max_model_gb(tmp_path, make_vit, capsys):
    vitkit.save(make_vit(), tmp_path / "src")  # ~0.0001 GB of weights (96 kB)
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "dst"), "--max-model-gb", "0.00005"]) == 2
    err = capsys.readouterr().err
    assert "above the limit of 50.0 kB (the limit given)" in err and "--max-model-gb" in err
    assert not (tmp_path / "dst").exists()
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "dst"), "--max-model-gb", "0.01"]) == 0
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "d2"), "--max-model-gb", "inf"]) == 0  # no limit
    for bad in ("nan", "-1"):
        assert main(["convert", str(tmp_path / "src"), str(tmp_path / "d3"), "--max-model-gb", bad]) == 2
        assert (
            f"--max-model-gb must be a number of GB >= 0 (inf: no limit), got {float(bad)}" in capsys.readouterr().err
        )


def test_convert_refuses_to_overwrite_unless_forced(tmp_path, make_vit, images, capsys):
    """A destination that holds anything (a trained model, a run's config) is not replaced without --force."""
    first, second = make_vit(), make_vit(num_classes=3)
    vitkit.save(first, tmp_path / "first")
    vitkit.save(second, tmp_path / "second")
    assert main(["convert", str(tmp_path / "second"), str(tmp_path / "first")]) == 2
    assert "--force" in capsys.readouterr().err
    with torch.no_grad():
        assert torch.equal(read(tmp_path / "first").model.eval()(images), first.eval()(images))
    assert main(["convert", str(tmp_path / "second"), str(tmp_path / "first"), "--force"]) == 0
    assert read(tmp_path / "first").config.num_classes == 3
    (tmp_path / "empty").mkdir()  # an empty directory is no one's work
    assert main(["convert", str(tmp_path / "second"), str(tmp_path / "empty")]) == 0
    run = tmp_path / "run"  # a training run: --force wrote the model beside its checkpoints, and eval read that
    vitkit.save(first, run / "checkpoints" / "final")
    (run / "config.json").write_text("{}")
    assert main(["convert", str(tmp_path / "second"), str(run), "--force"]) == 2
    assert "is a training run" in capsys.readouterr().err
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints", "config.json"]


def test_a_failed_convert_leaves_no_directory_behind(tmp_path, make_vit, capsys):
    vitkit.save(make_vit(pool="gap"), tmp_path / "gap")
    assert main(["convert", str(tmp_path / "gap"), str(tmp_path / "hf"), "--to", "hf"]) == 2
    assert not (tmp_path / "hf").exists()


def test_a_convert_or_export_killed_mid_write_is_re_run_as_it_was(tmp_path, make_vit, capsys):
    """A kill between the temporary file and its rename left only `.NAME.HEX.tmp` in the destination: the same
    command then said "already exists and is not empty; pass --force"."""
    vitkit.save(make_vit(), tmp_path / "model")
    (tmp_path / "timm").mkdir()
    torn = [tmp_path / "timm" / ".model.safetensors.0123456789ab.tmp", tmp_path / ".m.onnx.0123456789ab.tmp"]
    for path in torn:
        path.write_bytes(b"torn")
    assert main(["convert", str(tmp_path / "model"), str(tmp_path / "timm"), "--to", "timm"]) == 0
    assert sorted(p.name for p in (tmp_path / "timm").iterdir()) == ["config.json", "model.safetensors"]
    assert main(["export-onnx", str(tmp_path / "model"), str(tmp_path / "m.onnx")]) == 0
    assert not any(path.exists() for path in torn)
    (tmp_path / "mine").mkdir()  # hidden files of the user's by other names are not vitkit's to remove
    for name in (".tmp_notes", ".backup.tmp"):
        (tmp_path / "mine" / name).write_text("x")
    assert main(["convert", str(tmp_path / "model"), str(tmp_path / "mine")]) == 2
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == [".backup.tmp", ".tmp_notes"]


def test_convert_and_export_take_a_run_directory(tmp_path, make_vit, images, capsys):
    """As eval, predict and serve do: a run directory names its final model."""
    model = make_vit(gelu="exact")
    vitkit.save(model, tmp_path / "run" / "checkpoints" / "final")
    (tmp_path / "run" / "config.json").write_text("{}")
    assert main(["convert", str(tmp_path / "run"), str(tmp_path / "timm"), "--to", "timm"]) == 0
    with torch.no_grad():
        assert torch.equal(read(tmp_path / "timm").model.eval()(images), model.eval()(images))


def test_export_onnx_to_a_directory_is_refused_before_any_work(tmp_path, make_vit, capsys):
    """It ended in an IsADirectoryError traceback naming its temporary file."""
    vitkit.save(make_vit(), tmp_path / "model")
    (tmp_path / "taken").mkdir()
    assert main(["export-onnx", str(tmp_path / "model"), str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err
    assert "is a directory; name the .onnx file to write" in err and "Traceback" not in err
    assert main(["export-onnx", str(tmp_path / "model"), str(tmp_path / "nodir" / "x.onnx")]) == 2
    err = capsys.readouterr().err  # it named its temporary file, '.x.onnx.<hex>.tmp'
    assert "nodir does not exist" in err and ".tmp" not in err


def test_export_onnx_over_an_existing_file_needs_force(tmp_path, make_vit, capsys):
    """It replaced an existing file without a word, where convert refuses without --force."""
    vitkit.save(make_vit(), tmp_path / "model")
    taken = tmp_path / "m.onnx"
    taken.write_bytes(b"someone's model")
    assert main(["export-onnx", str(tmp_path / "model"), str(taken)]) == 2
    err = capsys.readouterr().err
    assert "m.onnx already exists; choose another file or pass --force" in err
    assert taken.read_bytes() == b"someone's model"
    assert main(["export-onnx", str(tmp_path / "model"), str(taken), "--force"]) == 0
    assert taken.stat().st_size > 1000


def test_the_weights_file_of_a_checkpoint_directory_names_the_directory(tmp_path, make_vit, capsys):
    """`eval DIR/model.safetensors` was read as a bare timm state dict: "cannot infer num_heads: pass a config",
    which the command line has no way to do."""
    vitkit.save(make_vit(), tmp_path / "model")
    assert main(["export-onnx", str(tmp_path / "model" / "model.safetensors"), str(tmp_path / "m.onnx")]) == 2
    assert "is one file of the checkpoint directory" in capsys.readouterr().err


def test_convert_to_official_refuses_the_npz_it_would_replace(tmp_path, make_vit, capsys):
    """`convert SRC NAME --to official` writes NAME.npz, but the check looked at NAME: an existing NAME.npz was
    replaced without --force.  A file in the way of a directory format is named as such."""
    vitkit.save(make_vit(gelu="exact"), tmp_path / "src")
    kept = tmp_path / "precious.npz"
    kept.write_bytes(b"a model someone keeps")
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "precious"), "--to", "official"]) == 2
    assert "precious.npz already exists" in capsys.readouterr().err and kept.read_bytes() == b"a model someone keeps"
    assert main(["convert", str(tmp_path / "src"), str(tmp_path / "precious"), "--to", "official", "--force"]) == 0
    assert read(kept).config.hidden_size == make_vit().config.hidden_size
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["convert", str(tmp_path / "src"), str(afile), "--to", "timm", "--force"]) == 2
    assert f"{afile} is a file; --to timm writes a directory" in capsys.readouterr().err
    named = tmp_path / "digits.npz"  # made a directory named like a file
    assert main(["convert", str(tmp_path / "src"), str(named), "--to", "timm"]) == 2 and not named.exists()
    assert f"{named} is named as a file (.npz); --to timm writes a directory" in capsys.readouterr().err


def test_export_onnx_with_a_new_head_checks_the_encoder_too(tmp_path, make_vit, capsys, monkeypatch):
    """A new zero-initialised head (--num-classes) gives zero logits for every image, so "max |diff| = 0" said
    nothing of the encoder; the check now also runs a copy with a random head through onnxruntime."""
    pytest.importorskip("onnxruntime")
    vitkit.save(make_vit(), tmp_path / "src")
    checked = []
    real = onnx_export.check_onnx

    def recording(model, path):
        checked.append(int(model.head.weight.count_nonzero()))
        return real(model, path)

    monkeypatch.setattr(onnx_export, "check_onnx", recording)
    flags = ["--num-classes", "3", "--json"]
    assert main(["export-onnx", str(tmp_path / "src"), str(tmp_path / "m.onnx"), *flags]) == 0
    assert len(checked) == 2 and checked[0] == 0 and checked[1] > 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 0 < summary["max_abs_diff"] <= 1e-4  # the random head's logits differ a little, as real numbers do
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".onnx"] == ["m.onnx"]


def test_convert_and_export_refuse_to_replace_the_model_they_read(tmp_path, make_vit, images, capsys):
    """With --force, `export-onnx CKPT CKPT/model.safetensors` replaced the weights with an ONNX file, and
    `convert X RUN/checkpoints/final --force` a run's export, so `eval RUN` read an older step unannounced."""
    model = make_vit()
    vitkit.save(model, tmp_path / "ckpt")
    weights = tmp_path / "ckpt" / "model.safetensors"
    before = weights.read_bytes()
    assert main(["export-onnx", str(tmp_path / "ckpt"), str(weights), "--force"]) == 2
    assert "lies inside the checkpoint being read" in capsys.readouterr().err and weights.read_bytes() == before
    for dst in (tmp_path / "ckpt", tmp_path):  # the source itself, a directory that holds it
        assert main(["convert", str(tmp_path / "ckpt"), str(dst), "--to", "timm", "--force"]) == 2
        assert "is, holds or lies inside the checkpoint being read" in capsys.readouterr().err
    run = tmp_path / "run"
    vitkit.save(model, run / "checkpoints" / "final")
    (run / "config.json").write_text("{}")
    final = run / "checkpoints" / "final"
    assert main(["convert", str(tmp_path / "ckpt"), str(final), "--to", "timm", "--force"]) == 2
    assert f"lies inside the checkpoints of the training run {run.resolve()}" in capsys.readouterr().err
    with torch.no_grad():
        assert torch.equal(read(final).model.eval()(images), model.eval()(images))
    assert main(["export-onnx", str(run), str(run / "model.onnx")]) == 0  # beside a run's checkpoints: its own
    assert (run / "model.onnx").stat().st_size > 1000
    mine = tmp_path / "project" / "checkpoints"  # a folder of that name, no run's: every path under it was refused
    mine.mkdir(parents=True)
    assert main(["export-onnx", str(tmp_path / "ckpt"), str(mine / "vit.onnx")]) == 0
    assert main(["convert", str(tmp_path / "ckpt"), str(mine / "vit-timm"), "--to", "timm"]) == 0


def test_export_onnx_of_a_resnet_with_a_zero_head_checks_the_encoder_too(tmp_path, monkeypatch):
    """A BiT ResNet's head is `head.fc` inside a Sequential: its zero head was not probed, so "max |diff| = 0"
    compared two zero tensors and said nothing of the encoder."""
    pytest.importorskip("onnxruntime")
    model = vitkit.create_model("bit_r50x1", num_classes=3, img_size=32, layers=(1, 1))
    assert model.head.fc.weight.count_nonzero() == 0
    checked = []
    real = onnx_export.check_onnx

    def recording(probe, path):
        checked.append(int(probe.head.fc.weight.count_nonzero()))
        return real(probe, path)

    monkeypatch.setattr(onnx_export, "check_onnx", recording)
    _, diff = onnx_export.verified_export(model, tmp_path / "r.onnx")
    assert len(checked) == 2 and checked[0] == 0 and checked[1] == 3 * model.num_features
    assert 0 < diff <= 1e-4


def test_an_export_interrupted_in_its_check_leaves_no_file(tmp_path, make_vit, monkeypatch):
    """Ctrl-C during the onnxruntime check had left the unchecked file in place, and the re-run was refused
    ("already exists; ... --force"); the file is now renamed into place only once checked."""
    pytest.importorskip("onnxruntime")

    def interrupted(model, path, opset):
        assert Path(path).name.endswith(".tmp")  # the file checked is the one not yet in place
        (Path(path).parent / "encoder.blocks.0.weight").write_bytes(b"0")  # a model over 2 GB: its tensors beside
        raise KeyboardInterrupt

    monkeypatch.setattr(onnx_export, "check_export", interrupted)
    with pytest.raises(KeyboardInterrupt):
        onnx_export.verified_export(make_vit(), tmp_path / "m.onnx")
    assert list(tmp_path.iterdir()) == []


def test_convert_names_an_empty_destination_and_a_file_in_the_way(tmp_path, make_vit, capsys):
    """`convert SRC ""` said ". is, holds or lies inside the checkpoint being read", and a file in the way
    "already exists and is not empty" (it was a 0-byte file)."""
    vitkit.save(make_vit(), tmp_path / "ckpt")
    assert main(["convert", str(tmp_path / "ckpt"), "", "--to", "timm"]) == 2
    assert "the destination is empty" in capsys.readouterr().err
    (tmp_path / "afile.txt").write_bytes(b"")
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "afile.txt"), "--to", "timm"]) == 2
    assert f"{tmp_path / 'afile.txt'} is a file; --to timm writes a directory" in capsys.readouterr().err  # no --force
    (tmp_path / "old.npz").write_bytes(b"")
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "old.npz"), "--to", "official"]) == 2
    assert f"{tmp_path / 'old.npz'} already exists and is a file; choose another" in capsys.readouterr().err
