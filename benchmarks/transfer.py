"""The pre-train-then-transfer path as benchmarks: one setting per call, one row per run in results/transfer.jsonl.

    .venv/bin/python benchmarks/transfer.py pretrain --runs 3                        # Tiny-ImageNet, 60 minutes
    .venv/bin/python benchmarks/transfer.py finetune --init RUN --runs 3             # CIFAR-10, 15 minutes
    .venv/bin/python benchmarks/transfer.py finetune --init RUN --labels-per-class 100 --runs 3
    .venv/bin/python benchmarks/transfer.py scratch --labels-per-class 100 --runs 3  # CIFAR-10 alone, 15 minutes
    .venv/bin/python benchmarks/transfer.py scratch --minutes 30 --runs 3            # small-32px's 30-minute figure
    .venv/bin/python benchmarks/transfer.py fewshot --init RUN                       # 10-shot linear, pre-trained
    .venv/bin/python benchmarks/transfer.py fewshot --init RUN --random-init         # ... the same model at random
    .venv/bin/python benchmarks/transfer.py fewshot --init RUN --layer y             # ... of the pooled tokens

Targets (a 2-core CPU, the whole wall clock of the command as train_budget.py measures it), by host class:

    setting    command                                                               native bf16   without
    pretrain   vitkit train --data wds:tiny-imagenet --max-minutes 60                >= 35%        >= 25%
               (test top-1 on the shards' fixed 10,100-image hold-out)
    finetune   vitkit finetune RUN --data folder:cifar10-jpg --max-minutes 15        >= 81%        >= 70%
               (at least what `scratch --minutes 30` reaches)
    finetune   the same with --labels-per-class 100: >= 15 points above `scratch --labels-per-class 100`
    fewshot    vitkit fewshot RUN --data folder:cifar10-jpg --shots 10               >= 45%        >= 45%

RUN is a pre-training run directory (the `run_dir` of a pretrain row).  `--data`, `--minutes` and `--set
group.field=value` change a setting; every row records them (`config_changes`, `data`, `budget_minutes`).
A row holds the host class (vitkit.bench.records), the figures, the recipe and the plan's precision and
compilation; a finetune or scratch row with --labels-per-class also names the gain over the newest row of
the other kind with the same labels on the same host, where there is one.  Each training run is a fresh
process with a cold torch.compile cache, as a user's first run.  --no-record skips the row.
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

import torch

from vitkit import host as hosts
from vitkit.bench.records import append_row, read_rows
from vitkit.checkpoints import native
from vitkit.device import pick_device
from vitkit.eval.commands import fewshot_command
from vitkit.eval.fewshot import FewShotConfig
from vitkit.models import build_model
from vitkit.runs import open_checkpoint
from vitkit.train.plan_text import plan_lines
from vitkit.train.resolve import Request, resolve
from vitkit.train.trainer import train

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
TINY_IMAGENET, CIFAR10 = f"wds:{SHARED / 'tiny-imagenet'}", f"folder:{SHARED / 'cifar10-jpg'}"
SETTINGS = {  # name -> (URI, minutes, target with native bf16, without; None: judged against another row)
    "pretrain": (TINY_IMAGENET, 60.0, 0.35, 0.25),
    "finetune": (CIFAR10, 15.0, 0.81, 0.70),
    "scratch": (CIFAR10, 15.0, None, None),
    "fewshot": (CIFAR10, None, 0.45, 0.45),
}
GAIN_AT_100 = 0.15  # fine-tuned over from scratch, both 15 minutes, 100 labels per class
SHOTS, DRAWS = 10, 5
RESULTS = Path(__file__).resolve().parent / "results" / "transfer.jsonl"
EXIT_MINUTES = 0.25  # what the final save and the process exit take, kept out of the budget


def run_training(uri: str, minutes: float, overrides: list[str], init: str | None, labels: int | None) -> dict:
    start = time.monotonic()
    cache = tempfile.TemporaryDirectory(prefix="vitkit-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache.name  # compile time is part of what a first run pays
    out = time.strftime("runs/transfer-%Y%m%d-%H%M%S")  # a fresh run, never a resume
    request = Request(
        data=uri,
        out=out,
        max_minutes=minutes - EXIT_MINUTES,
        overrides=tuple(overrides),
        quiet=True,
        init_from=init,
        labels_per_class=labels,
    )
    config = resolve(request).config
    result = train(config, on_plan=lambda plan: [logging.info("%s", line) for line in plan_lines(plan)])
    test, plan = result["test"], result["plan"]
    return {
        "recipe": config.recipe,
        "top1": test["top1"],
        "top5": test["top5"],
        "test_images": test["count"],
        "num_train": plan["num_train"],
        "minutes": round((time.monotonic() - start) / 60, 3),
        "epochs": result["epoch"],
        "steps": result["step"],
        "status": result["status"],
        "precision": plan["precision"],
        "compiled": plan["compiled"],
        "img_size": plan.get("img_size"),
        "load_average": round(os.getloadavg()[0], 2),
        "run_dir": result["run_dir"],
        "device": str(pick_device(config.run.device)),
    }


def run_fewshot(uri: str, init: str, random_init: bool, seed: int, layer: str = "features") -> dict:
    """SHOTS-shot linear accuracy of the checkpoint's encoder, or of the same architecture initialised by `seed`."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vitkit-random-") as scratch:
        path = init
        if random_init:
            checkpoint = open_checkpoint(init)
            torch.manual_seed(seed)
            native.save(build_model(checkpoint.config), scratch, mean=checkpoint.mean, std=checkpoint.std)
            path = scratch
        report = fewshot_command(path, uri, FewShotConfig(shots=(SHOTS,), seeds=DRAWS, layer=layer), out=None)
    shot = report["shots"][str(SHOTS)]
    return {
        "shots": SHOTS,
        "top1": shot["mean"],
        "std": shot["std"],
        "draws": DRAWS,
        "encoder": "random" if random_init else "pretrained",
        "layer": layer,
        "test_images": report["num_test"],
        "minutes": round((time.monotonic() - start) / 60, 3),
        "load_average": round(os.getloadavg()[0], 2),
        "device": str(pick_device(FewShotConfig().device)),
    }


