"""bf16 autocast vs fp32 training on the CPU: the same run twice, curves side by side.

    .venv/bin/python benchmarks/precision_accuracy.py                          # digits, full default recipe (~2 min)
    .venv/bin/python benchmarks/precision_accuracy.py --data fashion-mnist:../shared/data/fashion-mnist \
        --set data.steps=300 --set eval.every_epochs=0.25                       # CIFAR-size: 28 px, 49 tokens

Each precision runs `vitkit train` (the real CLI, its recipe chosen from the data) with the same
seed and only `run.precision` changed; bf16 autocast on the CPU runs attention through the explicit
softmax path (ViTConfig.attn_impl "auto").  The script prints every evaluation record of both runs,
the final test accuracy and loss of each, and the wall time (noisy on a shared machine), and appends one
row to results/precision_accuracy.jsonl.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vitkit.bench.records import append_row

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "precision_accuracy.jsonl"


def run(data: str, precision: str, out: Path, extra: list[str]) -> tuple[list[dict], float]:
    cmd = [
        sys.executable,
        "-m",
        "vitkit.cli",
        "train",
        "--data",
        data,
        "--out",
        str(out),
        "--json",
        "--set",
        f"run.precision={precision}",
    ]
    for pair in extra:
        cmd += ["--set", pair]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("split") != "train"], seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="digits", help="data URI (vitkit train --data)")
    parser.add_argument("--set", action="append", default=[], help="extra GROUP.FIELD=VALUE for both runs")
    parser.add_argument("--out", default="", help="keep the run directories here (default: a temporary one)")
    parser.add_argument("--json", action="store_true", help="also print one JSON object as the last line")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.out or tmp)
        results = {p: run(args.data, p, base / f"run-{p}", args.set) for p in ("fp32", "bf16")}
    (fp32, t32), (bf16, t16) = results["fp32"], results["bf16"]
    print(f"{args.data} {' '.join(args.set)}: evaluation records, fp32 vs bf16 autocast (same seed)")
    print(f"{'step':>6}{'epoch':>8}{'split':>7}{'fp32 top1':>11}{'bf16 top1':>11}{'fp32 loss':>11}{'bf16 loss':>11}")
    for a, b in zip(fp32, bf16):
        print(
            f"{a['step']:>6}{a['epoch']:>8.2f}{a['split']:>7}{a['top1']:>11.4f}{b['top1']:>11.4f}"
            f"{a['loss']:>11.4f}{b['loss']:>11.4f}"
        )
    fa, fb = fp32[-1], bf16[-1]
    print(
        f"final: fp32 top1 {fa['top1']:.4f} loss {fa['loss']:.4f} ({t32:.0f} s) | "
        f"bf16 top1 {fb['top1']:.4f} loss {fb['loss']:.4f} ({t16:.0f} s) | "
        f"difference {fb['top1'] - fa['top1']:+.4f} = "
        f"{round((fb['top1'] - fa['top1']) * fa['count'])} of {fa['count']} images"
    )
    figures = {
        "data": args.data,
        "top1": {"fp32": fa["top1"], "bf16": fb["top1"]},
        "loss": {"fp32": fa["loss"], "bf16": fb["loss"]},
        "minutes": {"fp32": round(t32 / 60, 2), "bf16": round(t16 / 60, 2)},
    }
    append_row(RESULTS, figures, config_changes=args.set)
    if args.json:
        print(
            json.dumps(
                {"data": args.data, "set": args.set, "fp32": fp32, "bf16": bf16, "seconds": {"fp32": t32, "bf16": t16}}
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
