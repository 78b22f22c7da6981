"""Print max |logit difference| of every checkpoint format against its reference (tiny random models, fp32).

    .venv/bin/python benchmarks/checkpoint_parity.py

Reuses the reference implementations of tests/checkpoints (numpy official forward, transformers, timm
with torchvision stubbed); prints one line per comparison and a JSON object last, and appends them as one
row to results/checkpoint_parity.jsonl.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "checkpoint_parity.jsonl"
sys.path.insert(0, str(ROOT / "tests" / "checkpoints"))

import test_official as off  # noqa: E402

import conftest  # noqa: E402
from vitkit.bench.records import append_row  # noqa: E402
from vitkit.checkpoints import Checkpoint, read, write  # noqa: E402
from vitkit.checkpoints.onnx_export import check_onnx, export_onnx  # noqa: E402
from vitkit.models import build_model  # noqa: E402


def main() -> None:
    torch.manual_seed(0)
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    out: dict[str, float] = {}
    tmp = Path(tempfile.mkdtemp())
    for pool, rep in (("token", None), ("token", 16), ("gap", None), ("gap", 24)):
        arrays = off.official_arrays(pool, rep)
        np.savez(tmp / "o.npz", **arrays)
        with torch.no_grad():
            ours = read(tmp / "o.npz").model(images).double().numpy()
        out[f"official_{pool}_rep{rep}_vs_numpy"] = float(
            np.abs(ours - off.reference_logits(arrays, images.numpy())).max()
        )
    hybrid = conftest.randomise(build_model(off.HYBRID))
    arrays = off.official.from_vitkit(Checkpoint(model=hybrid))
    np.savez(tmp / "h.npz", **arrays)
    with torch.no_grad():
        ours = read(tmp / "h.npz").model(images).double().numpy()
    out["official_r50_hybrid_vs_reference"] = float(np.abs(ours - off.reference_hybrid_logits(arrays, images)).max())

    import transformers

    hf_config = transformers.ViTConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
        num_labels=5,
    )
    reference = transformers.ViTForImageClassification(hf_config).eval()
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(torch.randn(p.shape) * 0.1)
        reference.save_pretrained(tmp / "hf")
        expected = reference(pixel_values=images).logits
        checkpoint = read(tmp / "hf")
        out["hf_vs_transformers"] = float((checkpoint.model(images) - expected).abs().max())
        for field, value in (("gelu", "tanh"), ("layer_norm_eps", 1e-6)):  # what a loader that drops numerics costs
            wrong = build_model(checkpoint.config.__class__(**{**checkpoint.config.__dict__, field: value})).eval()
            wrong.load_state_dict(checkpoint.model.state_dict())
            out[f"hf_with_wrong_{field}"] = float((wrong(images) - expected).abs().max())

    model = conftest.randomise(build_model(conftest.TINY))
    export_onnx(model, tmp / "m.onnx")
    out["onnx_vs_pytorch_batch3"] = check_onnx(model, tmp / "m.onnx", batch_size=3)
    for target in ("timm", "hf", "official"):
        m = conftest.randomise(
            build_model(
                conftest.TINY.__class__(**{**conftest.TINY.__dict__, "gelu": "exact" if target == "timm" else "tanh"})
            )
        )
        dst = write(Checkpoint(model=m), tmp / f"rt_{target}{'.npz' if target == 'official' else ''}", to=target)
        back = read(dst).model
        out[f"roundtrip_{target}_max_abs_param_diff"] = max(
            float((a - b).abs().max()) for a, b in zip(m.state_dict().values(), back.state_dict().values())
        )
    for key, value in out.items():
        print(f"{key:45s} {value:.3g}")
    print(json.dumps(out))
    append_row(RESULTS, {"max_abs_difference": out})


if __name__ == "__main__":
    main()
