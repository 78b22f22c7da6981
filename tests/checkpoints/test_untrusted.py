"""Checkpoints from elsewhere are untrusted: a hand-edited config is refused by field and file, within a
second, before any model is built or any tensor data read."""

from __future__ import annotations

import json
import re
import time

import pytest
from PIL import Image

import vitkit
from vitkit.checkpoints import CheckpointError, limits, native, read, surgery
from vitkit.models import list_models, preset_config
from vitkit.models.configs import HybridConfig, ViTConfig
from vitkit.models.flops import model_flops, vit_flops


@pytest.fixture
def no_allocation(monkeypatch):
    """Building a real model or reading tensor data fails the test: only headers may be read."""

    def forbidden(*args, **kwargs):
        raise AssertionError("allocated before the checks")

    monkeypatch.setattr(native, "build_model", forbidden)
    monkeypatch.setattr(native, "load_file", forbidden)


def edit_model_config(directory, **fields):
    path = directory / "config.json"
    meta = json.loads(path.read_text())
    meta["model"].update(fields)
    path.write_text(json.dumps(meta))
    return path


@pytest.mark.parametrize(
    "field, value, problem",
    [
        ("depth", 1_000_000, r"model\.depth must be an integer in \[1, 1024\], got 1000000"),
        ("hidden_size", 3_000_000, r"model\.hidden_size must be an integer in \[1, 65536\], got 3000000"),
        ("depth", -3, r"model\.depth must be an integer in \[1, 1024\], got -3"),
        ("hidden_size", "192", r"model\.hidden_size must be an integer in \[1, 65536\], got '192'"),
        ("layer_norm_eps", float("nan"), r"model\.layer_norm_eps must be a finite number in \(0, 1\], got nan"),
    ],
)
def test_hand_edited_config_is_refused_by_field_and_file(tmp_path, make_vit, no_allocation, field, value, problem):
    vitkit.save(make_vit(), tmp_path / "c")
    config = edit_model_config(tmp_path / "c", **{field: value})
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=re.escape(str(config)) + ": " + problem):
        vitkit.load(tmp_path / "c")
    assert time.perf_counter() - start < 1.0


def test_divisibility_and_family_errors_name_the_file(tmp_path, make_vit, no_allocation):
    vitkit.save(make_vit(), tmp_path / "c")
    config = edit_model_config(tmp_path / "c", hidden_size=30, num_heads=4)
    problem = ": model: hidden_size 30 is not divisible by num_heads 4"
    with pytest.raises(CheckpointError, match=re.escape(str(config)) + problem):
        read(tmp_path / "c")
    edit_model_config(tmp_path / "c", family="transformer-xl")
    with pytest.raises(CheckpointError, match=r"config\.json: model: unknown model family 'transformer-xl'"):
        read(tmp_path / "c")


def test_header_shapes_are_checked_against_the_meta_model_first(tmp_path, make_vit, no_allocation):
    vitkit.save(make_vit(), tmp_path / "c")
    meta = json.loads((tmp_path / "c" / "config.json").read_text())
    meta["model"].update(depth=3, mlp_dim=48)
    del meta["weights_sha256"]
    (tmp_path / "c" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(
        CheckpointError,
        match=r"model\.safetensors does not fit the model: missing \['blocks\.2\..*"
        r"shape mismatch.*blocks\.0\.mlp\.fc1\.weight: file \(64, 32\) vs model \(48, 32\)",
    ):
        read(tmp_path / "c")


def test_model_above_the_limit_is_refused_with_how_to_raise_it(tmp_path, make_vit, no_allocation, monkeypatch):
    vitkit.save(make_vit(), tmp_path / "c")
    need = limits.model_bytes(make_vit().config)
    assert need == 4 * sum(t.numel() for t in make_vit().state_dict().values())
    with pytest.raises(
        CheckpointError,
        match=r"config\.json: the model needs \d+\.\d (kB|MB) \(\d+ bytes.*above the limit "
        r"of 1\.0 kB \(the limit given\).*max_bytes=.*--max-model-gb",
    ):
        read(tmp_path / "c", max_bytes=1000)
    monkeypatch.setattr(limits, "available_memory", lambda: need - 1)  # the default: what is free now
    with pytest.raises(CheckpointError, match=r"above the limit of \d+\.\d (kB|MB) \(the memory available now\)"):
        read(tmp_path / "c")
    monkeypatch.setattr(limits, "available_memory", lambda: need)  # exactly enough: reading goes on to build
    with pytest.raises(AssertionError, match="allocated before the checks"):
        read(tmp_path / "c")


def test_within_range_but_huge_is_refused_by_the_size_limit_fast(tmp_path, make_vit, no_allocation):
    vitkit.save(make_vit(), tmp_path / "c")
    edit_model_config(tmp_path / "c", hidden_size=60000, num_heads=2, mlp_dim=240000, depth=16)
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=r"the model needs 276\d\.\d GB"):  # 16 x (4 D^2 + 2 D x 4D) x 4 bytes
        read(tmp_path / "c", max_bytes=10**12)
    assert time.perf_counter() - start < 1.0


def test_model_under_the_limit_still_loads(tmp_path, make_vit):
    model = make_vit()
    vitkit.save(model, tmp_path / "c")
    back = read(tmp_path / "c", max_bytes=limits.model_bytes(model.config))
    assert back.config == model.config
    assert read(tmp_path / "c", max_bytes=float("inf")).config == model.config  # no limit
    for bad in (-1, float("nan"), "1GB"):
        with pytest.raises(ValueError, match="max_bytes must be a number of bytes >= 0"):
            read(tmp_path / "c", max_bytes=bad)


