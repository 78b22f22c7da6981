"""Foreign checkpoints (timm, HF, official .npz) are untrusted too: their headers' claims are bounded by the
file, their configs checked by field, and the model's size and shapes checked before any data is read."""

from __future__ import annotations

import io
import json
import os
import re
import struct
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from vitkit.checkpoints import Checkpoint, CheckpointError, check, native, read, tensorfile, write


@pytest.fixture
def no_data_read(monkeypatch):
    """Reading tensor data or building a real model fails the test."""

    def forbidden(*args, **kwargs):
        raise AssertionError("data read or model built before the checks")

    monkeypatch.setattr(native, "build_model", forbidden)
    monkeypatch.setattr(tensorfile, "load_file", forbidden)
    monkeypatch.setattr(np, "load", forbidden)


def safetensors_bytes(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def test_safetensors_header_claims_are_bounded_by_the_file(tmp_path, no_data_read):
    path = tmp_path / "huge.safetensors"  # 2.3 GB claimed by a file of a few bytes
    entry = {"dtype": "F32", "shape": [3_000_000, 3, 8, 8], "data_offsets": [0, 4 * 3_000_000 * 3 * 64]}
    path.write_bytes(safetensors_bytes({"patch_embed.proj.weight": entry}, b"\0" * 64))
    start = time.perf_counter()
    problem = ": the header describes 2304000000 bytes of data, the file holds 64"
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + problem):
        read(path)
    assert time.perf_counter() - start < 1.0
    path.write_bytes(struct.pack("<Q", 1 << 60) + b"{}")
    with pytest.raises(CheckpointError, match=r"the header claims 1152921504606846976 bytes, but the file has 2"):
        read(path)
    bad = {"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}
    path.write_bytes(safetensors_bytes(bad, b"\0" * 4))
    with pytest.raises(CheckpointError, match=r"tensor 'w': shape must be a list of at most 8 sizes >= 0, got \[-1\]"):
        read(path)
    empty = {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}  # 1,000,000 of them built as many meta tensors
    path.write_bytes(safetensors_bytes({f"t{i}": empty for i in range(100_001)}, b""))
    with pytest.raises(CheckpointError, match=r"100,001 tensors, more than the 100,000 of any weights"):
        read(path)


def timm_state(make_vit) -> dict[str, torch.Tensor]:
    """A tiny ViT whose head count timm's state dict implies (head_dim 64)."""
    return {k: v.contiguous() for k, v in make_vit(hidden_size=64, num_heads=1).state_dict().items()}


def test_timm_shapes_are_checked_before_the_data(tmp_path, make_vit, no_data_read):
    state = timm_state(make_vit)
    state["patch_embed.proj.weight"] = state["patch_embed.proj.weight"].reshape(64, -1)  # rank 2, not 4
    save_file(state, str(tmp_path / "a.safetensors"))
    problem = r"a\.safetensors: tensor patch_embed\.proj\.weight has shape \(64, 192\), expected 4"
    with pytest.raises(CheckpointError, match=problem):
        read(tmp_path / "a.safetensors")
    state = timm_state(make_vit)
    state["blocks.1.mlp.fc2.weight"] = torch.zeros(64, 48)  # fc1 says 64
    save_file(state, str(tmp_path / "b.safetensors"))
    problem = r"b\.safetensors does not fit the model: shape mismatch \['blocks\.1\.mlp\.fc2\.weight: "
    with pytest.raises(CheckpointError, match=problem + r"file \(64, 48\) vs model \(64, 64\)'\]"):
        read(tmp_path / "b.safetensors")


def test_timm_model_above_the_limit_is_refused_from_the_header(tmp_path, make_vit, no_data_read):
    save_file(timm_state(make_vit), str(tmp_path / "a.safetensors"))
    problem = r"a\.safetensors: the model needs .* above the limit of 100 bytes \(the limit given\)"
    with pytest.raises(CheckpointError, match=problem):
        read(tmp_path / "a.safetensors", max_bytes=100)


def test_pth_is_memory_mapped_or_bounded_by_the_limit(tmp_path, make_vit):
    model = make_vit(hidden_size=64, num_heads=1)
    torch.save(model.state_dict(), tmp_path / "zip.pth")
    torch.save(model.state_dict(), tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match=r"zip\.pth: the model needs .* kB .*of 100 bytes"):
        read(tmp_path / "zip.pth", max_bytes=100)
    with pytest.raises(CheckpointError, match=r"legacy\.pth: \d+\.\d kB would be read into memory, above the limit"):
        read(tmp_path / "legacy.pth", max_bytes=100)
    for name in ("zip.pth", "legacy.pth"):
        assert torch.equal(read(tmp_path / name).model.state_dict()["head.weight"], model.state_dict()["head.weight"])
    torch.save({1: torch.zeros(1)}, tmp_path / "keys.pth")
    problem = r"keys\.pth: the file does not hold a flat state dict of tensors with string names"
    with pytest.raises(CheckpointError, match=problem):
        read(tmp_path / "keys.pth")


def test_npz_member_headers_are_bounded_by_the_member(tmp_path, no_data_read):
    path = tmp_path / "w.npz"
    forged = io.BytesIO()  # a header claiming 80 MB before 16 bytes of data
    np.lib.format.write_array_header_1_0(forged, {"descr": "<f4", "fortran_order": False, "shape": (9999999, 2)})
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("embedding/kernel.npy", forged.getvalue() + b"\0" * 16)
    with pytest.raises(
        CheckpointError,
        match=r"w\.npz: member 'embedding/kernel\.npy': shape \[9999999, 2\] of <f4 "
        r"needs "
        r"79999992 bytes, the member holds 16",
    ):
        read(path)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", b"hello")
    with pytest.raises(CheckpointError, match=r"w\.npz: member 'notes\.txt' is not a \.npy array"):
        read(path)


@pytest.mark.parametrize(
    "edit, problem",
    [
        (
            {"num_hidden_layers": "12"},
            r"num_hidden_layers \(vitkit's depth\) must be an integer in \[1, 1024\], got '12'",
        ),
        (
            {"hidden_size": 3_000_000},
            r"hidden_size \(vitkit's hidden_size\) must be an integer in \[1, 65536\], got 3000000",
        ),
        (
            {"layer_norm_eps": float("nan")},
            r"layer_norm_eps \(vitkit's layer_norm_eps\) must be a finite number in \(0, 1\], got nan",
        ),
        ({"image_size": [32, "x"]}, r"image_size must be one size or two equal ones"),
        ({"hidden_act": ["gelu"]}, r"hidden_act \['gelu'\] has no vitkit equivalent"),
        ({"id2label": ["a", "b"]}, r"id2label must be an object"),
    ],
)
def test_hf_config_fields_are_named_as_hf_names_them(tmp_path, make_vit, edit, problem):
    pytest.importorskip("transformers")
    write(Checkpoint(model=make_vit(num_classes=0)), tmp_path / "hf", to="hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **edit}))
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + ": " + problem):
        read(tmp_path / "hf")


def _replace_member(path, name, raw):
    with zipfile.ZipFile(path) as archive:
        members = [(i.filename, archive.read(i)) for i in archive.infolist()]
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in members:
            archive.writestr(member, raw if member == name else data)


@pytest.mark.parametrize(
    "pickle_bytes, raised",
    [
        (b"\x80\x02a.", "IndexError"),  # APPEND on an empty stack
        (b"\x80\x02h\x05.", "KeyError"),  # a memo slot never filled
        (b"\x80\x02K\x05Q.", "AssertionError"),  # a persistent id that is not a tuple
    ],
)
def test_damaged_pickle_inside_a_torch_zip_is_named(tmp_path, pickle_bytes, raised):
    path = tmp_path / "w.pth"
    torch.save({"w": torch.zeros(2)}, path)
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith("data.pkl"))
    _replace_member(path, name, pickle_bytes)
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + ".*" + raised):
        read(path)


