"""`vitkit train --data URI --max-minutes M` as a benchmark: test top-1, epochs and minutes, one row per run.

    .venv/bin/python benchmarks/train_budget.py fashion-mnist      # one of the targets below, by name
    .venv/bin/python benchmarks/train_budget.py mnist --runs 3
    .venv/bin/python benchmarks/train_budget.py --data folder:DIR --minutes 30 [--set group.field=value ...]

Targets (a 2-core CPU, the whole wall clock of the run: start-up, data loading, torch.compile
into a fresh cache as a user's first run pays it, training and the final test evaluation), by host class:

    name           command                                                   native bf16   without (AVX2)
    digits         vitkit train                                              >= 98%   in < 2 min
    mnist          vitkit train --data mnist:DIR --max-minutes 10            >= 99.5%      >= 99.4%
    fashion-mnist  vitkit train --data fashion-mnist:DIR --max-minutes 15    >= 93.5%      >= 92.5%
    cifar10        vitkit train --data folder:cifar10-jpg --max-minutes 30   >= 80%        >= 75% (a test split)

A host without native bf16 can be emulated on one with it:
`ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python benchmarks/train_budget.py ...`.
Each run appends a row to benchmarks/results/train_budget.jsonl (vitkit.bench.records: date, commit,
command, host class, emulation) with the figures and the plan's choices; --no-record skips it.

The run goes through the same resolve + train calls as the command (the recipe chosen from the data, the
schedule fitted to the budget: run.budget_schedule=fit is the default).  Every run prints one line
per figure and, last, one JSON object; with --runs N, one per run and a summary.  The data sets are
read from ../shared/data (beside the clone); a missing directory is a clear error.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from vitkit import host as hosts
from vitkit.bench.records import append_row
from vitkit.device import pick_device
from vitkit.eval.evaluator import one_view_note
from vitkit.train.plan_text import plan_lines
from vitkit.train.resolve import Request, resolve
from vitkit.train.trainer import train

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
TARGETS = {  # name -> (URI, minutes or None for no budget, target top-1 with native bf16, without)
    "digits": ("digits", None, 0.98, 0.98),
    "mnist": (f"mnist:{SHARED / 'mnist'}", 10.0, 0.995, 0.994),
    "fashion-mnist": (f"fashion-mnist:{SHARED / 'fashion-mnist'}", 15.0, 0.935, 0.925),
    "cifar10": (f"folder:{SHARED / 'cifar10-jpg'}", 30.0, 0.80, 0.75),
}
RESULTS = Path(__file__).resolve().parent / "results" / "train_budget.jsonl"
EXIT_MINUTES = 0.25  # what the final save and the process exit take, kept out of the budget


def run_once(uri: str, minutes: float | None, overrides: list[str], warm_cache: bool) -> dict:
    start = time.monotonic()
    cache = None if warm_cache else tempfile.TemporaryDirectory(prefix="vitkit-inductor-")
    if cache is not None:  # compile time is part of what a first run pays: measure it cold
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache.name
    out = time.strftime("runs/bench-%Y%m%d-%H%M%S")  # a fresh run, never a resume
    budget = None if minutes is None else minutes - EXIT_MINUTES
    config = resolve(Request(data=uri, out=out, max_minutes=budget, overrides=tuple(overrides), quiet=True)).config
    result = train(config, on_plan=lambda plan: [logging.info("%s", line) for line in plan_lines(plan)])
    test = result["test"]
    plan = result["plan"]
    return {
        "data": uri,
        "recipe": config.recipe,
        "budget_minutes": minutes,
        "top1": test["top1"],
        "top5": test["top5"],
        **({"top1_one_view": test["top1_one_view"]} if "top1_one_view" in test else {}),
        "minutes": round((time.monotonic() - start) / 60, 3),
        "epochs": result["epoch"],
        "steps": result["step"],
        "status": result["status"],
        "precision": plan["precision"],
        "compiled": plan["compiled"],
        "fit_epochs_estimate": plan.get("measured", {}).get("fit_epochs"),
        "cold_compile_cache": not warm_cache,
        "load_average": round(os.getloadavg()[0], 2),
        "device": str(pick_device(config.run.device)),
        "run_dir": result["run_dir"],
    }


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "target", nargs="?", choices=sorted(TARGETS), default=None, help="default: fashion-mnist, or none with --data"
    )
    parser.add_argument("--data", default=None, help="another source URI (overrides the target's)")
    parser.add_argument("--minutes", type=float, default=None, help="wall-clock budget (default: the target's)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--warm-cache", action="store_true", help="let torch.compile reuse its cache")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--no-record", action="store_true", help="do not append rows to " + str(RESULTS.name))
    args = parser.parse_args()
    _logging()
    if args.target is None and args.data:  # another data set: no target of the table above applies
        target, (uri, minutes, goal) = "custom", (args.data, args.minutes, None)
    else:
        target = args.target or "fashion-mnist"
        uri, minutes, native_goal, plain_goal = TARGETS[target]
        goal = native_goal if hosts.current().native_bf16 else plain_goal
        uri, minutes = args.data or uri, args.minutes if args.minutes is not None else minutes
    results = []
    for index in range(args.runs):
        # A fresh process per run: torch.compile's in-memory caches would otherwise warm the later runs.
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_logging) as pool:
            r = pool.submit(run_once, uri, minutes, args.overrides, args.warm_cache).result()
        results.append(r)
        if not args.no_record:
            append_row(
                RESULTS, {"target": target, **r, "goal": goal}, config_changes=args.overrides, device=r["device"]
            )
        print(
            f"run {index + 1}: {uri} recipe {r['recipe']}: test top-1 {100 * r['top1']:.2f}%{one_view_note(r)} "
            + (f" (target {100 * goal:.1f}%: {'met' if r['top1'] >= goal else 'missed'})" if goal else "")
            + f", {r['epochs']:.1f} epochs "
            f"in {r['minutes']:.1f} min, {r['status']}, {r['precision']}, compiled {r['compiled']}; "
            f"load average {r['load_average']:.1f}; {hosts.current(r['device']).label}"
        )
        print(json.dumps(r))
    if args.runs > 1:
        tops = [100 * r["top1"] for r in results]
        print(f"{args.runs} runs: top-1 {min(tops):.2f}-{max(tops):.2f}% (mean {sum(tops) / len(tops):.2f}%)")
        ones = [100 * r["top1_one_view"] for r in results if "top1_one_view" in r]
        if ones:
            print(f"  one view: {min(ones):.2f}-{max(ones):.2f}% (mean {sum(ones) / len(ones):.2f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
