"""Data pipeline throughput: the same JPEGs as a folder, as tar shards (wds:) and as an Arrow dataset (hf:),
per DataLoader worker, at 64 and 224 px; and how many workers an H200 training ViT-B/16 at 3,443 img/s needs.

    .venv/bin/python benchmarks/data_pipeline.py                    # both data sets, 64 + 224 px, 1-2 workers
    .venv/bin/python benchmarks/data_pipeline.py --data caltech --sizes 224 --workers 1,2,4,8 --rounds 5
    .venv/bin/python benchmarks/data_pipeline.py --listing /tmp/bigfolder   # listing a folder of many files

The images: caltech101-10's 776 training JPEGs (full size, about 263x233) and --cifar-count of the
50,000 cifar10-jpg JPEGs (32x32; every k-th file), from ../shared/data.  They are prepared once under
--work, each way holding the same bytes:
  folder   class folders of symlinks to the originals   FileBatches: random access, one file per image
  wds      `vitkit shard` of that folder (original bytes) ShardBatches: shards front to back, shuffle window
  hf       datasets.Dataset.save_to_disk of the bytes    FileBatches over memory-mapped Arrow rows
and reference rows: folder decoded by Pillow alone (no simplejpeg), the webdataset library's tar
pipeline on the same shards (vitkit's decode, the library's reading), the datasets library reading the
same Arrow files (its own Pillow decode; --paths hf,hf/datasets-lib), and the training-side
augmentation (the recipe's train_transform on uint8 batches in this process; on a GPU it runs there).

"decode" is what DataLoader workers do: read, decode (JPEG DCT-domain downscaling where the target
is smaller), resize the shorter side, centre-crop, collate; images/s in the steady state after the
first batch.  Per worker = the rate with 1 worker.  Workers needed = ceil(3,443 / per-worker rate):
3,443 img/s is an H200 training ViT-B/16 at 224 px; at 64 px the count says what the same demand would
take.  Rounds alternate the paths (the machine's load varies); the figures are medians and the
ratios are taken within each round before the median.  The summary is appended to
results/data_pipeline.jsonl (--no-record: not).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from vitkit.bench.records import append_row
from vitkit.data import images as image_module
from vitkit.data.loader import FileBatches, IndexStream
from vitkit.data.shard import write_shards
from vitkit.data.sources import SourceInfo, load_split
from vitkit.data.stream import ShardBatches
from vitkit.data.transforms import train_transform
from vitkit.train.recipes import get_recipe

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "benchmarks" / "results" / "data_pipeline.jsonl"
TARGET = 3443  # img/s ViT-B/16 trains at, 224 px, bf16, compiled, on an H200 (results/gpu.jsonl)
CPU = torch.device("cpu")


# ------------------------------------------------------------------------------ preparing the three copies
def _prepare(name: str, source: Path, step: int, work: Path) -> dict[str, str]:
    """folder/ (symlinks), wds/ (vitkit shard) and hf/ (save_to_disk) of every `step`-th JPEG of `source`."""
    root = work / name
    if (root / "done").is_file():
        return {k: str(root / k) for k in ("folder", "wds", "hf")}
    shutil.rmtree(root, ignore_errors=True)
    files = sorted(source.glob("*/*.jpg"))[::step]
    for path in files:
        (root / "folder" / path.parent.name).mkdir(parents=True, exist_ok=True)
        (root / "folder" / path.parent.name / path.name).symlink_to(path)
    write_shards(f"folder:{root / 'folder'}", root / "wds", 256)
    import datasets

    classes = sorted({p.parent.name for p in files})
    rows = {
        "image": [{"bytes": p.read_bytes(), "path": None} for p in files],
        "label": [classes.index(p.parent.name) for p in files],
    }
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(root / "hf"))
    (root / "done").write_text(f"{len(files)} files\n")
    return {k: str(root / k) for k in ("folder", "wds", "hf")}


# ------------------------------------------------------------------------------ one measurement each
def _steady_rate(
    batches: Iterable[Any], count: Callable[[Any], int], limit: int, workers: int, prefetch: int
) -> tuple[float, float]:
    """(images per wall second, images per CPU second of this process) over `limit` batches, once the
    workers are up and their prefetched batches are drained (the clock starts after 1 + prefetch x workers
    batches, which were decoded while the first one was).  With 0 workers all the work is this
    process's, so the CPU-second rate is what one worker does on a core of its own, whatever else the
    machine is running."""
    iterator = iter(batches)
    for _ in range(1 + prefetch * workers):
        next(iterator)
    start, cpu, seen = time.perf_counter(), time.process_time(), 0
    for _, batch in zip(range(limit), iterator):
        seen += count(batch)
    return seen / (time.perf_counter() - start), seen / max(time.process_time() - cpu, 1e-9)


def _steps_count(step: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
    return sum(len(labels) for _, labels in step)


def folder_like(uri: str, size: int, workers: int, batch: int, limit: int) -> tuple[float, float]:
    """folder: or hf: (Arrow) through FileBatches; corrupt files would be dropped and counted."""
    data = load_split(uri, "train", image_size=size, max_in_memory_bytes=0)
    loader = FileBatches(
        data,
        IndexStream(len(data), 1),
        start_step=0,
        total_steps=limit + 1 + 4 * workers,
        global_batch=batch,
        rank=0,
        world=1,
        micro_batch=batch,
        device=CPU,
        workers=workers,
        strict=False,
    )
    return _steady_rate(loader, _steps_count, limit, workers, 4)


def shards(uri: str, size: int, workers: int, batch: int, limit: int) -> tuple[float, float]:
    data = load_split(uri, "train", image_size=size, max_in_memory_bytes=0)
    stream = ShardBatches(
        data, seed=1, global_batch=batch, rank=0, world=1, micro_batch=batch, device=CPU, workers=workers, strict=False
    )
    return _steady_rate(stream, _steps_count, limit, workers, 2)


def pillow_only(uri: str, size: int, workers: int, batch: int, limit: int) -> tuple[float, float]:
    fast, image_module._simplejpeg = image_module._simplejpeg, None  # forked workers inherit the switch
    try:
        return folder_like(uri, size, workers, batch, limit)
    finally:
        image_module._simplejpeg = fast


def webdataset_library(uri: str, size: int, workers: int, batch: int, limit: int) -> tuple[float, float]:
    """The webdataset package reading the same shards (its tar pipeline and shard split), vitkit's decode."""
    import webdataset as wds

    directory = Path(uri.removeprefix("wds:"))
    urls = [str(p) for p in sorted(directory.glob("train-*.tar"))]
    pipeline = (
        wds.WebDataset(urls, shardshuffle=False, repeat=True, empty_check=False, nodesplitter=wds.split_by_node)
        .map(lambda s: (image_module.decode_image(s["jpg"], 3, size=size), int(s["cls"])))
        .batched(
            batch, collation_fn=lambda items: (torch.stack([i for i, _ in items]), torch.tensor([c for _, c in items]))
        )
    )
    loader = torch.utils.data.DataLoader(pipeline, batch_size=None, num_workers=workers)
    return _steady_rate(loader, lambda b: len(b[1]), limit, workers, 2)