def test_unterminated_npy_header_is_named(tmp_path):
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (2,".ljust(117) + b"\n"
    path = tmp_path / "w.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("embedding/kernel.npy", b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header)
    with pytest.raises(CheckpointError, match=r"w\.npz: cannot be read as an \.npz archive \(TokenError"):
        read(path)


def test_an_official_npz_optimizer_state_is_not_inflated(tmp_path, make_vit, monkeypatch):
    """vit_jax files keep the parameters under opt/target/ beside the optimizer state: every member was inflated,
    so a 4 MB file with a deflated 4 GB opt/state/ member took 4 GB.  Only the parameters are read now."""
    model = make_vit()
    write(Checkpoint(model=model), tmp_path / "plain.npz", to="official")
    with np.load(tmp_path / "plain.npz") as plain, zipfile.ZipFile(tmp_path / "w.npz", "w", zipfile.ZIP_DEFLATED) as z:
        for key in plain.files:
            z.writestr(f"opt/target/{key}.npy", plain.zip.read(f"{key}.npy"))
        buffer = io.BytesIO()
        np.save(buffer, np.zeros(5_000_000, np.float32))
        z.writestr("opt/state/junk.npy", buffer.getvalue())
    opened = []
    real = np.lib.npyio.NpzFile.__getitem__
    monkeypatch.setattr(np.lib.npyio.NpzFile, "__getitem__", lambda self, key: opened.append(key) or real(self, key))
    back = read(tmp_path / "w.npz").model.state_dict()
    assert opened and not [key for key in opened if key.startswith("opt/state")]
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items())


