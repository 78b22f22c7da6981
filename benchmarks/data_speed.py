"""Data pipeline speed: folder decoding (images/s) and batched augmentation throughput (images/s).

    .venv/bin/python benchmarks/data_speed.py                       # caltech101-10 beside the checkout
    .venv/bin/python benchmarks/data_speed.py --folder DIR --threads 2 --batch 256 --size 32

Decoding: every JPEG of the folder (train + val) is decoded, resized (shorter side) and centre-cropped
by `vitkit.data.images.decode_files` with a thread pool, and, for comparison, by a process pool.
Augmentation: `train_transform` on a uint8 batch of random (B, 3, size, size) images on the CPU.
Wall-clock figures depend on what else runs on the machine; "per CPU-second" (process time) is the
steadier figure on a shared machine.  Appends one row of every figure to results/data_speed.jsonl.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from vitkit.bench.records import append_row
from vitkit.data.images import decode_files, decode_image
from vitkit.data.listing import class_folders, scan_folder
from vitkit.data.transforms import AugmentConfig, train_transform

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "data_speed.jsonl"


def _files(folder: Path) -> list[Path]:
    files = []
    for part in ("train", "val"):
        root = folder / part if (folder / part).is_dir() else folder
        files += scan_folder(root, class_folders(folder / "train" if (folder / "train").is_dir() else folder))[0]
        if root == folder:
            break
    return files


def _decode_one(args: tuple[Path, int]) -> int:
    return decode_image(args[0], 3, size=args[1]).numel()


def bench_decode(folder: Path, sizes: list[int], threads: list[int]) -> dict[str, float]:
    """images/s of decoding the folder, by "SIZEpx THREADS threads" (wall) and "SIZEpx N processes"."""
    figures = {}
    files = _files(folder)
    print(f"decode: {len(files)} files from {folder}")
    for size in sizes:
        for workers in threads:
            start, cpu = time.perf_counter(), time.process_time()
            images, good, _ = decode_files(files, 3, size, num_workers=workers)
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
            figures[f"{size}px {workers} threads"] = round(len(good) / seconds, 1)
            print(
                f"  size {size:4d}  threads {workers}:   {len(good) / seconds:7.0f} images/s wall ({seconds:.2f} s), "
                f"{len(good) / cpu_seconds:5.0f} images/s per CPU-second"
            )
        workers = max(threads)
        start = time.perf_counter()
        with ProcessPoolExecutor(workers) as pool:
            list(pool.map(_decode_one, [(f, size) for f in files], chunksize=16))
        seconds = time.perf_counter() - start
        figures[f"{size}px {workers} processes"] = round(len(files) / seconds, 1)
        print(
            f"  size {size:4d}  processes {workers}: {len(files) / seconds:7.0f} images/s  "
            f"({seconds:.2f} s, incl. pool start)"
        )
    return figures


def bench_augment(batch: int, size: int, repeats: int) -> dict[str, float]:
    """images/s (wall) of each augmentation, by its name."""
    figures = {}
    images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8)
    labels = torch.randint(0, 10, (batch,))
    configs = {
        "inception crop + flip": AugmentConfig(),
        "pad crop + flip": AugmentConfig(crop="pad"),
        "inception + flip + RandAugment(2, 10)": AugmentConfig(randaugment=(2, 10)),
        "+ mixup/cutmix + label smoothing": AugmentConfig(
            randaugment=(2, 10), mixup=0.8, cutmix=1.0, label_smoothing=0.1
        ),
    }
    print(f"augment: batch {batch} of 3x{size}x{size}, {torch.get_num_threads()} torch threads")
    for name, config in configs.items():
        generator = torch.Generator().manual_seed(0)
        train_transform(images, labels, 10, size, config=config, generator=generator)  # warm-up
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(repeats):
            train_transform(images, labels, 10, size, config=config, generator=generator)
        seconds = (time.perf_counter() - start) / repeats
        cpu_seconds = (time.process_time() - cpu) / repeats
        figures[name] = round(batch / seconds, 1)
        print(
            f"  {name:40s} {batch / seconds:8.0f} images/s wall ({seconds * 1000:5.1f} ms/batch), "
            f"{batch / cpu_seconds:8.0f} images/s per CPU-second"
        )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=ROOT.parent / "shared" / "data" / "caltech101-10")
    parser.add_argument("--sizes", type=int, nargs="+", default=[224, 64])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--torch-threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)
    figures = {}
    if args.folder.is_dir():
        figures["decode_images_per_s"] = bench_decode(args.folder, args.sizes, args.threads)
    else:
        print(f"decode: skipped, {args.folder} does not exist")
    figures["augment_images_per_s"] = bench_augment(args.batch, args.size, args.repeats)
    append_row(RESULTS, {"folder": str(args.folder), "torch_threads": args.torch_threads, **figures})


if __name__ == "__main__":
    main()
