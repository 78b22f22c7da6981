"""Does JPEG decoding keep up with training?  folder: data through DataLoader workers vs the model's step rate.

    .venv/bin/python benchmarks/data_pipeline.py                                   # caltech101-10, 64 px, workers 0,1,2
    .venv/bin/python benchmarks/data_pipeline.py --img-size 224 --model vit_ti16 --patch-size 16 --depth 12

Three figures per worker count N (DataLoader `num_workers`), all in images/s:
  decode    the loader alone: vitkit.data's file set (`load_split(..., max_in_memory_bytes=0)`) read by
            vitkit.data.loader.FileBatches, i.e. JPEG decode + resize + centre crop + collate;
  fed       training steps whose batches come from that loader (the end-to-end rate);
  compute   training steps on one fixed in-memory batch (what the model alone can do).
If decode >= compute, decoding keeps up; "fed" shows what is left when both share the CPU cores.
The model and precision are vitkit's defaults for the size (folder recipe small-64px: ViT D=192
L=6 on 8x8 patches at 64 px), precision "auto".  On a shared machine the figures are noisy; the
script alternates the three measurements per worker count and reports medians over --rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from vitkit.bench.throughput import make_optimizer, num_threads, training_step
from vitkit.device import resolve_precision
from vitkit.data.loader import FileBatches, IndexStream
from vitkit.data.sources import load_split
from vitkit.data.transforms import to_float
from vitkit.models import create_model

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_FOLDER = ROOT.parent / "shared" / "data" / "caltech101-10"


def loader(data, workers: int, batch: int, steps: int, seed: int) -> FileBatches:
    stream = IndexStream(len(data), seed)
    return FileBatches(data, stream, start_step=0, total_steps=steps, global_batch=batch, rank=0, world=1,
                       micro_batch=batch, device=torch.device("cpu"), workers=workers, strict=False)


def decode_rate(data, workers: int, batch: int, steps: int, seed: int) -> float:
    """Images/s of the loader alone, worker start-up included (it is part of every epoch's cost)."""
    start, count = time.perf_counter(), 0
    for micro in loader(data, workers, batch, steps, seed):
        count += sum(len(labels) for _, labels in micro)
    return count / (time.perf_counter() - start)


def fed_rate(data, workers: int, batch: int, steps: int, seed: int, model, optimizer, precision: str) -> float:
    """Images/s of training steps fed by the loader."""
    device = torch.device("cpu")
    start, count = time.perf_counter(), 0
    for micro in loader(data, workers, batch, steps, seed):
        for images, labels in micro:
            training_step(model, optimizer, to_float(images), labels, device, precision)()
            count += len(labels)
    return count / (time.perf_counter() - start)


def compute_rate(batch_images, labels, steps: int, model, optimizer, precision: str) -> float:
    step = training_step(model, optimizer, to_float(batch_images), labels, torch.device("cpu"), precision)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * len(labels) / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", default=str(DEFAULT_FOLDER), help="class-folder data set (train/ and val/)")
    parser.add_argument("--img-size", type=int, default=64, help="decode/resize side and model resolution")
    parser.add_argument("--model", default="vit_ti16", help="preset the model is built from")
    parser.add_argument("--patch-size", type=int, default=8)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6, help="batches per measurement")
    parser.add_argument("--workers", default="0,1,2", help="comma-separated DataLoader worker counts")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads of the main process")
    parser.add_argument("--json", action="store_true", help="also print one JSON object as the last line")
    args = parser.parse_args(argv)
    uri = f"folder:{args.folder}"
    data = load_split(uri, "train", image_size=args.img_size, max_in_memory_bytes=0)  # decoded on demand
    if data.files is None:
        raise SystemExit(f"{uri} came back in memory; expected a file-based set")
    precision = resolve_precision(args.precision, torch.device("cpu"))
    workers = [int(w) for w in args.workers.split(",") if w]
    with num_threads(args.threads):
        torch.manual_seed(0)
        model = create_model(args.model, num_classes=data.num_classes, img_size=args.img_size,
                             patch_size=args.patch_size, depth=args.depth).train()
        optimizer = make_optimizer(model, torch.device("cpu"))
        fixed = next(iter(loader(data, 0, args.batch_size, 1, 0)))[0]
        compute_rate(*fixed, 2, model, optimizer, precision)  # warm-up
        rates: dict[str, list[float]] = {}
        for _ in range(args.rounds):
            for n in workers:
                rates.setdefault(f"decode/{n}", []).append(decode_rate(data, n, args.batch_size, args.steps, 1))
                rates.setdefault(f"fed/{n}", []).append(
                    fed_rate(data, n, args.batch_size, args.steps, 2, model, optimizer, precision))
                rates.setdefault("compute", []).append(compute_rate(*fixed, args.steps, model, optimizer, precision))
        threads = torch.get_num_threads()
    median = {k: statistics.median(v) for k, v in rates.items()}
    params = sum(p.numel() for p in model.parameters())
    print(f"{uri}: {len(data)} JPEGs -> {args.img_size}px; model {args.model} P={args.patch_size} L={args.depth} "
          f"({params:,} params), {precision}, batch {args.batch_size}, {threads} torch threads; "
          f"medians of {args.rounds} rounds x {args.steps} batches")
    print(f"{'workers':>8}{'decode img/s':>14}{'fed img/s':>11}{'compute img/s':>15}  decode keeps up?")
    for n in workers:
        d, f, c = median[f"decode/{n}"], median[f"fed/{n}"], median["compute"]
        print(f"{n:>8}{d:>14.1f}{f:>11.1f}{c:>15.1f}  {'yes' if d >= c else 'no'} ({d / c:.2f}x)")
    if args.json:
        print(json.dumps({"uri": uri, "img_size": args.img_size, "precision": precision, "threads": threads,
                          "images_per_s": median, "rounds": rates}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