def datasets_library(uri: str, size: int, workers: int, batch: int, limit: int) -> tuple[float, float]:
    """The `datasets` package reading the same Arrow files: `ds[i]` decodes the Image feature with Pillow
    (full size, no DCT-domain scaling), then vitkit's resize and crop."""
    import datasets
    import numpy as np

    rows = datasets.load_from_disk(uri.removeprefix("hf:"))

    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(rows)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            row = rows[i]
            pixels = np.asarray(image_module._resize_center_crop(row["image"].convert("RGB"), size))
            return torch.from_numpy(pixels.transpose(2, 0, 1).copy()), row["label"]

    sampler = torch.utils.data.RandomSampler(
        Rows(), replacement=True, num_samples=10**9, generator=torch.Generator().manual_seed(1)
    )
    loader = torch.utils.data.DataLoader(
        Rows(), batch_size=batch, sampler=sampler, num_workers=workers, prefetch_factor=4 if workers else None
    )
    return _steady_rate(loader, lambda b: len(b[1]), limit, workers, 4)


PATHS: dict[str, tuple[str, Callable[..., tuple[float, float]]]] = {
    "folder": ("folder", folder_like),
    "wds": ("wds", shards),
    "hf": ("hf", folder_like),
    "folder/pillow": ("folder", pillow_only),
    "wds/webdataset-lib": ("wds", webdataset_library),
    "hf/datasets-lib": ("hf", datasets_library),
}


def header_rates(directory: Path) -> tuple[float, float]:
    """Members/s listed by vitkit's tar reader and by the standard library's tarfile (webdataset's reader)."""
    import tarfile

    from vitkit.data.tarshards import tar_members

    paths = sorted(directory.glob("train-*.tar"))
    start = time.perf_counter()
    ours = 0
    for path in paths:
        with open(path, "rb") as handle:
            ours += sum(1 for _ in tar_members(handle))
    middle = time.perf_counter()
    theirs = 0
    for path in paths:
        with tarfile.open(path) as tar:
            theirs += sum(1 for m in tar if m.isfile())
    end = time.perf_counter()
    assert ours == theirs
    return ours / (middle - start), theirs / (end - middle)


