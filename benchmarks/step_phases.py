"""Where a budgeted run's time goes: milliseconds per optimiser step in each phase of its schedule.

    .venv/bin/python benchmarks/step_phases.py fashion-mnist:../shared/data/fashion-mnist
    .venv/bin/python benchmarks/step_phases.py folder:../shared/data/cifar10-jpg --set model.depth=4 --profile

Builds the run `vitkit train --data URI --max-minutes M [--set ...]` would train (the recipe chosen from the
data, compiled as the recipe says), then times `train_step` on real augmented batches at the middle of each
phase of the schedule (one phase per PatchDropout rate and training side), after a few untimed steps.
Prints, per phase: the rate, the side, ms per step (median of --steps), images/s and the data part of it;
with --profile, torch.profiler's top operators for the first phase (matmuls against fused elementwise
graphs against per-step overhead).  Appends a row a phase to results/step_phases.jsonl (--no-record: none);
its scratch run directory is removed at the end.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from vitkit.bench.records import append_row
from vitkit.train import distributed
from vitkit.train.plan import schedule_of
from vitkit.train.resolve import Request, resolve
from vitkit.train.step import train_step
from vitkit.train.trainer import Trainer

RESULTS = Path(__file__).resolve().parent / "results" / "step_phases.jsonl"
WARM_STEPS = 5  # untimed steps at the start of each phase: they warm caches


def time_phase(trainer: Trainer, batches, position: float, steps: int) -> tuple[float, float]:
    """(median ms per whole step, median ms of it spent making the batch) at schedule `position`."""
    state, phase = trainer.state, trainer.schedule.at(position)
    spec = trainer.step_spec(phase)
    totals, datas = [], []
    for index in range(WARM_STEPS + steps):
        start = time.perf_counter()
        batch = trainer.objective.batch(next(batches), phase, state.generator)
        made = time.perf_counter()
        out = train_step(state, batch, spec, trainer.objective.loss_of(spec, state.generator))
        float(out["loss"])  # wait for the step
        if index >= WARM_STEPS:
            totals.append(time.perf_counter() - start)
            datas.append(made - start)
    return statistics.median(totals) * 1e3, statistics.median(datas) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="data source URI, e.g. fashion-mnist:DIR or folder:DIR")
    parser.add_argument("--minutes", type=float, default=15.0, help="the budget the run is planned for")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per phase")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="group.field=value")
    parser.add_argument("--profile", action="store_true", help="top operators of the first phase")
    parser.add_argument("--no-record", action="store_true", help="do not append rows to results/step_phases.jsonl")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        request = Request(
            data=args.data, max_minutes=args.minutes, out=f"{scratch}/run", overrides=tuple(args.overrides), quiet=True
        )
        config = resolve(request).config
        trainer = Trainer(config, distributed.current(), torch.device("cpu"), time.monotonic())
        trainer.plan = trainer._make_plan(trainer._warm_up())  # compiles every phase's graph, as a run does
        trainer.schedule = schedule_of(config, trainer.plan.steps, trainer.plan.lr)
        batches, total, plan = iter(trainer.batches), trainer.plan.steps, trainer.plan
        print(
            f"{args.data}: recipe {config.recipe}, batch {config.data.batch_size}, "
            f"{torch.get_num_threads()} threads, {plan.precision}, compiled={plan.compiled}; {plan.host}"
        )
        rows = []
        for begin, end, rate in trainer.schedule.spans():
            step_ms, data_ms = time_phase(trainer, batches, (begin + end) / 2 * total, args.steps)
            rows.append(
                {
                    "data": args.data,
                    "recipe": config.recipe,
                    "phase": [begin, end],
                    "patch_dropout": rate,
                    "ms_per_step": round(step_ms, 2),
                    "data_ms": round(data_ms, 2),
                    "precision": plan.precision,
                    "compiled": plan.compiled,
                    "images_per_s": round(config.data.batch_size / step_ms * 1e3, 1),
                }
            )
            print(
                f"  schedule {begin:.0%}-{end:.0%}: PatchDropout {rate:g}: {step_ms:.1f} ms/step "
                f"({data_ms:.1f} ms of it making the batch), {config.data.batch_size / step_ms * 1e3:,.0f} images/s"
            )
        for row in rows if not args.no_record else ():
            append_row(RESULTS, row, config_changes=args.overrides)
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            begin, end, _ = trainer.schedule.spans()[0]
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                time_phase(trainer, batches, (begin + end) / 2 * total, 20)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