def test_a_timm_patch_kernel_of_no_size_is_refused_by_name():
    """A kernel of shape (64, 1, 4, 0) beside model_args.img_size ended eval and serve in a ZeroDivisionError."""
    from vitkit.checkpoints.timm import grid_tokens

    state = {"patch_embed.proj.weight": torch.zeros(64, 1, 4, 0)}
    with pytest.raises(CheckpointError, match=r"m: patch_embed\.proj\.weight has shape \(64, 1, 4, 0\); expected"):
        grid_tokens(32, state, "m")
    assert grid_tokens(32, {"patch_embed.proj.weight": torch.zeros(64, 1, 4, 4)}, "m") == 64


def test_integer_or_boolean_weights_are_refused_before_the_data(tmp_path, make_vit, no_data_read):
    state = timm_state(make_vit)
    state["blocks.0.attn.qkv.weight"] = (state["blocks.0.attn.qkv.weight"] * 100).long()
    state["norm.weight"] = state["norm.weight"] > 0
    problem = (
        r"a\.safetensors does not fit the model: not floating-point numbers \['blocks\.0\.attn\.qkv\.weight: "
        r"file int64 vs model float32', 'norm\.weight: file bool vs model float32'\]"
    )
    _refused(state, tmp_path / "a.safetensors", problem)


def test_integer_or_boolean_arrays_of_an_official_npz_are_refused_not_cast(tmp_path, make_vit):
    """They were cast to float32 and the model converted, its weights truncated to whole numbers."""
    write(Checkpoint(model=make_vit()), tmp_path / "plain.npz", to="official")
    with np.load(tmp_path / "plain.npz") as plain:
        arrays = {key: plain[key] for key in plain.files}
    arrays["Transformer/encoder_norm/scale"] = arrays["Transformer/encoder_norm/scale"] > 0
    arrays["head/kernel"] = (arrays["head/kernel"] * 100).astype(np.int64)
    np.savez(tmp_path / "w.npz", **arrays)
    with pytest.raises(CheckpointError, match=r"w\.npz does not fit the model: not floating-point numbers \[.*bool"):
        read(tmp_path / "w.npz")
    key = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/key/kernel"  # fused between float q and v
    with np.load(tmp_path / "plain.npz") as plain:
        arrays = {name: plain[name] for name in plain.files}
    np.savez(tmp_path / "k.npz", **{**arrays, key: (arrays[key] * 100).astype(np.int64)})
    with pytest.raises(CheckpointError, match=r"floating-point numbers \[.blocks\.0\.attn\.qkv\.weight: file int64"):
        read(tmp_path / "k.npz")


def test_non_finite_weights_are_refused_naming_each_tensor(tmp_path, make_vit):
    state = timm_state(make_vit)
    state["head.weight"][1, 2] = float("nan")
    state["blocks.1.mlp.fc1.bias"][:3] = float("inf")
    problem = (
        r"a\.safetensors holds NaN or infinite weights in 2 tensor\(s\): (blocks\.1\.mlp\.fc1\.bias \(3\), "
        r"head\.weight \(1\)|head\.weight \(1\), blocks\.1\.mlp\.fc1\.bias \(3\)); the checkpoint is damaged"
    )
    _refused(state, tmp_path / "a.safetensors", problem)
    state["head.weight"][1, 2] = state["blocks.1.mlp.fc1.bias"][0] = 0.0  # one left: still refused
    _refused(state, tmp_path / "b.safetensors", r"in 1 tensor\(s\): blocks\.1\.mlp\.fc1\.bias \(2\)")


