"""vitkit's own format: exact save -> load, and clear errors for damaged or mismatched directories."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

import vitkit
from vitkit.checkpoints import Checkpoint, CheckpointError, native, read


def test_save_load_identical_state_and_logits(tmp_path, make_vit, images):
    model = make_vit(representation_size=16)
    vitkit.save(
        Checkpoint(model=model, class_names=list("abcde"), mean=(0.1, 0.2, 0.3), provenance={"run": "x"}),
        tmp_path / "c",
    )
    back = read(tmp_path / "c")
    assert back.config == model.config and back.class_names == list("abcde") and back.mean == (0.1, 0.2, 0.3)
    assert back.provenance["run"] == "x" and back.provenance["format"] == "vitkit"
    for (name, a), b in zip(model.state_dict().items(), back.model.state_dict().values()):
        assert torch.equal(a, b), name
    with torch.no_grad():
        assert torch.equal(vitkit.load(tmp_path / "c")(images), model(images))


def test_load_returns_a_model_ready_for_inference(tmp_path, make_vit, images):
    """vitkit.load gives eval mode: PatchDropout and stochastic depth off, the same logits every call."""
    vitkit.save(make_vit(patch_dropout=0.5, drop_path=0.1), tmp_path / "c")
    model = vitkit.load(tmp_path / "c")
    assert not any(module.training for module in model.modules())
    with torch.no_grad():
        assert torch.equal(model(images), model(images))


def test_truncated_weights_are_refused(tmp_path, make_vit):
    vitkit.save(make_vit(), tmp_path / "c")
    weights = tmp_path / "c" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ValueError, match="truncated"):
        read(tmp_path / "c")


def test_missing_file_is_named(tmp_path, make_vit):
    vitkit.save(make_vit(), tmp_path / "c")
    (tmp_path / "c" / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors is missing"):
        read(tmp_path / "c")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read(tmp_path / "nowhere")


def test_other_models_config_names_the_tensors(tmp_path, make_vit):
    vitkit.save(make_vit(), tmp_path / "a")
    vitkit.save(make_vit(depth=3, mlp_dim=48), tmp_path / "b")
    shutil.copy(tmp_path / "b" / "config.json", tmp_path / "a" / "config.json")
    meta = json.loads((tmp_path / "a" / "config.json").read_text())
    for edit in ({}, {"weights_sha256": None}):  # with the recorded hash, and hand-edited without it
        (tmp_path / "a" / "config.json").write_text(json.dumps({**meta, **edit}))
        with pytest.raises(ValueError, match=r"missing \['blocks\.2\..*shape mismatch.*blocks\.0\.mlp\.fc1\.weight"):
            read(tmp_path / "a")  # the header, read before the hash, names the tensors
    vitkit.save(make_vit(seed=1), tmp_path / "c")  # the same shapes, other weights: the hash tells them apart
    shutil.copy(tmp_path / "c" / "config.json", tmp_path / "a" / "config.json")
    with pytest.raises(ValueError, match="SHA-256 differs"):
        read(tmp_path / "a")


def test_unknown_format_is_a_clear_error(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "notes.txt").write_text("hi")
    with pytest.raises(ValueError, match="not a checkpoint directory vitkit knows.*notes.txt"):
        read(tmp_path / "d")
    (tmp_path / "w.ckpt").write_bytes(b"\0" * 10)
    with pytest.raises(ValueError, match="unknown checkpoint format"):
        read(tmp_path / "w.ckpt")
    (tmp_path / "x.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="x.safetensors: 7 bytes, too short for a safetensors file"):
        read(tmp_path / "x.safetensors")


@pytest.mark.parametrize("thing", [torch.nn.Linear(2, 2), {"weight": torch.zeros(2)}])
def test_save_refuses_what_is_no_vitkit_model_before_writing(tmp_path, thing) -> None:
    """A torch module of its own or a state dict ended in an AttributeError ('Linear' has no 'config') after
    the directory was made."""
    with pytest.raises(TypeError, match="vitkit.save takes a vitkit model"):
        vitkit.save(thing, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_checkpoint_of_a_newer_format_version_is_refused_by_name(tmp_path, make_vit):
    """format_version 2 had been read as version 1 without a word."""
    vitkit.save(make_vit(), tmp_path / "c")
    meta = json.loads((tmp_path / "c" / "config.json").read_text())
    for version, words in (
        (2, "format_version 2; this vitkit reads versions 1 to 1 (a newer vitkit wrote it"),
        ("1", "format_version '1'; this vitkit reads versions 1 to 1 (damaged)"),
        (0, "format_version 0; this vitkit reads versions 1 to 1 (damaged)"),
    ):
        (tmp_path / "c" / "config.json").write_text(json.dumps({**meta, "format_version": version}))
        with pytest.raises(CheckpointError, match=re.escape(words)):
            vitkit.load(tmp_path / "c")


def test_the_header_is_checked_before_the_weights_are_hashed(tmp_path, make_vit, monkeypatch):
    """The whole file was hashed before its header was read: a 50 GB (sparse) model.safetensors beside a 4 MB
    model's config.json kept a CPU busy for minutes before the header, which refuses it at once, was looked at."""
    directory = vitkit.save(make_vit(), tmp_path / "ckpt")
    with open(directory / "model.safetensors", "ab") as weights:
        weights.write(bytes(1 << 20))  # a megabyte more than the header describes
    hashed = []
    monkeypatch.setattr(native, "_sha256", lambda path: hashed.append(path) or "0" * 64)
    with pytest.raises(CheckpointError, match="bytes appended"):
        native.load(directory)
    assert hashed == []


def test_a_step_checkpoint_s_header_is_checked_before_its_weights_are_hashed(tmp_path, make_vit, monkeypatch):
    """A resume's check of a step checkpoint hashed its whole weights file first, as loading had."""
    from vitkit.runs import RunDir

    directory = vitkit.save(make_vit(), tmp_path / "step_0000002")
    with open(directory / "model.safetensors", "ab") as weights:
        weights.write(bytes(1 << 20))
    hashed = []
    monkeypatch.setattr(native, "_sha256", lambda path: hashed.append(path) or "0" * 64)
    assert RunDir._reads(directory) is False and hashed == []


def test_fp8_weights_are_checked_for_finite_values_and_read(tmp_path, make_vit, images):
    """safetensors' F8_E4M3 weights were accepted by the header check, then torch's isfinite, which has no fp8
    kernel, ended the load in a NotImplementedError traceback."""
    from safetensors.torch import load_file, save_file

    directory = vitkit.save(make_vit(), tmp_path / "ckpt")
    weights = directory / native.WEIGHTS
    state = {k: v.to(torch.float8_e4m3fn) for k, v in load_file(weights).items()}
    meta = json.loads((directory / native.CONFIG).read_text())
    meta.pop("weights_sha256")  # a file made by hand, as a quantising tool writes it
    (directory / native.CONFIG).write_text(json.dumps(meta))
    save_file(state, weights)
    model = vitkit.load(directory)
    expected = {k: v.float() for k, v in state.items()}
    assert all(torch.equal(model.state_dict()[k], expected[k]) for k in expected)
    first = next(iter(state))
    state[first] = state[first].clone()
    state[first].view(-1)[0] = float("nan")
    save_file(state, weights)
    with pytest.raises(CheckpointError, match=f"NaN or infinite weights in 1 tensor.*{re.escape(first)} \\(1\\)"):
        vitkit.load(directory)