def augment_rate(size: int, batch: int, repeats: int) -> float:
    """The recipe's augmentation (64 px: small-64px's; 224 px: paper-pretrain's) on uint8 batches, this process."""
    info = SourceInfo(uri="folder:x", num_train=1000, num_classes=10, image_size=size, channels=3, in_memory=False)
    config = get_recipe("small-64px" if size <= 64 else "paper-pretrain", info)
    images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8)
    labels = torch.randint(0, 10, (batch,))
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for _ in range(repeats):
        train_transform(images, labels, 10, size, config.data.mean, config.data.std, 3, config.augment, generator)
    return repeats * batch / (time.perf_counter() - start)


# ------------------------------------------------------------------------------ listing a large folder
def listing(folder: Path, rounds: int) -> dict[str, float]:
    """Seconds to list a large folder (vitkit's os.scandir scan vs the pathlib rglob + is_file scan it
    replaced, alternating), and to describe it and open its training split (nothing decoded)."""
    from vitkit.data.images import IMAGE_EXTENSIONS
    from vitkit.data.listing import class_folders, scan_folder
    from vitkit.data.sources import describe

    root = folder / "train" if (folder / "train").is_dir() else folder
    names = class_folders(root)

    def pathlib_scan() -> int:  # the scan before: Path objects and one stat per file
        return sum(
            len(sorted(p for p in (root / n).rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()))
            for n in names
        )

    times: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, run in (
            ("scandir", lambda: len(scan_folder(root, names)[0])),
            ("pathlib", pathlib_scan),
            ("describe", lambda: describe(f"folder:{folder}").num_train),
            ("load_split", lambda: len(load_split(f"folder:{folder}", "train", image_size=64))),
        ):
            start = time.perf_counter()
            count = run()
            times.setdefault(name, []).append(time.perf_counter() - start)
    median = {k: statistics.median(v) for k, v in times.items()}
    ratio = statistics.median(b / a for a, b in zip(times["scandir"], times["pathlib"]))
    print(
        f"{folder}: {count:,} files; listing {median['scandir']:.2f} s (pathlib scan {median['pathlib']:.2f} s, "
        f"{ratio:.1f}x slower); describe {median['describe']:.2f} s; load_split(train, 64 px) "
        f"{median['load_split']:.2f} s, {load_split(f'folder:{folder}', 'train', image_size=64).access}"
    )
    return {**median, "pathlib_over_scandir": ratio, "files": count}


# ------------------------------------------------------------------------------ the run
def measure(
    sets: dict[str, dict[str, str]],
    sizes: list[int],
    workers: list[int],
    paths: list[str],
    rounds: int,
    batch: int,
    limit: int,
) -> dict[str, list[float]]:
    rates: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, where in sets.items():
            for size in sizes:
                for n in workers:
                    for path in paths:  # alternated within a round: folder, wds, hf, ... at the same load
                        kind, run = PATHS[path]
                        wall, cpu = run(f"{kind}:{where[kind]}", size, n, batch, limit)
                        rates.setdefault(f"{name}/{size}/{n}/{path}", []).append(wall)
                        if n == 0:
                            rates.setdefault(f"{name}/{size}/cpu/{path}", []).append(cpu)
                rates.setdefault(f"augment/{size}", []).append(augment_rate(size, batch, 4))
            ours, theirs = header_rates(Path(where["wds"]))
            rates.setdefault(f"{name}/headers/vitkit", []).append(ours)
            rates.setdefault(f"{name}/headers/tarfile", []).append(theirs)
    return rates