@pytest.mark.parametrize(
    "edit, problem",
    [
        ({"class_names": ["a", 3, "c", "d", "e"]}, r"class_names must be null or a list of 5 strings"),
        ({"class_names": ["a"]}, r"class_names must be null or a list of 5 strings"),
        (
            {"normalization": {"mean": [0.5, "x", 0.5], "std": [0.5] * 3}},
            r"normalization\.mean must be a list of 1 or 3 finite numbers",
        ),
        (
            {"normalization": {"mean": [0.5] * 3, "std": [0.5, 0.0, 0.5]}},
            r"normalization\.std must be a list of 1 or 3 finite numbers > 0",
        ),
        ({"provenance": [1, 2]}, r"provenance must be an object"),
        ({"weights_sha256": 5}, r"weights_sha256 must be a hex string"),
    ],
)
def test_other_fields_of_config_json_are_checked(tmp_path, make_vit, no_allocation, edit, problem):
    vitkit.save(make_vit(), tmp_path / "c")
    path = tmp_path / "c" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **edit}))
    with pytest.raises(CheckpointError, match=re.escape(str(path)) + ": " + problem):
        read(tmp_path / "c")


@pytest.mark.parametrize(
    "text, problem",
    [
        (b"\xff\xfe{}", "is not UTF-8"),
        (b'{"format": "vitkit", "model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested too deeply"),
        (b'{"format": "vitkit", "model": {"depth": 1' + b"0" * 5000 + b"}}", "not valid JSON"),
        (b"[1, 2]", "must hold a JSON object"),
    ],
)
def test_damaged_config_json_is_named(tmp_path, make_vit, text, problem):
    vitkit.save(make_vit(), tmp_path / "c")
    (tmp_path / "c" / "config.json").write_bytes(text)
    with pytest.raises(CheckpointError, match=re.escape(str(tmp_path / "c" / "config.json")) + ".*" + problem):
        read(tmp_path / "c")


def test_sizes_are_written_in_the_unit_that_keeps_their_digits():
    words = [limits.size_words(n) for n in (0, 999, 1_000, 1_234, 21_960_000, 1_500_000_000)]
    assert words == ["0 bytes", "999 bytes", "1.0 kB", "1.2 kB", "22.0 MB", "1.5 GB"]


def test_a_config_asking_absurd_work_per_image_is_refused_before_building(tmp_path, make_vit, no_allocation):
    # a few kB of config: an 8192-px ViT without position embeddings had run `predict` for hours
    vitkit.save(make_vit(), tmp_path / "c")
    edit_model_config(tmp_path / "c", img_size=8192, patch_size=8, posemb="none")
    with pytest.raises(
        CheckpointError,
        match=r"config\.json: one 8192-px image through this model would take "
        r"[\d,.]+ TFLOP and [\d.]+ GB for one activation, above vitkit's bounds of 50 TFLOP",
    ):
        read(tmp_path / "c")


def test_work_per_image_is_the_vit_count_with_narrow_attention_floored():
    wide = preset_config("vit_b16", num_classes=10)
    assert limits.image_work(wide) == (vit_flops(wide), 197 * 3072 * 4)  # B/16: its MLP's hidden activations
    narrow = ViTConfig(img_size=64, patch_size=8, hidden_size=16, depth=3, num_heads=2, mlp_dim=32, num_classes=2)
    tokens = 8 * 8 + 1
    assert limits.image_work(narrow)[0] == vit_flops(narrow) + 3 * 4 * tokens**2 * (64 - 16)


@pytest.mark.parametrize(
    "config",
    [
        preset_config("bit_r50x1", img_size=64, num_classes=10),
        preset_config("r26_vit_s32", img_size=64, num_classes=10),
        HybridConfig(
            vit=ViTConfig(img_size=64, patch_size=4, hidden_size=64, depth=1, num_heads=1, mlp_dim=64), resnet_layers=()
        ),  # the official R+Ti/16 layout: a root block alone; it had been under-counted
    ],
)
def test_convolutional_work_is_bounded_above_its_traced_count(config):
    bound, exact = limits.image_work(config)[0], model_flops(config)
    assert exact <= bound <= 4 * exact


def test_every_preset_at_twice_the_papers_resolution_is_within_the_bounds():
    for name in list_models():
        for side in (224, 448):  # every patch size and stride divides both
            limits.check_work(preset_config(name, img_size=side, num_classes=1000), name)  # raises if refused
    huge = preset_config("bit_r50x1", img_size=16384, num_classes=10)
    with pytest.raises(CheckpointError, match="16384-px image .* 139.8 TFLOP and 34.4 GB for one activation"):
        limits.check_work(huge, "r50")


def test_an_absurd_resolution_asked_at_run_time_is_refused_before_building(tmp_path, make_vit):
    model = make_vit()
    vitkit.save(model, tmp_path / "c")
    with pytest.raises(
        CheckpointError, match=r"the model at 16384 px: one 16384-px image .* choose a smaller resolution"
    ):
        surgery.change_resolution(model, 16384)
    picture = tmp_path / "a.png"
    Image.new("RGB", (40, 40), (9, 99, 199)).save(picture)
    with pytest.raises(CheckpointError, match=r"--img-size 16384: one 16384-px image .* choose a smaller --img-size"):
        vitkit.predict(tmp_path / "c", [picture], img_size=16384)
    assert surgery.change_resolution(model, 64).config.img_size == 64  # a sane size still changes
