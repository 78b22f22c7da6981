"""HF transformers ViT: parity with a randomly initialised reference model, exact round trips."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from vitkit.checkpoints import Checkpoint, read, write

transformers = pytest.importorskip("transformers")
transformers.ViTForImageClassification  # noqa: B018  (resolve the lazy import at collection, not in a timed test)


def _hf_config(**overrides):
    fields = dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        image_size=32, patch_size=8, num_labels=5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return transformers.ViTConfig(**{**fields, **overrides})


def _randomise_hf(model):
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.1)  # heads/biases start at 0 in HF too
    return model.eval()


def test_logits_match_hf_classifier(tmp_path, images):
    reference = _randomise_hf(
        transformers.ViTForImageClassification(_hf_config(id2label={0: "a", 1: "b", 2: "c", 3: "d", 4: "e"}))
    )
    reference.save_pretrained(tmp_path / "hf")
    checkpoint = read(tmp_path / "hf")
    config = checkpoint.config
    assert (config.gelu, config.layer_norm_eps, config.num_heads) == ("exact", 1e-12, 2)  # HF numerics carried
    assert checkpoint.class_names == ["a", "b", "c", "d", "e"]
    with torch.no_grad():
        expected = reference(pixel_values=images).logits
        diff = (checkpoint.model(images) - expected).abs().max().item()
    assert diff <= 1e-5, diff
    assert expected.abs().max() > 0.1


def test_vit_model_pooler_is_pre_logits(tmp_path, images):
    reference = _randomise_hf(transformers.ViTModel(_hf_config(pooler_output_size=24)))
    reference.save_pretrained(tmp_path / "hf")
    model = read(tmp_path / "hf").model
    assert model.config.representation_size == 24 and model.config.num_classes == 0
    with torch.no_grad():
        diff = (model(images) - reference(pixel_values=images).pooler_output).abs().max().item()
    assert diff <= 1e-5, diff


def test_round_trip_vitkit_hf_vitkit_is_exact_and_hf_loads_it(tmp_path, make_vit, images):
    model = make_vit(gelu="exact", layer_norm_eps=1e-12)
    names = ["zero", "one", "two", "three", "four"]
    out = write(
        Checkpoint(model=model, class_names=names, mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.4)), tmp_path / "hf", to="hf"
    )
    back = read(out)
    assert back.config == model.config and back.class_names == names
    assert back.mean == (0.4, 0.5, 0.6) and back.std == (0.2, 0.3, 0.4)
    for (name, a), b in zip(model.state_dict().items(), back.model.state_dict().values()):
        assert torch.equal(a, b), name
    hf_model = transformers.ViTForImageClassification.from_pretrained(out).eval()
    assert hf_model.config.id2label[3] == "three"
    with torch.no_grad():
        diff = (hf_model(pixel_values=images).logits - model(images)).abs().max().item()
    assert diff <= 1e-5, diff


def test_tanh_gelu_is_exported_as_gelu_pytorch_tanh(tmp_path, make_vit, images):
    model = make_vit()  # vitkit default: official tanh GELU, eps 1e-6
    out = write(Checkpoint(model=model), tmp_path / "hf", to="hf")
    hf = json.loads((out / "config.json").read_text())
    assert (hf["hidden_act"], hf["layer_norm_eps"]) == ("gelu_pytorch_tanh", 1e-6)
    hf_model = transformers.ViTForImageClassification.from_pretrained(out).eval()
    with torch.no_grad():
        assert (hf_model(pixel_values=images).logits - model(images)).abs().max() <= 1e-5


def test_what_hf_cannot_hold_is_refused(tmp_path, make_vit):
    with pytest.raises(ValueError, match="gap"):
        write(Checkpoint(model=make_vit(pool="gap")), tmp_path / "a", to="hf")
    with pytest.raises(ValueError, match="no pre-logits layer"):
        write(Checkpoint(model=make_vit(representation_size=16)), tmp_path / "b", to="hf")


def test_missing_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    transformers.ViTForImageClassification(_hf_config()).save_pretrained(tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    state = load_file(str(weights))
    del state["vit.encoder.layer.1.output.dense.weight"]
    save_file(state, str(weights))
    with pytest.raises(ValueError, match=r"vit\.encoder\.layer\.1\.output\.dense\.weight"):
        read(tmp_path / "hf")


def test_features_model_exports_as_vit_model_with_pooler(tmp_path, make_vit, images):
    model = make_vit(representation_size=16, num_classes=0, gelu="exact")
    out = write(Checkpoint(model=model), tmp_path / "hf", to="hf")
    hf_model = transformers.ViTModel.from_pretrained(out).eval()
    with torch.no_grad():
        assert (hf_model(pixel_values=images).pooler_output - model(images)).abs().max() <= 1e-5


def test_an_encoder_without_pre_logits_says_how_hf_reads_it(tmp_path, make_vit, images, caplog):
    """ViTModel builds a pooler by default; this encoder has none to give, so HF drew one at random and its
    pooler_output was noise, said only in HF's own load report."""
    import logging

    model = make_vit(num_classes=0, gelu="exact")
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        out = write(Checkpoint(model=model), tmp_path / "hf", to="hf")
    assert "add_pooling_layer=False" in caplog.text and "last_hidden_state[:, 0]" in caplog.text
    hf_model = transformers.ViTModel.from_pretrained(out, add_pooling_layer=False).eval()
    with torch.no_grad():
        assert (hf_model(pixel_values=images).last_hidden_state[:, 0] - model(images)).abs().max() <= 1e-5
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        write(Checkpoint(model=make_vit(representation_size=16, num_classes=0)), tmp_path / "pooled", to="hf")
    assert "add_pooling_layer" not in caplog.text  # its pre-logits layer is the pooler


