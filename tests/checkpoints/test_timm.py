"""timm ViT state dicts: exact round trips, numerics carried (exact GELU), parity with timm itself.

`import timm` needs torchvision, which has no CPU build here; the parity tests stub torchvision in
sys.modules while timm's vision_transformer module is imported (it only touches torchvision for data
transforms), restore sys.modules afterwards, and skip cleanly if that fails.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from timm_stub import import_timm
from vitkit.checkpoints import Checkpoint, read, timm, write
from vitkit.models import build_model


@pytest.fixture(scope="module")
def timm_vit():
    """timm's VisionTransformer class, imported with torchvision stubbed; sys.modules restored after."""
    return import_timm("timm.models.vision_transformer").VisionTransformer


def _timm_dir(tmp_path, model, num_heads):
    directory = tmp_path / "timm"
    directory.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(
        json.dumps({"architecture": "vit_tiny_patch16_224", "model_args": {"num_heads": num_heads}})
    )
    return directory


def _randomise(model):
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.1)
    return model.eval()


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"class_token": False, "global_pool": "avg", "fc_norm": False},
        {"no_embed_class": True},
        {"qkv_bias": False},
    ],
    ids=["token", "gap", "no_embed_class", "no_qkv_bias"],
)
def test_logits_match_timm(tmp_path, timm_vit, images, kwargs):
    reference = _randomise(
        timm_vit(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=5, **kwargs)
    )
    checkpoint = read(_timm_dir(tmp_path, reference, 2))
    assert (checkpoint.config.gelu, checkpoint.config.layer_norm_eps) == ("exact", 1e-6)
    with torch.no_grad():
        expected = reference(images)
        diff = (checkpoint.model(images) - expected).abs().max().item()
    assert diff <= 1e-5, diff
    assert expected.abs().max() > 0.1


def test_timm_loads_our_export(tmp_path, timm_vit, make_vit, images):
    model = make_vit(gelu="exact", pool="gap")
    out = write(Checkpoint(model=model), tmp_path / "t", to="timm")
    args = json.loads((out / "config.json").read_text())["model_args"]
    reference = timm_vit(**args).eval()
    reference.load_state_dict(read(out).model.state_dict(), strict=True)
    with torch.no_grad():
        assert (reference(images) - model(images)).abs().max() <= 1e-5


def test_round_trip_vitkit_timm_vitkit_is_exact(tmp_path, make_vit):
    for index, overrides in enumerate([{}, {"pool": "gap", "qkv_bias": False}, {"representation_size": 16}]):
        model = make_vit(gelu="exact", **overrides)
        back = read(write(Checkpoint(model=model, class_names=list("abcde")), tmp_path / f"t{index}", to="timm"))
        assert back.config == model.config and back.class_names == list("abcde")
        for (name, a), b in zip(model.state_dict().items(), back.model.state_dict().values()):
            assert torch.equal(a, b), name


def test_exact_gelu_is_carried(tmp_path, make_vit, images):
    model = make_vit(gelu="exact")
    checkpoint = read(write(Checkpoint(model=model), tmp_path / "t", to="timm"))
    tanh = build_model(checkpoint.config.__class__(**{**checkpoint.config.__dict__, "gelu": "tanh"})).eval()
    tanh.load_state_dict(checkpoint.model.state_dict())
    with torch.no_grad():
        ours, wrong = checkpoint.model(images), tanh(images)
    assert torch.equal(ours, model(images))
    assert (ours - wrong).abs().max() > 1e-5  # the GELU variant is visible in the logits: carrying it matters


