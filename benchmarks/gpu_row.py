"""One row of benchmarks/results/gpu.jsonl from a `vitkit bench --json` and a `compare.py --json` run on a GPU.

    python3 benchmarks/gpu_row.py BENCH_LOG [COMPARE_LOG]    # each: a log whose last JSON line is the result

The row carries the GPU (its name, as the host class), ViT-B/16's training and inference images/s and MFU
against the measured bf16 matmul peak (from `vitkit bench`), and vitkit's speed over timm's from the
comparison, where both libraries ran in one process with the same batch, precision and torch.compile.
benchmarks/gpu_checklist.sh runs it after the two measurements.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from vitkit.bench.records import append_row

RESULTS = Path(__file__).resolve().parent / "results" / "gpu.jsonl"


def last_json(path: str) -> dict[str, Any]:
    """The last line of the file at `path` that is a JSON object."""
    for line in reversed(Path(path).read_text(encoding="utf-8").splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"{path}: no JSON result line (the run failed or was cut short)")


def figures(bench: dict[str, Any], compare: dict[str, Any] | None) -> dict[str, Any]:
    """The row's figures: bench's speeds and MFU, and compare's ratios for the b16 configuration (if given)."""
    train, infer = bench["training"], bench["inference"]
    mine = {
        "model": bench["model"],
        "precision": bench["precision"],
        "batch_size": bench["batch_size"],
        "compile": bench["compile"],
        "peak_tflops": round(bench["peak_flops"] / 1e12, 1),
        "peak_source": bench["peak_source"],
        "train_img_s": round(train["images_per_s"], 1),
        "train_mfu": round(train["mfu"], 4),
        "infer_img_s": round(infer["images_per_s"], 1),
        "infer_mfu": round(infer["mfu"], 4),
        "train_peak_memory_gib": round(train["peak_memory_bytes"] / 2**30, 2),
    }
    if compare is None:
        return mine
    config, precision = compare["configs"]["b16"], bench["precision"]
    ratios = config["ratios_images_per_s"]
    return {
        **mine,
        "vs_timm_train": round(ratios[f"training/{precision}/vs_timm"], 3),
        "vs_timm_infer": round(ratios[f"inference/{precision}/vs_timm"], 3),
        "compare_batch_size": config["spec"]["batch_size"],
        "compare_img_s": {key: round(value, 1) for key, value in config["images_per_s"].items()},
    }


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        raise SystemExit(__doc__.split("\n\n")[1])
    bench = last_json(argv[0])
    device = bench["device"].split()[0]  # "cuda:0 (NVIDIA H100 80GB HBM3)": the row's host is that GPU
    row = append_row(RESULTS, figures(bench, last_json(argv[1]) if len(argv) == 2 else None), device=device)
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
