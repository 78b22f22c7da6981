"""Milliseconds per Muon step on a recipe's encoder matrices: vitkit's StackedMuon against torch.optim.Muon.

    .venv/bin/python benchmarks/muon_step.py                     # small-28px (16 matrices of 4 shapes)
    .venv/bin/python benchmarks/muon_step.py --recipe small-32px --image-size 32 --channels 3

Both optimisers get the same matrices (the encoder blocks' 2-D weights of the recipe's model) with the same
random gradients; each `step()` is timed after a few untimed ones (median of --steps).  Prints the two times,
their ratio, and for reference the fused AdamW step over the same matrices, and appends them as a row of
results/muon_step.jsonl (--no-record: none).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from vitkit.bench.records import append_row
from vitkit.data.sources import SourceInfo
from vitkit.models import build_model
from vitkit.train.muon import StackedMuon
from vitkit.train.optim import MUON_OPTIONS, is_hidden_matrix
from vitkit.train.recipes import get_recipe

RESULTS = Path(__file__).resolve().parent / "results" / "muon_step.jsonl"
WARM_STEPS = 5


def median_ms(step, steps: int) -> float:
    times = []
    for index in range(WARM_STEPS + steps):
        start = time.perf_counter()
        step()
        if index >= WARM_STEPS:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default="small-28px")
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--steps", type=int, default=50, help="timed steps per optimiser")
    parser.add_argument("--no-record", action="store_true", help="do not append a row to results/muon_step.jsonl")
    args = parser.parse_args()
    info = SourceInfo(
        uri="folder:benchmark",
        num_train=50_000,
        num_classes=10,
        image_size=args.image_size,
        channels=args.channels,
        in_memory=True,
    )
    model = build_model(get_recipe(args.recipe, info).model)
    matrices = [param for name, param in model.named_parameters() if is_hidden_matrix(name, param)]
    generator = torch.Generator().manual_seed(0)
    for param in matrices:
        param.grad = torch.randn(param.shape, generator=generator) * 1e-2
    shapes = sorted({tuple(param.shape) for param in matrices})
    kwargs = dict(lr=1e-3, weight_decay=0.05, **MUON_OPTIONS)
    ours = median_ms(StackedMuon(matrices, **kwargs).step, args.steps)
    theirs = median_ms(torch.optim.Muon(matrices, **kwargs).step, args.steps)
    adamw = median_ms(torch.optim.AdamW(matrices, lr=1e-3, fused=True).step, args.steps)
    print(f"{args.recipe}: {len(matrices)} matrices of shapes {shapes}, {torch.get_num_threads()} threads")
    print(f"  StackedMuon (vitkit):   {ours:.2f} ms/step")
    print(f"  torch.optim.Muon:       {theirs:.2f} ms/step  ({theirs / ours:.2f}x StackedMuon's time)")
    print(f"  fused AdamW, reference: {adamw:.2f} ms/step")
    if not args.no_record:
        times = {"vitkit StackedMuon": ours, "torch.optim.Muon": theirs, "fused AdamW": adamw}
        figures = {"recipe": args.recipe, "matrices": len(matrices), "shapes": [list(s) for s in shapes]}
        append_row(RESULTS, {**figures, "ms_per_step": {k: round(v, 2) for k, v in times.items()}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