def report(
    rates: dict[str, list[float]], sets: list[str], sizes: list[int], workers: list[int], paths: list[str]
) -> dict[str, Any]:
    median = {k: statistics.median(v) for k, v in rates.items()}
    summary: dict[str, Any] = {}
    columns = "".join(f"{f'{n} workers' if n != 1 else '1 worker':>11}" for n in workers)
    for name in sets:
        for size in sizes:
            print(
                f"\n{name} at {size} px: decoded img/s per worker (CPU time, 0 workers), its ratio to folder "
                f"(within rounds), workers for {TARGET:,} img/s; then wall-clock img/s by DataLoader workers"
            )
            print(f"{'path':<20}{'per worker':>11}{'ratio':>7}{'needed':>7}{columns}")
            for path in paths:
                cpu = rates.get(f"{name}/{size}/cpu/{path}")
                per_worker = statistics.median(cpu) if cpu else median[f"{name}/{size}/{workers[0]}/{path}"]
                base = rates.get(f"{name}/{size}/cpu/folder") or rates[f"{name}/{size}/{workers[0]}/folder"]
                ratio = statistics.median(
                    a / b for a, b in zip(cpu or rates[f"{name}/{size}/{workers[0]}/{path}"], base)
                )
                row = [median[f"{name}/{size}/{n}/{path}"] for n in workers]
                needed = math.ceil(TARGET / per_worker)
                summary[f"{name}/{size}/{path}"] = {
                    "per_worker": per_worker,
                    "ratio_to_folder": ratio,
                    "workers_needed": needed,
                    "wall_by_workers": dict(zip(workers, row)),
                }
                print(f"{path:<20}{per_worker:>11.0f}{ratio:>7.2f}{needed:>7}" + "".join(f"{r:>11.0f}" for r in row))
    for size in sizes:
        print(f"augmentation at {size} px, batched in this process (wall): {median[f'augment/{size}']:.0f} img/s")
        summary[f"augment/{size}"] = median[f"augment/{size}"]
    for name in sets:
        ratio = statistics.median(
            a / b for a, b in zip(rates[f"{name}/headers/vitkit"], rates[f"{name}/headers/tarfile"])
        )
        print(
            f"{name} tar headers: vitkit {median[f'{name}/headers/vitkit']:.0f} members/s, tarfile "
            f"{median[f'{name}/headers/tarfile']:.0f} members/s ({ratio:.1f}x)"
        )
        summary[f"{name}/headers"] = {
            "vitkit": median[f"{name}/headers/vitkit"],
            "tarfile": median[f"{name}/headers/tarfile"],
            "ratio": ratio,
        }
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--data", default="caltech,cifar", help="caltech (caltech101-10/train), cifar (cifar10-jpg/train)"
    )
    parser.add_argument("--cifar-count", type=int, default=3000, help="cifar10-jpg files used (every k-th)")
    parser.add_argument("--sizes", default="64,224", help="decode sides")
    parser.add_argument(
        "--workers",
        default="0,1,2",
        help="DataLoader worker counts (0: decoded in this process, the per-worker figure)",
    )
    parser.add_argument("--paths", default="folder,wds,hf,folder/pillow,wds/webdataset-lib", help="rows to measure")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=16, help="batches timed per measurement")
    parser.add_argument("--work", default="/tmp/vitkit-data-bench", help="where the three copies are prepared")
    parser.add_argument("--shared", default=str(SHARED), help="the shared data directory")
    parser.add_argument("--listing", default="", help="instead: time listing this (large) folder, e.g. 200k files")
    parser.add_argument("--json", action="store_true", help="also print one JSON object as the last line")
    parser.add_argument("--no-record", action="store_true", help="do not append a row to results/data_pipeline.jsonl")
    args = parser.parse_args(argv)
    if args.listing:
        result = listing(Path(args.listing), args.rounds)
        if args.json:
            print(json.dumps(result))
        return 0
    shared, work = Path(args.shared), Path(args.work)
    sources = {
        "caltech": (shared / "caltech101-10" / "train", 1),
        "cifar": (shared / "cifar10-jpg" / "train", max(1, 50_000 // args.cifar_count)),
    }
    names = [n for n in args.data.split(",") if n]
    missing = [n for n in names if not sources[n][0].is_dir()]
    if missing:
        raise SystemExit(f"{', '.join(str(sources[n][0]) for n in missing)} not found (see --shared)")
    torch.set_num_threads(1)  # the main process only collects batches; the workers do the work
    sets = {n: _prepare(n, *sources[n], work) for n in names}
    sizes, workers = [int(s) for s in args.sizes.split(",")], [int(w) for w in args.workers.split(",")]
    paths = [p for p in args.paths.split(",") if p]
    rates = measure(sets, sizes, workers, paths, args.rounds, args.batch_size, args.batches)
    counts = ", ".join(f"{n}: {(work / n / 'done').read_text().strip()}" for n in names)
    print(
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; simplejpeg "
        f"{'installed' if image_module._simplejpeg else 'absent'}; batch {args.batch_size}, {args.batches} batches, "
        f"medians of {args.rounds} rounds; {counts}"
    )
    summary = report(rates, names, sizes, workers, paths)
    if not args.no_record:
        append_row(RESULTS, {"data": names, "batch_size": args.batch_size, "summary": summary})
    if args.json:
        print(json.dumps({"summary": summary, "rounds": rates}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
