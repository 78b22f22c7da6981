"""The Vision Transformer (Eq. 1-8): shapes, position-embedding behaviour, heads, dropout, attention, init."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from vitkit.models import create_model
from vitkit.models import posemb as pe
from vitkit.models.configs import PRESETS, ViTConfig
from vitkit.models.vit import VisionTransformer, patch_content

TINY = ViTConfig(img_size=32, patch_size=8, hidden_size=32, depth=2, num_heads=2, mlp_dim=64, num_classes=10)
VIT_PRESETS = [name for name, config in PRESETS.items() if isinstance(config, ViTConfig)]


def tiny(**overrides) -> VisionTransformer:
    return VisionTransformer(dataclasses.replace(TINY, **overrides)).eval()


def shuffle_patches(x: torch.Tensor, patch: int, perm: torch.Tensor) -> torch.Tensor:
    """Permute the P x P blocks of (B, C, H, W) images in raster order."""
    b, c, h, w = x.shape
    gh, gw = h // patch, w // patch
    blocks = x.reshape(b, c, gh, patch, gw, patch).permute(0, 1, 2, 4, 3, 5).reshape(b, c, gh * gw, patch, patch)
    blocks = blocks[:, :, perm]  # (B, C, N, P, P), patches reordered
    return blocks.reshape(b, c, gh, gw, patch, patch).permute(0, 1, 2, 4, 3, 5).reshape(b, c, h, w)


# ---------------------------------------------------------------- shapes


@pytest.mark.parametrize("name", VIT_PRESETS)
def test_every_preset_shapes_at_two_resolutions(name):
    config = PRESETS[name]
    # Meta device: shapes only, no memory or arithmetic.  Depth changes no shape, so one block keeps the
    # trace short (the full-depth models are counted in test_configs.py).
    with torch.device("meta"), torch.no_grad():
        model = create_model(name, depth=1).eval()
        for size in (config.img_size, config.patch_size * (384 // config.patch_size)):
            x = torch.empty(2, 3, size, size)
            tokens, grid = model.patch_embed(x)
            num_patches = (size // config.patch_size) ** 2
            assert tokens.shape == (2, num_patches, config.hidden_size)
            assert model.position_embeddings(grid).shape == (1, 1 + num_patches, config.hidden_size)  # resampled
            features = model.forward_features(x)
            assert features.shape == (2, config.hidden_size)
            assert model.forward_head(features).shape == (2, 1000)


def test_tiny_forward_at_several_resolutions():
    model = tiny()
    for height, width in ((32, 32), (48, 48), (32, 56)):
        named = model.forward_intermediates(torch.randn(2, 3, height, width), attention_layers=[1])
        tokens = 1 + (height // 8) * (width // 8)
        assert named["embed"].shape == (2, tokens, 32)
        assert named["attn01"].shape == (2, 2, tokens, tokens)
        assert named["logits"].shape == (2, 10)


def test_other_resolution_uses_the_resampled_embedding():
    """Running at 48 px equals a 48 px model whose E_pos is the 4x4 table resampled to 6x6 (Sec. 3.2)."""
    model = tiny()
    big = tiny(img_size=48)
    state = dict(model.state_dict())
    state["pos_embed"] = pe.resample_pos_embed(model.pos_embed, (6, 6), (4, 4), num_prefix_tokens=1)
    big.load_state_dict(state)
    x = torch.randn(2, 3, 48, 48)
    torch.testing.assert_close(model.forward_features(x), big.forward_features(x))


def test_non_divisible_input_names_a_valid_size():
    with pytest.raises(ValueError, match="32x32"):
        tiny()(torch.randn(1, 3, 30, 30))
    with pytest.raises(ValueError, match="use 32 or 40"):
        dataclasses.replace(TINY, img_size=36)


@pytest.mark.parametrize("in_chans", [1, 13])
def test_grayscale_and_multispectral_inputs(in_chans):
    model = tiny(in_chans=in_chans)
    assert model.patch_embed.proj.weight.shape == (32, in_chans, 8, 8)
    assert model.forward_features(torch.randn(2, in_chans, 32, 32)).shape == (2, 32)
    with pytest.raises(ValueError, match=f"takes images of {in_chans} channels, got 3"):
        model(torch.randn(2, 3, 32, 32))


@pytest.mark.parametrize("in_chans", [1, 3])
def test_patch_weight_is_laid_out_as_its_gradient_from_a_channels_last_batch(in_chans):
    """vitkit's batches are permuted from H x W x C; a one-channel patch convolution is fastest so, and its weight
    gradient comes out channels-last: the weight is laid out so too (DDP copies, with a warning, a gradient whose
    strides differ from its parameter's).  The output is the standard layout's, bit for bit."""
    model = tiny(in_chans=in_chans).train()
    x = torch.randn(2, 32, 32, in_chans).permute(0, 3, 1, 2)
    model.forward_features(x).sum().backward()
    weight = model.patch_embed.proj.weight
    assert weight.grad.stride() == weight.stride()
    standard = weight.detach().clone(memory_format=torch.contiguous_format)
    expected = F.conv2d(x, standard, model.patch_embed.proj.bias, stride=8)
    torch.testing.assert_close(model.patch_embed.proj(x), expected, rtol=0, atol=0)


# ---------------------------------------------------------------- position embeddings (App. D.4)


def _randomise(model: VisionTransformer) -> VisionTransformer:
    """Make every position parameter large, so that a broken invariance shows far above rounding."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "pos" in name:
                param.normal_()
    return model


def test_no_posemb_with_gap_ignores_patch_order():
    model = tiny(posemb="none", pool="gap")
    assert model.position_embeddings((4, 4)) is None
    assert not [n for n, _ in model.named_parameters() if "pos" in n]
    x = torch.randn(2, 3, 32, 32)
    perm = torch.randperm(16)
    shuffled = shuffle_patches(x, 8, perm)
    assert not torch.allclose(x, shuffled)
    torch.testing.assert_close(model.forward_features(shuffled), model.forward_features(x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["learned_1d", "learned_2d", "sincos_2d", "relative"])
def test_every_posemb_breaks_the_invariance(kind):
    model = _randomise(tiny(posemb=kind, pool="gap"))
    x = torch.randn(2, 3, 32, 32)
    shuffled = shuffle_patches(x, 8, torch.randperm(16))
    diff = (model.forward_features(shuffled) - model.forward_features(x)).abs().max()
    assert diff > 1e-3


def test_posemb_parameter_shapes():
    assert tiny().pos_embed.shape == (1, 17, 32)
    assert tiny(pool="gap").pos_embed.shape == (1, 16, 32)  # no [class] token, no row for it
    assert tiny(posemb_where="per_layer").pos_embed.shape == (2, 17, 32)  # one set per layer
    model = tiny(posemb="learned_2d")
    assert model.pos_embed_x.shape == (1, 4, 16) and model.pos_embed_y.shape == (1, 4, 16)
    assert tiny(posemb="relative").blocks[0].attn.rel_pos.shape == (2 * 17 - 1, 16)
    assert tiny(posemb="sincos_2d").position_embeddings((4, 4)).shape == (1, 17, 32)


@pytest.mark.parametrize("where", ["input", "per_layer", "shared_per_layer"])
def test_posemb_where_adds_embeddings_where_it_says(where):
    """Independent loop over the blocks: E_pos once at the input, one set per layer, or the same set at every layer."""
    model = _randomise(tiny(posemb_where=where, dropout=0.0))
    x = torch.randn(2, 3, 32, 32)
    tokens, grid = model.patch_embed(x)
    tokens, pos = torch.cat([model.cls_token.expand(2, -1, -1), tokens], dim=1), model.position_embeddings(grid)
    z = tokens + pos[0] if where == "input" else tokens
    for index, block in enumerate(model.blocks):
        if where != "input":
            z = z + pos[index if where == "per_layer" else 0]
        z = z + block.attn(block.norm1(z))[0]
        z = z + block.mlp(block.norm2(z))
    expected = model.norm(z)[:, 0]
    torch.testing.assert_close(model.forward_features(x), expected)


def test_shared_per_layer_differs_from_input_only():
    shared = _randomise(tiny(posemb_where="shared_per_layer"))
    once = tiny(posemb_where="input")
    once.load_state_dict(shared.state_dict())  # same parameters, E_pos added once instead of before every layer
    x = torch.randn(2, 3, 32, 32)
    assert (shared.forward_features(x) - once.forward_features(x)).abs().max() > 1e-3


# ---------------------------------------------------------------- heads and dropout


def test_zero_head_outputs_exact_zeros():
    out = tiny()(torch.randn(3, 3, 32, 32))
    assert torch.equal(out, torch.zeros(3, 10))


def test_reset_head_zeroes_and_drops_pre_logits():
    model = tiny(representation_size=16)
    assert model.num_features == 16
    torch.nn.init.normal_(model.head.weight)
    model.reset_head(5)
    x = torch.randn(2, 3, 32, 32)
    assert isinstance(model.pre_logits, torch.nn.Identity) and model.num_features == 32
    assert torch.equal(model(x), torch.zeros(2, 5))
    assert model.config.num_classes == 5 and model.config.representation_size is None
    model.reset_head(0)  # no head: forward returns y
    torch.testing.assert_close(model(x), model.forward_intermediates(x, [])["y"])


def test_dropout_is_off_in_eval_and_on_in_train():
    model = tiny(dropout=0.3, attention_dropout=0.3, drop_path=0.2)
    x = torch.randn(4, 3, 32, 32)
    assert torch.equal(model.forward_features(x), model.forward_features(x))
    model.train()
    assert (model.forward_features(x) - model.forward_features(x)).abs().max() > 1e-4


@pytest.mark.parametrize("pool", ["token", "gap"])
def test_patch_dropout_keeps_a_random_subset_of_the_embedded_patches(pool):
    model = _randomise(tiny(pool=pool, patch_dropout=0.5))
    prefix = model.num_prefix_tokens
    x = torch.randn(3, 3, 32, 32)
    full = model.forward_intermediates(x)["embed"]  # eval: all 16 patches
    model.train()
    subsets = []
    for _ in range(2):
        kept = model.forward_intermediates(x)["embed"]
        assert kept.shape == (3, prefix + 8, 32)
        assert torch.equal(kept[:, :prefix], full[:, :prefix])  # the [class] token always stays
        match = (kept[:, prefix:, None] == full[:, None, prefix:]).all(-1)  # (B, 8 kept, 16 patches)
        assert match.sum(-1).eq(1).all() and match.any(1).sum(-1).eq(8).all()  # 8 distinct patches, E_pos added
        subsets.append(match.any(1))
    assert not torch.equal(subsets[0], subsets[1])  # a fresh draw per forward pass
    plain = tiny(pool=pool)
    plain.load_state_dict(model.state_dict())
    assert torch.equal(model.eval()(x), plain(x))  # evaluation sees every patch
    with pytest.raises(ValueError, match="patch_dropout"):
        tiny(posemb="relative", patch_dropout=0.5)


def test_patch_dropout_rate_is_a_forward_argument():
    """None: the config's rate in training, every patch in eval mode; an explicit rate overrides both."""
    model = tiny(pool="gap", patch_dropout=0.5).train()
    x = torch.randn(2, 3, 32, 32)
    tokens = []
    model.blocks[0].register_forward_pre_hook(lambda module, inputs: tokens.append(inputs[0].shape[1]))
    model(x)  # config: 8 of 16 patches
    model(x, patch_dropout=0.0)  # e.g. the schedule's late phase: all 16
    model(x, patch_dropout=0.75)  # 4
    model.eval()
    model(x)  # evaluation: all 16
    model(x, patch_dropout=0.25)  # explicit, also in eval mode: 12
    assert tokens == [8, 16, 4, 16, 12]
    assert not hasattr(model, "patch_dropout")  # no state for a training loop to rewrite


def test_patch_content_marks_the_blocks_whose_pixels_vary():
    x = torch.full((2, 3, 16, 16), -1.0)  # blank background: every block flat
    x[0, 1, 2, 9] = 1.0  # image 0: one pixel, one channel, in block (0, 1) of the 2 x 2 grid
    x[1, :, 8:, 8:] = 0.3  # image 1: block (1, 1) uniform but not background: still flat
    x[1, 0, 0, 0] = -1.0 + 0.01  # below 2% of the batch's range (2.0): flat
    assert patch_content(x, 8).tolist() == [[0, 1, 0, 0], [0, 0, 0, 0]]


@pytest.mark.parametrize("pool", ["token", "gap"])
def test_content_first_patch_dropout_keeps_varying_patches_before_flat_ones(pool):
    model = _randomise(tiny(pool=pool, patch_dropout=0.75, patch_dropout_keep="content"))  # keeps 4 of 16
    prefix = model.num_prefix_tokens
    x = torch.zeros(6, 3, 32, 32)
    content = torch.zeros(6, 16, dtype=torch.bool)
    for image, blocks in enumerate([[0, 5, 10, 15], [3], [1, 2, 4, 8, 9, 12], [], [7, 11], list(range(16))]):
        for block in blocks:
            row, col = divmod(block, 4)
            x[image, :, row * 8 + 3, col * 8 + 5] = 1.0  # one bright pixel: the block has content
            content[image, block] = True
    full = model.forward_intermediates(x)["embed"][:, prefix:]
    model.train()
    kept = model.forward_intermediates(x)["embed"][:, prefix:]
    match = (kept[:, :, None] == full[:, None]).all(-1)  # (B, 4 kept, 16 patches)
    assert match.sum(-1).eq(1).all()
    chosen = match.any(1)  # (B, 16): which patches were kept
    assert chosen.sum(-1).eq(4).all()
    kept_content = (chosen & content).sum(-1)
    assert kept_content.tolist() == [min(4, n) for n in content.sum(-1).tolist()]  # content first, as much as fits
    assert TINY.patch_dropout_keep == "random"  # the default draws uniformly, content or not
    with pytest.raises(ValueError, match="patch_dropout_keep"):
        tiny(patch_dropout_keep="largest")


# ---------------------------------------------------------------- attention (App. A, Eq. 5-8)


def test_explicit_attention_equals_manual_softmax():
    model = tiny()
    block = model.blocks[0]
    z = torch.randn(2, 17, 32)
    h = block.norm1(z)
    out, weights = block.attn(h, need_weights=True)
    q, k, v = F.linear(h, block.attn.qkv.weight, block.attn.qkv.bias).split(32, dim=-1)  # [U_q U_k U_v], Eq. 5

    def heads(t):  # (B, T, D) -> (B, k, T, D_h)
        return t.reshape(2, 17, 2, 16).transpose(1, 2)

    manual = torch.softmax(heads(q) @ heads(k).transpose(-2, -1) / math.sqrt(16), dim=-1)  # Eq. 6
    torch.testing.assert_close(weights, manual)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 17))
    concat = (manual @ heads(v)).transpose(1, 2).reshape(2, 17, 32)  # Eq. 7-8
    torch.testing.assert_close(out, block.attn.proj(concat), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", ["learned_1d", "relative"])
def test_sdpa_block_equals_explicit_block(kind):
    model = _randomise(tiny(posemb=kind))
    z = torch.randn(3, 17, 32)
    for block in model.blocks:
        fast, none = block(z, need_weights=False)
        slow, weights = block(z, need_weights=True)
        assert none is None and weights is not None
        assert (fast - slow).abs().max() <= 1e-5
        z = fast


def test_eval_output_does_not_depend_on_the_batch():
    model = _randomise(tiny())
    x = torch.randn(5, 3, 32, 32)
    together = model.forward_features(x)
    for index in range(5):
        torch.testing.assert_close(
            model.forward_features(x[index : index + 1])[0], together[index], atol=1e-6, rtol=1e-5
        )


def test_intermediates_are_consistent_with_forward():
    model = tiny(representation_size=8)
    torch.nn.init.normal_(model.head.weight)
    x = torch.randn(2, 3, 32, 32)
    named = model.forward_intermediates(x)
    assert {"embed", "block00", "block01", "attn00", "attn01", "encoder_norm", "y", "pre_logits", "logits"} <= set(
        named
    )
    torch.testing.assert_close(named["logits"], model(x))
    torch.testing.assert_close(named["y"], named["encoder_norm"][:, 0])
    torch.testing.assert_close(named["pre_logits"], torch.tanh(model.pre_logits.fc(named["y"])))


# ---------------------------------------------------------------- initialisation (models_vit.py)


def test_init_statistics_follow_the_official_code():
    model = create_model("vit_ti16")  # D = 192, 12 blocks: enough samples for tight statistics
    d = 192
    assert torch.equal(model.head.weight, torch.zeros_like(model.head.weight))  # head: zeros
    assert torch.equal(model.cls_token, torch.zeros(1, 1, d))  # cls: zeros
    assert abs(model.pos_embed.std().item() - 0.02) < 0.001  # AddPositionEmbs: normal(0.02)
    mlp_bias = torch.cat([torch.cat([b.mlp.fc1.bias, b.mlp.fc2.bias]) for b in model.blocks])
    assert 0.9e-6 < mlp_bias.std().item() < 1.1e-6  # MlpBlock: normal(1e-6)
    for block in model.blocks:
        assert torch.equal(block.attn.qkv.bias, torch.zeros(3 * d))
        for chunk in block.attn.qkv.weight.chunk(3):  # Xavier-uniform per D x D kernel (q, k and v separately)
            bound = math.sqrt(6 / (2 * d))
            assert chunk.abs().max() <= bound and abs(chunk.std().item() - bound / math.sqrt(3)) < 0.03 * bound
        bound = math.sqrt(6 / (d + 4 * d))  # fc1: fan_in D, fan_out 4D
        assert block.mlp.fc1.weight.abs().max() <= bound
    patch = model.patch_embed.proj.weight  # LeCun normal: std 1/sqrt(fan_in), truncated at 2 std
    fan_in = 3 * 16 * 16
    assert abs(patch.std().item() * math.sqrt(fan_in) - 1) < 0.02
    assert patch.abs().max() <= 2 / math.sqrt(fan_in) / 0.87962566103423978
    assert torch.equal(model.norm.weight, torch.ones(d)) and torch.equal(model.norm.bias, torch.zeros(d))


def test_reset_head_keeps_the_model_device_and_dtype():
    model = tiny(representation_size=8).double()
    model.reset_head(3)
    assert model.head.weight.dtype == torch.float64
    assert model(torch.randn(1, 3, 32, 32, dtype=torch.float64)).dtype == torch.float64
    with torch.device("meta"):
        big = create_model("vit_b16")
    big.reset_head(10)  # e.g. head surgery before loading weights into a meta-initialised model
    assert big.head.weight.is_meta


def test_an_image_without_its_batch_dimension_or_with_other_channels_is_named():
    """model(image) on one (C, H, W) image failed inside torch.cat with 'Sizes of tensors must match', and an
    image of other channels inside the convolution; every model family now names the input it expects."""
    from vitkit.models import build_model
    from vitkit.models.configs import HybridConfig, ResNetConfig

    models = [
        tiny(),
        build_model(HybridConfig(vit=dataclasses.replace(TINY, patch_size=1), resnet_layers=(1, 1))),
        build_model(ResNetConfig(layers=(1, 1), img_size=32, num_classes=10)),
    ]
    for model in models:
        model.eval()
        with pytest.raises(ValueError, match=r"a batch of images \(N, 3, H, W\), got shape \(3, 32, 32\).*unsqueeze"):
            model(torch.randn(3, 32, 32))
        with pytest.raises(ValueError, match=r"3 channels.*got 1"):
            model(torch.randn(2, 1, 32, 32))
        assert model(torch.randn(2, 3, 32, 32)).shape[0] == 2
