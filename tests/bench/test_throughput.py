"""bench/throughput.py and `vitkit bench`: the reported figures are consistent with each other.

No test here asserts a timing; they check that images/s, FLOP/s, MFU and memory are derived from
the measured step times exactly as documented.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import statistics

import pytest
import torch

import vitkit.device
import vitkit.host
from vitkit.bench import throughput as tp
from vitkit.cli import main
from vitkit.models import preset_config
from vitkit.models.flops import model_flops

TINY = {"hidden_size": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64, "patch_size": 8}


def _tiny_bench(**changes) -> tp.BenchConfig:
    fields = dict(
        model="vit_ti16",
        img_size=32,
        num_classes=10,
        batch_size=4,
        precision="fp32",
        overrides=TINY,
        warmup=1,
        steps=2,
        repeats=3,
        peak_tflops=0.5,
        device="cpu",
    )
    fields.update(changes)
    return tp.BenchConfig(**fields)


def _check_mode(result: dict, mode: str, flops_per_image: int, batch: int, peak: float) -> None:
    r = result[mode]
    assert set(r) >= {
        "images_per_s",
        "seconds_per_step",
        "seconds_per_step_repeats",
        "flops_per_image",
        "achieved_flops",
        "mfu",
        "peak_memory_bytes",
        "memory_kind",
        "warmup_s",
    }
    assert r["seconds_per_step"] == statistics.median(r["seconds_per_step_repeats"])
    assert math.isclose(r["images_per_s"], batch / r["seconds_per_step"], rel_tol=1e-12)
    assert r["flops_per_image"] == flops_per_image
    assert math.isclose(r["achieved_flops"], r["images_per_s"] * r["flops_per_image"], rel_tol=1e-12)
    assert math.isclose(r["mfu"], r["achieved_flops"] / peak, rel_tol=1e-12)


def test_benchmark_fields_are_consistent() -> None:
    config = _tiny_bench()
    result = tp.run_benchmark(config)
    forward = model_flops(preset_config("vit_ti16", num_classes=10, img_size=32, **TINY))
    assert result["forward_flops_per_image"] == forward
    assert result["peak_flops"] == 0.5e12 and result["peak_source"] == "given"
    assert result["params"] == sum(p.numel() for p in tp.bench_model(config)[0].parameters())
    assert result["precision"] == "fp32" and result["attn_impl"] == "auto" and result["batch_size"] == 4
    _check_mode(result, "inference", forward, 4, 0.5e12)
    _check_mode(result, "training", tp.TRAIN_FLOPS_FACTOR * forward, 4, 0.5e12)
    assert len(result["training"]["seconds_per_step_repeats"]) == 3


def test_summarize_golden() -> None:
    out = tp.summarize([0.2, 0.1, 0.4], batch_size=8, flops_per_image=1e9, peak_flops=1e11)
    assert out["seconds_per_step"] == 0.2
    assert math.isclose(out["images_per_s"], 40.0)
    assert math.isclose(out["achieved_flops"], 4e10)
    assert math.isclose(out["mfu"], 0.4)
    assert tp.summarize([0.5], 2, 1e9, None)["mfu"] is None


def test_cli_bench_json_last_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "bench",
        "--model",
        "vit_ti16",
        "--img-size",
        "32",
        "--num-classes",
        "10",
        "--batch-size",
        "2",
        "--precision",
        "bf16",
        "--attn-impl",
        "explicit",
        "--warmup",
        "0",
        "--steps",
        "1",
        "--repeats",
        "1",
        "--peak-tflops",
        "2",
        "--device",
        "cpu",
        "--mode",
        "training",
        "--json",
    ]
    for pair in ("hidden_size=32", "depth=2", "num_heads=2", "mlp_dim=64", "patch_size=8"):
        argv += ["--set", pair]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "inference" not in result and result["attn_impl"] == "explicit" and result["precision"] == "bf16"
    forward = model_flops(preset_config("vit_ti16", num_classes=10, img_size=32, **TINY))
    _check_mode(result, "training", 3 * forward, 2, 2e12)


def test_cli_bench_table_and_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "bench",
        "--img-size",
        "32",
        "--num-classes",
        "10",
        "--batch-size",
        "2",
        "--precision",
        "fp32",
        "--warmup",
        "0",
        "--steps",
        "1",
        "--repeats",
        "1",
        "--peak-tflops",
        "1",
        "--device",
        "cpu",
        "--mode",
        "inference",
        "--set",
        "depth=1",
        "--set",
        "patch_size=8",
    ]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "inference" in table and "MFU" in table and "training" not in table.splitlines()[-1]
    assert "\\n" not in table and len(table.splitlines()) == 4  # heading, sizes, columns, the mode: real lines
    assert main(argv + ["--set", "no_such_field=3"]) == 2  # unknown field: one clear line, status 2
    assert "no_such_field" in capsys.readouterr().err
    assert main(argv[:-4] + ["--set", "depth"]) == 2
    assert main(["bench", "--batch-size", "0", "--device", "cpu"]) == 2
    with pytest.raises(SystemExit):
        main(["bench", "--precision", "fp16"])


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="precision"):
        tp.BenchConfig(precision="fp16")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="modes"):
        tp.BenchConfig(modes=("eval",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="peak_tflops"):
        tp.BenchConfig(peak_tflops=0.0)
    with pytest.raises(ValueError, match="CUDA"):
        if not torch.cuda.is_available():
            tp.pick_device("cuda")
        else:  # pragma: no cover - only where a GPU exists
            raise ValueError("CUDA present; nothing to check")


def test_precision_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    assert tp.resolve_precision("fp32", cpu) == "fp32" and tp.resolve_precision("bf16", cpu) == "bf16"
    monkeypatch.setattr(vitkit.device, "native_bf16", lambda device: False)
    assert tp.resolve_precision("auto", cpu) == "fp32"
    monkeypatch.setattr(vitkit.device, "native_bf16", lambda device: True)
    assert tp.resolve_precision("auto", cpu) == "bf16"


def test_measured_peak_is_a_matmul_rate() -> None:
    peak = tp.measure_peak_flops(torch.device("cpu"), "fp32", size=64, repeats=2)
    assert math.isfinite(peak) and peak > 0
    config = _tiny_bench(peak_tflops=None, peak_matmul_size=128, modes=("inference",), repeats=1, steps=1)
    result = tp.run_benchmark(config)
    assert result["peak_source"] == "measured (fp32 matmul)"
    assert math.isclose(result["inference"]["mfu"], result["inference"]["achieved_flops"] / result["peak_flops"])


def test_peak_memory_sees_a_large_cpu_allocation() -> None:
    if tp._proc_status_bytes("VmHWM") is None:
        pytest.skip("no /proc/self/status here")
    with tp.PeakMemory(torch.device("cpu")) as memory:
        # Fresh pages from the kernel: a tensor could reuse heap memory that earlier tests left resident.
        block = mmap.mmap(-1, 64 * 2**20)
        block.write(b"\x01" * (64 * 2**20))  # 64 MiB, every page touched
        block.close()
    assert memory.kind == "cpu peak RSS increase"
    assert memory.bytes is not None and memory.bytes >= 48 * 2**20


def test_training_step_updates_weights_and_returns_loss() -> None:
    config = _tiny_bench()
    model, _ = tp.bench_model(config)
    torch.nn.init.normal_(model.head.weight)
    before = model.blocks[0].attn.qkv.weight.detach().clone()
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    optimizer = tp.make_optimizer(model, torch.device("cpu"), lr=1e-2)
    loss = tp.training_step(model, optimizer, images, labels, torch.device("cpu"), "fp32")()
    expected = torch.nn.functional.cross_entropy(model(images), labels)  # after the step: smaller
    assert loss.ndim == 0 and not loss.requires_grad
    assert not torch.equal(before, model.blocks[0].attn.qkv.weight)
    assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none=True)
    assert expected.item() < loss.item()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_benchmark_fields_are_consistent() -> None:  # pragma: no cover - only where a GPU exists
    result = tp.run_benchmark(_tiny_bench(device="cuda", precision="bf16", peak_tflops=None, peak_matmul_size=1024))
    forward = result["forward_flops_per_image"]
    assert result["device"].startswith("cuda") and result["attn_impl"] == "auto"
    _check_mode(result, "inference", forward, 4, result["peak_flops"])
    _check_mode(result, "training", 3 * forward, 4, result["peak_flops"])
    assert result["training"]["memory_kind"] == "cuda max_memory_allocated"
    assert result["training"]["peak_memory_bytes"] > 0


def test_bench_compiles_under_this_host_class_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kernels cached by another host class abort this one in malloc: bench had compiled under the shared cache."""
    from vitkit.host import default_cache_dir  # torch's own, or the directory of releases before it

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    seen = []
    monkeypatch.setattr(
        tp.torch, "compile", lambda model, **kw: seen.append(os.environ.get("TORCHINDUCTOR_CACHE_DIR")) or model
    )
    config = tp.BenchConfig(img_size=32, num_classes=10, batch_size=2, warmup=0, steps=1, repeats=1, peak_tflops=1.0,
                            device="cpu", modes=("inference",), compile=True, overrides=TINY)  # fmt: skip
    tp.run_benchmark(config)
    host = vitkit.host.current()
    assert seen and seen[0].startswith(default_cache_dir()) and f"vitkit-{host.isa}-" in seen[0]


