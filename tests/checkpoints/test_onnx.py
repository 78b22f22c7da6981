"""ONNX export: dynamic batch, onnxruntime logits equal PyTorch's within 1e-4."""

from __future__ import annotations

import pytest
import torch

from vitkit.checkpoints.onnx_export import check_onnx, export_onnx

pytest.importorskip("onnx")
onnxruntime = pytest.importorskip("onnxruntime")


def test_onnx_logits_match_pytorch_with_another_batch_size(tmp_path, make_vit):
    model = make_vit(representation_size=16)
    path = export_onnx(model, tmp_path / "m.onnx", opset=17, batch_size=2)
    import onnx

    graph = onnx.load(str(path))
    assert graph.opset_import[0].version >= 17
    assert graph.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"  # dynamic batch axis
    for batch in (1, 5):
        diff = check_onnx(model, path, batch_size=batch)
        assert diff <= 1e-4, diff
    with torch.no_grad():
        assert model(torch.randn(1, 3, 32, 32)).abs().max() > 0.1


def test_old_opset_is_refused(tmp_path, make_vit):
    with pytest.raises(ValueError, match="opset 13 is too old"):
        export_onnx(make_vit(), tmp_path / "m.onnx", opset=13)
    assert not (tmp_path / "m.onnx").exists()
