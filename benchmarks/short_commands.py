"""Two short commands as a user types them, timed whole (process start to exit), one row per run.

    .venv/bin/python benchmarks/short_commands.py epoch --data folder:DIR    # ~600 small images, one epoch
    .venv/bin/python benchmarks/short_commands.py mpp --runs 3               # Fashion-MNIST, 3 minutes
    .venv/bin/python benchmarks/short_commands.py mpp -- --batch-size 512    # flags after -- go to vitkit

Targets (a 2-core CPU, any host class):

    name   command                                                          target
    epoch  vitkit train --data folder:DIR --epochs 1 (~600 32-px images)    < 1 minute, wall clock
    mpp    vitkit pretrain-mpp --data fashion-mnist:DIR --max-minutes 3     >= 1,000 images/s on an AVX2
                                                                            host

Each run is a fresh process in a fresh run directory with a cold torch.compile cache (what a user's first
run pays).  images/s is the mean of the run's training records (metrics.jsonl), steps and epochs its last
record.  Rows go to benchmarks/results/short_commands.jsonl with the host class (vitkit.bench.records).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vitkit.bench.records import append_row
from vitkit.metrics_log import read_metrics

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
RESULTS = Path(__file__).resolve().parent / "results" / "short_commands.jsonl"
VITKIT = str(Path(sys.executable).with_name("vitkit"))
TARGETS = {  # name -> (argv after `vitkit`, default data, what is compared with the goal, goal)
    "epoch": (["train", "--epochs", "1"], None, "minutes", 1.0),
    "mpp": (["pretrain-mpp", "--max-minutes", "3"], f"fashion-mnist:{SHARED / 'fashion-mnist'}", "images_per_s", 1000),
}


def run_once(name: str, data: str, extra: list[str]) -> tuple[dict, list[str]]:
    argv, _, figure, goal = TARGETS[name]
    out = time.strftime(f"runs/short-{name}-%Y%m%d-%H%M%S")
    command = [VITKIT, *argv, "--data", data, *extra, "--out", out]
    with tempfile.TemporaryDirectory(prefix="vitkit-inductor-") as cache:
        start = time.monotonic()
        done = subprocess.run(command, env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}, check=False)
        minutes = (time.monotonic() - start) / 60
    train = [r for r in read_metrics(out) if r.get("split") == "train" and "images_per_s" in r]
    row = {
        "target": name,
        "exit_code": done.returncode,
        "minutes": round(minutes, 3),
        "images_per_s": round(sum(r["images_per_s"] for r in train) / len(train), 1) if train else None,
        "steps": train[-1]["step"] if train else 0,
        "epochs": round(train[-1]["epoch"], 3) if train else 0.0,
        "run_dir": out,
    }
    row["met"] = (
        done.returncode == 0
        and row[figure] is not None
        and (row[figure] < goal if figure == "minutes" else row[figure] >= goal)
    )
    return row, ["vitkit", *argv, "--data", data, *extra]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", choices=sorted(TARGETS))
    parser.add_argument("--data", default=None, help="the source URI (epoch has no default)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--no-record", action="store_true", help="do not append rows to " + RESULTS.name)
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)  # after --: more flags for the vitkit command
    args, extra = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    data = args.data or TARGETS[args.target][1]
    if data is None:
        parser.error(f"{args.target} needs --data (for example folder:DIR with ~600 small images)")
    for _ in range(args.runs):
        row, command = run_once(args.target, data, extra)
        if not args.no_record:
            row = append_row(RESULTS, row, command=command, config_changes=extra)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