def test_pytorch_model_bin_is_read_weights_only(tmp_path, images):
    from safetensors.torch import load_file

    reference = _randomise_hf(transformers.ViTForImageClassification(_hf_config()))
    reference.save_pretrained(tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    torch.save(load_file(str(weights)), tmp_path / "hf" / "pytorch_model.bin")  # the pre-safetensors layout
    weights.unlink()
    with torch.no_grad():
        diff = (read(tmp_path / "hf").model(images) - reference(pixel_values=images).logits).abs().max().item()
    assert diff <= 1e-5, diff


def test_an_id2label_shorter_than_the_head_is_said_not_dropped_silently(caplog) -> None:
    from vitkit.checkpoints import hf as hf_format

    with caplog.at_level(logging.WARNING):
        assert hf_format.class_names({"id2label": {"0": "cat", "1": "dog"}}, 3, "x/config.json") is None
    assert "x/config.json: id2label names 2 of the head's 3 classes" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert hf_format.class_names({"id2label": {"0": "cat", "1": "dog"}}, 2, "x") == ["cat", "dog"]
        assert hf_format.class_names({}, 2, "x") is None  # none given: nothing to say
    assert not caplog.text


def test_a_classifier_s_pooler_is_dropped_as_hf_drops_it(tmp_path, images, caplog):
    """A ViTForImageClassification file that also holds vit.pooler.* (from a ViTModel it was built on): HF
    ignores them, and vitkit put the pooler and tanh before the classifier, logits off by up to 0.9."""
    from safetensors.torch import load_file, save_file

    reference = _randomise_hf(transformers.ViTForImageClassification(_hf_config()))
    reference.save_pretrained(tmp_path / "hf")
    weights = tmp_path / "hf" / "model.safetensors"
    state = load_file(weights)
    generator = torch.Generator().manual_seed(4)
    state["vit.pooler.dense.weight"] = torch.randn(32, 32, generator=generator)
    state["vit.pooler.dense.bias"] = torch.randn(32, generator=generator)
    save_file(state, weights, metadata={"format": "pt"})
    with caplog.at_level("WARNING", logger="vitkit"):
        checkpoint = read(tmp_path / "hf")
    assert checkpoint.config.representation_size is None and "vit.pooler" in caplog.text
    with torch.no_grad():
        diff = (checkpoint.model(images) - reference(pixel_values=images).logits).abs().max().item()
    assert diff <= 1e-5, diff


def test_a_masked_image_modeling_directory_is_read_as_its_encoder(tmp_path, images):
    """ViTForMaskedImageModeling (SimMIM) adds a mask token and a pixel decoder to the encoder; the decoder had
    been refused as unexpected tensors, so its encoder could not be fine-tuned."""
    reference = _randomise_hf(transformers.ViTForMaskedImageModeling(_hf_config(encoder_stride=8)))
    reference.save_pretrained(tmp_path / "hf")
    model = read(tmp_path / "hf").model
    assert model.config.num_classes == 0 and model.config.representation_size is None
    with torch.no_grad():
        expected = reference.vit(pixel_values=images).last_hidden_state[:, 0]
        diff = (model(images) - expected).abs().max().item()
    assert diff <= 1e-5, diff