def test_pth_state_dict_with_wrapper_and_config(tmp_path, make_vit, images):
    model = make_vit(gelu="exact")
    torch.save(
        {"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}, "epoch": 3}, tmp_path / "m.pth"
    )
    back = read(tmp_path / "m.pth", config=model.config).model
    with torch.no_grad():
        assert torch.equal(back(images), model(images))
    with pytest.raises(ValueError, match="num_heads"):  # D=32: no Table 1 size, not a multiple of 64
        read(tmp_path / "m.pth")


def test_unsupported_timm_variants_are_named(tmp_path, make_vit):
    state = dict(timm.from_vitkit(Checkpoint(model=make_vit(pool="gap"))))
    state["fc_norm.weight"] = torch.ones(32)
    save_file(state, str(tmp_path / "a.safetensors"))
    with pytest.raises(ValueError, match="fc_norm"):
        read(tmp_path / "a.safetensors")


def test_tanh_gelu_is_carried_to_timm_and_back(tmp_path, timm_vit, make_vit, images):
    model = make_vit(gelu="tanh")
    out = write(Checkpoint(model=model), tmp_path / "t", to="timm")
    args = json.loads((out / "config.json").read_text())["model_args"]
    assert args["act_layer"] == "gelu_tanh"
    back = read(out)
    assert back.config == model.config
    reference = timm_vit(**args).eval()  # timm builds its own tanh GELU from the name
    reference.load_state_dict(back.model.state_dict(), strict=True)
    with torch.no_grad():
        assert torch.equal(back.model(images), model(images))
        assert (reference(images) - model(images)).abs().max() <= 1e-5


def test_timm_activation_names_are_read_or_refused(tmp_path, make_vit):
    out = write(Checkpoint(model=make_vit(gelu="exact")), tmp_path / "t", to="timm")
    meta = json.loads((out / "config.json").read_text())
    for name, gelu in (("gelu", "exact"), ("gelu_tanh", "tanh"), (None, "exact")):
        meta["model_args"]["act_layer"] = name
        (out / "config.json").write_text(json.dumps(meta))
        assert read(out).config.gelu == gelu
    meta["model_args"]["act_layer"] = "quick_gelu"
    (out / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="act_layer.*quick_gelu"):
        read(out)


def test_a_timm_architecture_whose_default_is_the_tanh_gelu_is_read_with_it(tmp_path, make_vit):
    """timm builds the SigLIP 2-era GAP ViTs with the tanh GELU by default, so their hub config.json does not
    name it; they were read with the exact GELU (about 2e-4 on the logits)."""
    out = write(Checkpoint(model=make_vit(gelu="exact")), tmp_path / "t", to="timm")
    meta = json.loads((out / "config.json").read_text())
    del meta["model_args"]["act_layer"]
    for architecture, gelu in (
        ("vit_so400m_patch16_siglip_gap_384", "tanh"),
        ("vit_base_patch32_siglip_gap_256.v2_webli", "tanh"),  # a pretrained tag after the name
        ("vit_base_patch16_siglip_gap_224", "exact"),  # SigLIP 1: timm's default GELU
        ("vit_base_patch16_224", "exact"),
    ):
        (out / "config.json").write_text(json.dumps({**meta, "architecture": architecture}))
        assert read(out).config.gelu == gelu, architecture
    named = {**meta, "architecture": "vit_so400m_patch16_siglip_gap_384"}
    named["model_args"] = {**meta["model_args"], "act_layer": "gelu"}  # model_args override the default
    (out / "config.json").write_text(json.dumps(named))
    assert read(out).config.gelu == "exact"


def test_layer_norm_eps_timm_cannot_carry_is_warned(tmp_path, make_vit, caplog):
    with caplog.at_level("WARNING", logger="vitkit"):
        write(Checkpoint(model=make_vit(gelu="exact", layer_norm_eps=1e-12)), tmp_path / "t", to="timm")
    assert "LayerNorm eps 1e-06" in caplog.text and "1e-12" in caplog.text


def _hub_dir(tmp_path, model, name, **model_args):
    directory = tmp_path / name
    directory.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    meta = {"architecture": "vit_tiny_patch16_224", "model_args": {"num_heads": 2, **model_args}}
    (directory / "config.json").write_text(json.dumps(meta))
    return directory


def test_timm_pooling_vitkit_does_not_compute_is_refused_not_misread(tmp_path, timm_vit):
    """A class-token model pooled by averaging (global_pool='avg'), or by max, was read as token pooling or
    as GAP and gave logits off by 1-3 with no word; model_args says how timm pools."""
    small = {"img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2, "num_classes": 3}
    for pool in ("avg", "max", "avgmax"):
        model = timm_vit(**small, global_pool=pool, fc_norm=False)
        with pytest.raises(ValueError, match=f"global_pool {pool!r}"):
            read(_hub_dir(tmp_path, model, pool, global_pool=pool, fc_norm=False))
    gap = timm_vit(**small, global_pool="avg", class_token=False, fc_norm=False)
    assert read(_hub_dir(tmp_path, gap, "gap", global_pool="avg", class_token=False)).config.pool == "gap"


def test_a_non_square_timm_grid_is_refused_not_read_as_a_square_one(tmp_path, timm_vit):
    """32x48 at patch 8 is 24 patch rows plus the class row: 25, read as a 5x5 grid without a class row."""
    model = timm_vit(img_size=(32, 48), patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3)
    with pytest.raises(ValueError, match=r"img_size \[32, 48\].*square"):
        read(_hub_dir(tmp_path, model, "wide", img_size=[32, 48]))
    square = timm_vit(img_size=40, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3, no_embed_class=True)
    assert read(_hub_dir(tmp_path, square, "square", img_size=40, no_embed_class=True)).config.img_size == 40


def test_a_guessed_head_count_is_always_said(tmp_path, make_vit, caplog):
    """A Table 1 width took Table 1's head count in silence; timm's vit_base_patch16_gap_224 has 16 heads."""
    state = timm.from_vitkit(Checkpoint(model=make_vit(gelu="exact", hidden_size=192, num_heads=3, mlp_dim=64)))
    save_file(dict(state), str(tmp_path / "b.safetensors"))
    with caplog.at_level("WARNING", logger="vitkit"):
        assert read(tmp_path / "b.safetensors").config.num_heads == 3
    assert "num_heads is not recorded" in caplog.text and "assuming 3" in caplog.text


def test_an_mlp_width_timm_would_round_down_is_written_so_that_timm_builds_it(tmp_path, timm_vit, make_vit, images):
    """timm builds fc1 with int(embed_dim * mlp_ratio): 56 x (244 / 56) is 243.99..., and 243 did not load."""
    model = make_vit(gelu="exact", hidden_size=56, num_heads=2, mlp_dim=244)
    args = json.loads((write(Checkpoint(model=model), tmp_path / "t", to="timm") / "config.json").read_text())
    reference = timm_vit(**args["model_args"]).eval()
    reference.load_state_dict(read(tmp_path / "t").model.state_dict(), strict=True)
    with torch.no_grad():
        assert (reference(images) - model(images)).abs().max() <= 1e-5
    assert model_args_of(make_vit(gelu="exact"))["mlp_ratio"] == 2.0  # a ratio timm keeps is written as it is


def model_args_of(model):
    return timm.model_args(model.config)


def test_a_pre_logits_layer_timm_has_no_place_for_is_warned(tmp_path, make_vit, caplog):
    with caplog.at_level("WARNING", logger="vitkit"):
        write(Checkpoint(model=make_vit(gelu="exact", representation_size=16)), tmp_path / "t", to="timm")
    assert "pre-logits layer" in caplog.text and "timm >= 0.9" in caplog.text


def test_a_hub_directory_of_pytorch_model_bin_and_model_args_alone_is_read(tmp_path, timm_vit, images):
    """timm's save_for_hf layout with a torch file (older hub repos), and a config.json of model_args only."""
    reference = _randomise(timm_vit(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5))
    directory = _timm_dir(tmp_path, reference, 2)
    (directory / "model.safetensors").unlink()
    torch.save(reference.state_dict(), directory / "pytorch_model.bin")
    (directory / "config.json").write_text(json.dumps({"model_args": {"num_heads": 2}}))
    checkpoint = read(directory)
    assert checkpoint.config.num_heads == 2 and checkpoint.provenance["source"].endswith("pytorch_model.bin")
    with torch.no_grad():
        assert (checkpoint.model(images) - reference(images)).abs().max() <= 1e-5


def test_the_head_count_an_architecture_fixes_is_read_from_its_name(tmp_path, timm_vit):
    """timm's save_for_hf leaves num_heads out of model_args where the architecture fixes it: a SigLIP so400m
    (1152 wide, 16 heads) was read with 18 (width / 64) and a warning, its logits off by up to 1.8; so was
    vit_base_patch16_gap_224 (768 wide, 16 heads, not Table 1's 12)."""
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    named = (("vit_so400m_patch16_siglip_gap_256.v2_webli", 1152), ("vit_base_patch16_gap_224", 768))
    for architecture, width in named:
        model = _randomise(
            timm_vit(img_size=16, patch_size=8, embed_dim=width, depth=1, num_heads=16, mlp_ratio=0.25, num_classes=3,
                     global_pool="avg", class_token=False, fc_norm=False)
        )  # fmt: skip
        directory = tmp_path / architecture
        directory.mkdir()
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
        args = {"img_size": 16, "depth": 1, "num_classes": 3, "global_pool": "avg", "class_token": False}
        (directory / "config.json").write_text(json.dumps({"architecture": architecture, "model_args": args}))
        read_back = read(directory)
        assert read_back.config.num_heads == 16, architecture
        with torch.no_grad():
            torch.testing.assert_close(read_back.model.eval()(x), model(x), atol=2e-5, rtol=1e-4)
    assert timm.architecture_heads("vit_so400m_patch14_siglip_224", 768) is None  # another width: not this table's
    assert timm.architecture_heads("vit_small_patch16_224", 384) is None  # Table 1 gives timm's count


def test_a_top_level_global_pool_without_model_args_is_heeded(tmp_path, timm_vit):
    """Older hub directories have no model_args, and timm writes the pooling at the top level too: a class-token
    model pooled by averaging was read as token pooling there, its logits wrong with no word."""
    small = {"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 1, "num_heads": 1, "num_classes": 3}
    model = timm_vit(**small, global_pool="avg", fc_norm=False)
    directory = _hub_dir(tmp_path, model, "root")
    (directory / "config.json").write_text(json.dumps({"architecture": "vit_tiny_patch16_224", "global_pool": "avg"}))
    with pytest.raises(ValueError, match="global_pool 'avg' with a class token"):
        read(directory)
    (directory / "config.json").write_text(json.dumps({"architecture": "vit_x", "global_pool": "token"}))
    assert read(directory).config.pool == "token"  # the same weights, pooled by the class token: read


def test_label_names_as_an_object_of_indices_are_read(tmp_path, make_vit):
    """timm writes label_names as index -> name where some classes have none; that form was refused."""
    out = write(Checkpoint(model=make_vit(gelu="exact", num_classes=4)), tmp_path / "t", to="timm")
    meta = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**meta, "label_names": {"0": "cat", "2": "dog", "3": "emu"}}))
    assert read(out).class_names == ["cat", "1", "dog", "emu"]
    (out / "config.json").write_text(json.dumps({**meta, "label_names": {"0": "cat", "4": "dog"}}))
    with pytest.raises(ValueError, match="class indices below 4"):
        read(out)