def gain_note(setting: str, row: dict) -> str:
    """Fine-tuned minus from scratch at the same labels per class on this host, from the newest matching row."""
    other = {"finetune": "scratch", "scratch": "finetune"}.get(setting)
    if other is None or not row.get("labels_per_class"):
        return ""
    label = hosts.current(row["device"]).label
    rows = [
        r
        for r in read_rows(RESULTS)
        if r.get("setting") == other
        and r.get("host_class") == label
        and r.get("labels_per_class") == row["labels_per_class"]
        and r.get("budget_minutes") == row["budget_minutes"]
    ]
    if not rows:
        return ""
    tuned, scratch = (row, rows[-1]) if setting == "finetune" else (rows[-1], row)
    gain = tuned["top1"] - scratch["top1"]
    goal = f" (target >= {100 * GAIN_AT_100:.0f} at 100)" if row["labels_per_class"] == 100 else ""
    return f"; fine-tuned - from scratch at {row['labels_per_class']} per class: {100 * gain:+.2f} points{goal}"


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("setting", choices=sorted(SETTINGS))
    parser.add_argument("--init", default=None, help="the pre-trained run or checkpoint (finetune, fewshot)")
    parser.add_argument("--labels-per-class", type=int, default=None, help="finetune, scratch: N labels per class")
    parser.add_argument("--random-init", action="store_true", help="fewshot: the --init model, randomly initialised")
    parser.add_argument(
        "--layer", default="features", help="fewshot: the representation probed (vitkit fewshot --layer)"
    )
    parser.add_argument("--data", default=None, help="another source URI (overrides the setting's)")
    parser.add_argument("--minutes", type=float, default=None, help="wall-clock budget (default: the setting's)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--no-record", action="store_true", help="do not append rows to " + RESULTS.name)
    args = parser.parse_args()
    if args.setting in ("finetune", "fewshot") and not args.init:
        parser.error(f"{args.setting} needs --init RUN (a pre-training run directory or checkpoint)")
    return args


def main() -> int:
    args = _arguments()
    _logging()
    uri, minutes, native_goal, plain_goal = SETTINGS[args.setting]
    uri, minutes = args.data or uri, args.minutes if args.minutes is not None else minutes
    goal = native_goal if hosts.current().native_bf16 else plain_goal
    changed = args.data is not None or args.minutes is not None or args.overrides
    if (
        changed
        or args.labels_per_class
        or (args.setting == "fewshot" and (args.random_init or args.layer != "features"))
    ):
        goal = None  # the targets are for the plain settings; the others are judged beside another row
    for index in range(args.runs):
        if args.setting == "fewshot":
            result = run_fewshot(uri, args.init, args.random_init, seed=index, layer=args.layer)
        else:  # a fresh process per run: torch.compile's in-memory caches would warm the later runs
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=_logging) as pool:
                result = pool.submit(
                    run_training, uri, minutes, args.overrides, args.init, args.labels_per_class
                ).result()
        row = {
            "setting": args.setting,
            "data": uri,
            "init": args.init,
            "labels_per_class": args.labels_per_class or 0,
            "budget_minutes": minutes,
            **result,
            "goal": goal if result["device"] == "cpu" else None,  # the targets are a 2-core CPU's
        }
        if not args.no_record:
            append_row(RESULTS, row, config_changes=args.overrides, device=row["device"])
        target, top1 = row["goal"], row["top1"]
        verdict = "" if target is None else f" (target {100 * target:.0f}%: {'met' if top1 >= target else 'missed'})"
        print(
            f"run {index + 1}: {args.setting} on {uri}: top-1 {100 * row['top1']:.2f}%{verdict} in "
            f"{row['minutes']:.1f} min{gain_note(args.setting, row)}; {hosts.current(row['device']).label}"
        )
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