def _refused(state, path, problem: str) -> None:
    save_file(state, str(path))
    with pytest.raises(CheckpointError, match=problem):
        read(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo") or not Path("/dev/zero").exists(), reason="needs /dev/zero and FIFOs")
def test_a_device_or_fifo_is_refused_unread_as_file_or_directory_entry(tmp_path, make_vit):
    (tmp_path / "zero.pt").symlink_to("/dev/zero")  # its size reads as 0: the memory limit had let it fill memory
    os.mkfifo(tmp_path / "fifo.safetensors")  # reading it had hung
    native.save(make_vit(), tmp_path / "c")
    (tmp_path / "c" / "model.safetensors").unlink()
    os.mkfifo(tmp_path / "c" / "model.safetensors")
    for path in (tmp_path / "zero.pt", tmp_path / "fifo.safetensors", tmp_path / "c"):
        named = path / "model.safetensors" if path.is_dir() else path
        with pytest.raises(CheckpointError, match=re.escape(f"{named}: not a regular file (a device, FIFO")):
            read(path)


def test_a_resampled_checkpoint_records_the_resolution_it_came_from(tmp_path, make_vit):
    native.save(make_vit(), tmp_path / "c")
    checkpoint = read(tmp_path / "c", img_size=48)
    assert checkpoint.provenance["resampled_from"] == 32 and checkpoint.config.img_size == 48


def test_a_safetensors_file_named_as_a_torch_file_is_read_as_what_it_is(tmp_path, make_vit):
    state = timm_state(make_vit)
    save_file(state, str(tmp_path / "weights.pt"))  # had been refused as a pickle that "could run code"
    read_back = read(tmp_path / "weights.pt").model.state_dict()
    assert torch.equal(read_back["head.weight"], state["head.weight"])


def test_a_timm_head_bias_without_its_weight_is_named_damaged(tmp_path, make_vit):
    state = timm_state(make_vit)
    del state["head.weight"]  # had been read as head-less: "unexpected ['head.bias']"
    _refused(state, tmp_path / "a.safetensors", r"a\.safetensors: head\.bias without head\.weight; the file is damaged")


def test_a_damaged_preprocessor_or_weights_file_is_named_not_taken_for_missing(tmp_path, make_vit):
    """An HF preprocessor_config.json that is a folder was skipped for default normalisation, silently; a vitkit
    model.safetensors that is a folder was reported missing."""
    model = make_vit(num_classes=0, pool="token")
    write(Checkpoint(model=model), tmp_path / "hf", to="hf")
    (tmp_path / "hf" / "preprocessor_config.json").unlink()
    (tmp_path / "hf" / "preprocessor_config.json").mkdir()
    with pytest.raises(CheckpointError, match=r"preprocessor_config\.json: cannot be read \(Is a directory\)"):
        read(tmp_path / "hf")
    write(Checkpoint(model=model), tmp_path / "native")
    (tmp_path / "native" / "model.safetensors").unlink()
    (tmp_path / "native" / "model.safetensors").mkdir()
    with pytest.raises(FileNotFoundError, match=r"checkpoint: model\.safetensors is not a regular file"):
        read(tmp_path / "native")


@pytest.mark.parametrize("cut", ["half", "empty"])
@pytest.mark.parametrize("to", ["vitkit", "official", "timm", "hf"])
def test_check_finds_a_cut_weights_file_without_reading_its_data(tmp_path, make_vit, no_data_read, to, cut):
    """`check` (what `vitkit serve` asks before it binds its port) passes an intact checkpoint of every format
    and refuses one whose weights a copy cut short or left empty, reading headers only."""
    written = write(Checkpoint(model=make_vit()), tmp_path / ("m.npz" if to == "official" else "m"), to=to)
    assert check(written) == to
    weights = written if to == "official" else written / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if cut == "half" else b"")
    with pytest.raises(CheckpointError, match=re.escape(str(weights))):
        check(written)


@pytest.mark.parametrize("where", ["file", "directory"])
def test_check_opens_a_torch_pickle_as_read_does(tmp_path, make_vit, where):
    """A cut pytorch_model.bin or .pth passed `check` unread, and the server said it ran before the load failed."""
    if where == "file":
        weights = tmp_path / "m.pth"
    else:
        written = write(Checkpoint(model=make_vit()), tmp_path / "m", to="timm")
        (written / "model.safetensors").unlink()
        weights = written / "pytorch_model.bin"
    torch.save(timm_state(make_vit), weights)  # `check` opens the file; the keys are `read`'s to check
    assert check(weights if where == "file" else weights.parent) == "timm"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match=re.escape(str(weights))):
        check(weights if where == "file" else weights.parent)


def test_check_refuses_an_hf_directory_without_weights(tmp_path, make_vit):
    """A download that stopped after config.json passed `check`; the server bound its port, then failed to load."""
    written = write(Checkpoint(model=make_vit(num_classes=0)), tmp_path / "hf", to="hf")
    (written / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="has neither model.safetensors nor pytorch_model.bin"):
        check(written)