def test_the_peak_of_bf16_without_native_bf16_is_the_fp32_plateau(monkeypatch) -> None:
    """Emulated bf16 converts to fp32 and multiplies on the fp32 units: its own square matmul (a few GFLOP/s, below
    the model's rectangular bf16 matmuls) gave MFU of 280-550%; the ceiling is fp32's plateau."""
    seen = []
    monkeypatch.setattr(tp.torch, "mm", lambda a, b: seen.append((a.shape[0], a.dtype)) or a)
    monkeypatch.setattr(tp, "native_bf16", lambda device: False)
    tp.measure_peak_flops(torch.device("cpu"), "bf16", repeats=1)
    tp.measure_peak_flops(torch.device("cpu"), "fp32", repeats=1)
    monkeypatch.setattr(tp, "native_bf16", lambda device: True)
    tp.measure_peak_flops(torch.device("cpu"), "bf16", repeats=1)
    assert seen == [(2048, torch.float32)] * 6 + [(2048, torch.bfloat16)] * 3  # warm-up and two timed steps each


def test_bench_mfu_of_emulated_bf16_is_against_the_fp32_peak(monkeypatch) -> None:
    """The result says which matmul the peak is, and MFU is achieved over that peak."""
    monkeypatch.setattr(tp, "native_bf16", lambda device: False)
    peaks = []
    monkeypatch.setattr(tp, "measure_peak_flops", lambda device, precision, size: peaks.append(precision) or 1e12)
    config = tp.BenchConfig(img_size=32, num_classes=10, batch_size=2, warmup=0, steps=1, repeats=1, precision="bf16",
                            device="cpu", modes=("inference",), overrides=TINY)  # fmt: skip
    result = tp.run_benchmark(config)
    assert peaks == ["bf16"] and result["peak_source"] == "measured (fp32 matmul; bf16 is not native here)"
    row = result["inference"]
    assert row["mfu"] == pytest.approx(row["achieved_flops"] / 1e12)


def test_a_peak_below_what_the_model_reached_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    """--peak-tflops below the rate the run reached printed an MFU above 100% without a word."""
    argv = ["bench", "--img-size", "32", "--num-classes", "10", "--batch-size", "2", "--precision", "fp32"]
    argv += ["--warmup", "0", "--steps", "1", "--repeats", "1", "--device", "cpu", "--mode", "inference"]
    argv += ["--set", "depth=1", "--set", "patch_size=8", "--peak-tflops", "1e-9"]  # 1 kFLOP/s
    assert main(argv) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[3].split()[-2] == ">999%" and len(table) == 5
    assert "above 100%" in table[4] and "--peak-tflops" in table[4]
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["inference"]["mfu"] > 1 and "above 100%" in result["mfu_note"]
    assert main([*argv[:-1], "1000", "--json"]) == 0  # a petaflop: no note
    assert "mfu_note" not in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
