"""Official .npz layout: arrays synthesised with the official key names and shapes, checked against an
independent numpy forward pass written from the official Flax formulas (vit_jax/models_vit.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vitkit.checkpoints import Checkpoint, official, read, write
from vitkit.models import build_model
from vitkit.models.configs import HybridConfig, ViTConfig

D, L, K, MLP, P, GRID, CLASSES = 32, 2, 2, 64, 8, 4, 5


def official_arrays(pool: str = "token", rep: int | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Random arrays with the released vit_jax names and shapes (Flax layouts: kernels (in, out), HWIO)."""
    rng = np.random.default_rng(seed)

    def r(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    tokens = GRID * GRID + (pool == "token")
    a = {
        "embedding/kernel": r(P, P, 3, D),
        "embedding/bias": r(D),
        "Transformer/posembed_input/pos_embedding": r(1, tokens, D),
    }
    if pool == "token":
        a["cls"] = r(1, 1, D)
    for i in range(L):
        b = f"Transformer/encoderblock_{i}/"
        for ln in ("LayerNorm_0", "LayerNorm_2"):
            a[b + ln + "/scale"], a[b + ln + "/bias"] = 1 + r(D), r(D)
        for name in ("query", "key", "value"):
            a[b + f"MultiHeadDotProductAttention_1/{name}/kernel"] = r(D, K, D // K)
            a[b + f"MultiHeadDotProductAttention_1/{name}/bias"] = r(K, D // K)
        a[b + "MultiHeadDotProductAttention_1/out/kernel"] = r(K, D // K, D)
        a[b + "MultiHeadDotProductAttention_1/out/bias"] = r(D)
        a[b + "MlpBlock_3/Dense_0/kernel"], a[b + "MlpBlock_3/Dense_0/bias"] = r(D, MLP), r(MLP)
        a[b + "MlpBlock_3/Dense_1/kernel"], a[b + "MlpBlock_3/Dense_1/bias"] = r(MLP, D), r(D)
    a["Transformer/encoder_norm/scale"], a["Transformer/encoder_norm/bias"] = 1 + r(D), r(D)
    width = D
    if rep:
        a["pre_logits/kernel"], a["pre_logits/bias"] = r(D, rep), r(rep)
        width = rep
    a["head/kernel"], a["head/bias"] = r(width, CLASSES), r(CLASSES)
    return a


def _ln(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-6) * scale + bias  # Flax eps 1e-6


def _gelu(x: np.ndarray) -> np.ndarray:  # flax.linen.gelu: tanh approximation
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def reference_logits(a: dict[str, np.ndarray], images: np.ndarray) -> np.ndarray:
    """models_vit.VisionTransformer.__call__ (after any ResNet root) in float64 numpy, NHWC as Flax."""
    a = {k: v.astype(np.float64) for k, v in a.items()}
    x = images.astype(np.float64).transpose(0, 2, 3, 1)  # NCHW -> NHWC
    n, h, w, c = x.shape
    p = a["embedding/kernel"].shape[0]  # P (1 for a hybrid, on the ResNet feature map)
    patches = x.reshape(n, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)  # (n, gh, gw, P, P, c)
    x = np.einsum("nijpqc,pqcd->nijd", patches, a["embedding/kernel"]) + a["embedding/bias"]
    x = x.reshape(n, -1, D)
    if "cls" in a:
        x = np.concatenate([np.repeat(a["cls"], n, axis=0), x], axis=1)
    x = x + a["Transformer/posembed_input/pos_embedding"]
    for i in range(L):
        b = f"Transformer/encoderblock_{i}/"
        m = b + "MultiHeadDotProductAttention_1/"
        y = _ln(x, a[b + "LayerNorm_0/scale"], a[b + "LayerNorm_0/bias"])
        q, k, v = (
            np.einsum("ntd,dhe->nthe", y, a[m + f"{s}/kernel"]) + a[m + f"{s}/bias"] for s in ("query", "key", "value")
        )
        logits = np.einsum("nqhe,nkhe->nhqk", q, k) / np.sqrt(D // K)
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        out = np.einsum("nhqk,nkhe->nqhe", weights, v)
        x = x + np.einsum("nqhe,hed->nqd", out, a[m + "out/kernel"]) + a[m + "out/bias"]
        y = _ln(x, a[b + "LayerNorm_2/scale"], a[b + "LayerNorm_2/bias"])
        y = _gelu(y @ a[b + "MlpBlock_3/Dense_0/kernel"] + a[b + "MlpBlock_3/Dense_0/bias"])
        x = x + y @ a[b + "MlpBlock_3/Dense_1/kernel"] + a[b + "MlpBlock_3/Dense_1/bias"]
    x = _ln(x, a["Transformer/encoder_norm/scale"], a["Transformer/encoder_norm/bias"])
    x = x[:, 0] if "cls" in a else x.mean(axis=1)
    if "pre_logits/kernel" in a:
        x = np.tanh(x @ a["pre_logits/kernel"] + a["pre_logits/bias"])
    return x @ a["head/kernel"] + a["head/bias"]


def _save(tmp_path, arrays, name="ckpt.npz"):
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("pool, rep", [("token", None), ("token", 16), ("gap", None), ("gap", 24)])
def test_logits_match_numpy_reference(tmp_path, images, pool, rep):
    arrays = official_arrays(pool, rep)
    model = read(_save(tmp_path, arrays)).model
    with torch.no_grad():
        ours = model(images).double().numpy()
    diff = np.abs(ours - reference_logits(arrays, images.numpy())).max()
    assert diff <= 1e-5, diff
    assert np.abs(ours).max() > 0.1  # not a trivially zero output


def test_config_inferred_from_shapes(tmp_path):
    config = read(_save(tmp_path, official_arrays("gap", 24))).config
    assert config == ViTConfig(
        img_size=GRID * P, patch_size=P, hidden_size=D, depth=L, num_heads=K, mlp_dim=MLP,
        num_classes=CLASSES, pool="gap", representation_size=24,
    )  # fmt: skip
    assert (config.gelu, config.layer_norm_eps) == ("tanh", 1e-6)  # the official numerics


def test_round_trip_vitkit_official_vitkit_is_exact(tmp_path, make_vit):
    model = make_vit(representation_size=16)
    path = write(Checkpoint(model=model), tmp_path / "out.npz", to="official")
    back = read(path).model
    assert back.config == model.config
    for (name, a), b in zip(model.state_dict().items(), back.state_dict().values()):
        assert torch.equal(a, b), name


def _big_vision(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same model in big_vision's layout: params/ prefix, per-type names, scan-stacked blocks,
    top-level pos_embedding without a [class] row."""
    names = {
        "MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0",
        "LayerNorm_2": "LayerNorm_1",
        "MlpBlock_3": "MlpBlock_0",
    }
    out, stacked = {}, {}
    for key, value in arrays.items():
        if key.startswith("Transformer/encoderblock_"):
            _, block, rest = key.split("/", 2)
            module, leaf = rest.split("/", 1)
            stacked.setdefault(f"{names.get(module, module)}/{leaf}", []).append((int(block.split("_")[1]), value))
        elif key == "Transformer/posembed_input/pos_embedding":
            out["pos_embedding"] = value[:, 1:]
        else:
            out[key] = value
    for leaf, items in stacked.items():
        out[f"Transformer/encoderblock/{leaf}"] = np.stack([v for _, v in sorted(items, key=lambda t: t[0])])
    return {f"params/{k}": v for k, v in out.items()}


def test_big_vision_layout_scan_stacked(tmp_path, images):
    arrays = official_arrays("token", None)
    arrays["Transformer/posembed_input/pos_embedding"][:, 0] = 0.0  # big_vision: [class] gets no E_pos
    released = read(_save(tmp_path, arrays, "a.npz")).model
    big_vision = read(_save(tmp_path, _big_vision(arrays), "b.npz")).model
    with torch.no_grad():
        assert torch.equal(released(images), big_vision(images))
    old = {f"opt/target/{k}": v for k, v in arrays.items()}  # vit_jax checkpoints saved with the optimizer
    with torch.no_grad():
        assert torch.equal(read(_save(tmp_path, old, "c.npz")).model(images), released(images))


def test_map_head_refused(tmp_path):
    arrays = _big_vision(official_arrays("gap", None))
    arrays["params/MAPHead_0/probe"] = np.zeros((1, 1, D), np.float32)
    with pytest.raises(ValueError, match="MAP head"):
        read(_save(tmp_path, arrays))


def test_wrong_shapes_name_the_tensor(tmp_path):
    arrays = official_arrays()
    arrays["Transformer/encoderblock_1/MlpBlock_3/Dense_1/kernel"] = np.zeros((MLP, D + 1), np.float32)
    with pytest.raises(ValueError, match=r"blocks\.1\.mlp\.fc2\.weight"):
        read(_save(tmp_path, arrays))
    del arrays["Transformer/encoderblock_1/MlpBlock_3/Dense_1/kernel"]
    with pytest.raises(ValueError, match="missing tensors.*encoderblock_1/MlpBlock_3/Dense_1/kernel"):
        read(_save(tmp_path, arrays, "b.npz"))


def test_corrupt_npz_is_a_clear_error(tmp_path):
    path = _save(tmp_path, official_arrays())
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ValueError, match="damaged or not an .npz"):
        read(path)


HYBRID = HybridConfig(
    vit=ViTConfig(img_size=32, patch_size=1, hidden_size=D, depth=L, num_heads=K, mlp_dim=MLP, num_classes=CLASSES),
    resnet_layers=(1, 2),
)


def _same_pad(size: int, kernel: int, stride: int) -> tuple[int, int]:
    total = max((-(-size // stride) - 1) * stride + kernel - size, 0)  # TF "SAME"
    return total // 2, total - total // 2


def _std_conv(x: torch.Tensor, kernel: np.ndarray, stride: int) -> torch.Tensor:
    # models_resnet.StdConv: (w - mean) / (std + 1e-5) over H, W, I; TF SAME padding
    w = (kernel - kernel.mean(axis=(0, 1, 2))) / (kernel.std(axis=(0, 1, 2)) + 1e-5)
    top, bottom = _same_pad(x.shape[2], w.shape[0], stride)
    x = torch.nn.functional.pad(x, (top, bottom, top, bottom))
    return torch.nn.functional.conv2d(x, torch.from_numpy(w).permute(3, 2, 0, 1), stride=stride)


def _gn(x: torch.Tensor, a: dict, name: str) -> torch.Tensor:  # flax GroupNorm: 32 groups, eps 1e-6
    scale, bias = (torch.from_numpy(a[f"{name}/{p}"].reshape(-1)) for p in ("scale", "bias"))
    return torch.nn.functional.group_norm(x, 32, scale, bias, eps=1e-6)


def reference_hybrid_logits(a: dict[str, np.ndarray], images: torch.Tensor) -> np.ndarray:
    """models_vit.py root + models_resnet.ResidualUnit stages, then the encoder of `reference_logits`."""
    a = {k: v.astype(np.float64) for k, v in a.items()}
    relu = torch.relu
    x = relu(_gn(_std_conv(images.double(), a["conv_root/kernel"], 2), a, "gn_root"))
    top, bottom = _same_pad(x.shape[2], 3, 2)
    x = torch.nn.functional.max_pool2d(torch.nn.functional.pad(x, (top, bottom, top, bottom), value=-np.inf), 3, 2)
    for s, units in enumerate(HYBRID.resnet_layers, start=1):
        for u in range(1, units + 1):
            p = f"block{s}/unit{u}/"
            stride = 2 if (s > 1 and u == 1) else 1
            residual = (
                _gn(_std_conv(x, a[p + "conv_proj/kernel"], stride), a, p + "gn_proj")
                if p + "conv_proj/kernel" in a
                else x
            )
            y = relu(_gn(_std_conv(x, a[p + "conv1/kernel"], 1), a, p + "gn1"))
            y = relu(_gn(_std_conv(y, a[p + "conv2/kernel"], stride), a, p + "gn2"))
            x = relu(residual + _gn(_std_conv(y, a[p + "conv3/kernel"], 1), a, p + "gn3"))
    return reference_logits(a, x.numpy())


def test_hybrid_matches_reference_with_old_groupnorm_shapes(tmp_path, randomise, images):
    model = randomise(build_model(HYBRID))
    arrays = official.from_vitkit(Checkpoint(model=model))
    assert arrays["conv_root/kernel"].shape == (7, 7, 3, 64) and arrays["embedding/kernel"].shape == (1, 1, 512, D)
    assert "block1/unit1/conv_proj/kernel" in arrays and "block2/unit2/conv_proj/kernel" not in arrays
    old = {
        k: v.reshape(1, 1, 1, -1) if "/gn" in k or k.startswith("gn_") else v for k, v in arrays.items()
    }  # pre-0.3.6 linen
    back = read(_save(tmp_path, old)).model
    assert back.config == HYBRID  # inferred: stages (1, 2), width 1, 32 px
    with torch.no_grad():
        ours = back(images)
        assert torch.equal(ours, model(images))
    diff = np.abs(ours.double().numpy() - reference_hybrid_logits(arrays, images)).max()
    assert diff <= 1e-5, diff


def test_root_only_hybrid_round_trips(tmp_path, randomise):
    """The official R+ViT-Ti/16 has the ResNet root alone (stride 4, no stages): its stride is inferred as 4."""
    vit = ViTConfig(img_size=32, patch_size=2, hidden_size=D, depth=1, num_heads=K, mlp_dim=MLP, num_classes=CLASSES)
    config = HybridConfig(vit=vit, resnet_layers=())
    path = write(Checkpoint(model=randomise(build_model(config))), tmp_path / "ti.npz", to="official")
    assert read(path).config == config


def test_a_model_without_qkv_biases_is_written_with_zero_biases(tmp_path, make_vit, images):
    """Flax attention always has biases: the file was written without them and could not be read back."""
    model = make_vit(qkv_bias=False).eval()
    back = read(write(Checkpoint(model=model), tmp_path / "m.npz", to="official"))
    assert back.config.qkv_bias  # the official layout's, with zero biases: the same function
    with torch.no_grad():
        assert torch.equal(back.model(images), model(images))


def test_what_the_official_layout_cannot_hold_is_warned(tmp_path, make_vit, caplog):
    """Class names and normalisation went missing without a word; the .npz has no place for them."""
    checkpoint = Checkpoint(model=make_vit(), class_names=list("abcde"), mean=(0.485, 0.456, 0.406), std=(0.2,) * 3)
    with caplog.at_level("WARNING", logger="vitkit"):
        write(checkpoint, tmp_path / "m.npz", to="official")
    assert "class names" in caplog.text and "normalisation" in caplog.text and "(0.485, 0.456, 0.406)" in caplog.text
