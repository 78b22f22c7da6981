"""Data verbs: `vitkit shard` (any source as webdataset tar shards + dataset.json, for wds:DIR)."""

from __future__ import annotations

import argparse
import logging
import sys

from vitkit.cli.flags import add_column_flags, bounded_int, emit
from vitkit.train.config import MAX_SEED


def add_shard(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("shard", help="write a data source as webdataset tar shards + dataset.json (for wds:DIR)")
    parser.add_argument(
        "source", help="data source URI (folder:DIR, mnist:DIR, cifar10:DIR, npz:FILE, hf:DIR, digits, ...)"
    )
    parser.add_argument("--out", required=True, help="directory for {split}-NNNNNN.tar and dataset.json (empty or new)")
    parser.add_argument(
        "--samples-per-shard", type=bounded_int(1), required=True, help="samples in each shard (the last: fewer)"
    )
    parser.add_argument(
        "--max-side",
        type=bounded_int(1),
        default=None,
        help="downscale images whose longer side is larger (re-encoded); default: keep every file's original bytes",
    )
    parser.add_argument(
        "--seed", type=bounded_int(0, MAX_SEED), default=0, help="seed of the fixed order the samples are written in"
    )
    parser.add_argument("--workers", type=bounded_int(1), default=None, help="encoding threads (default: min(8, CPUs))")
    add_column_flags(parser)
    parser.add_argument(
        "--no-labels",
        action="store_true",
        help="write the images alone, without labels: a source such as a folder of photos without class "
        "sub-folders, for vitkit pretrain-mpp",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run_shard)


def run_shard(args: argparse.Namespace) -> int:
    from vitkit.data.images import NoLabelsError
    from vitkit.data.shard import write_shards

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    try:
        result = write_shards(
            args.source,
            args.out,
            args.samples_per_shard,
            max_side=args.max_side,
            seed=args.seed,
            workers=args.workers,
            image_column=args.image_column,
            label_column=args.label_column,
            labelled=not args.no_labels,
        )
    except NoLabelsError as error:
        raise ValueError(f"{error}; vitkit shard --no-labels writes it as shards without labels") from error
    lines = [
        f"{split}: {counts['samples']} samples in {counts['shards']} shards"
        + (f", {counts['skipped']} left out (each named above)" if counts["skipped"] else "")
        for split, counts in result["splits"].items()
    ]
    follow = f"train with: vitkit train --data wds:{result['out']}"
    if args.no_labels or result["num_classes"] < 2:  # a classifier needs 2 classes; masked patch prediction none
        one = "" if args.no_labels else "1 class, which a classifier cannot learn from; "
        follow = f"{one}pre-train with: vitkit pretrain-mpp --data wds:{result['out']}"
    return emit(args, result, [*lines, follow])
