"""The paper's self-supervision experiment (Sec. 4.6, App. B.1.2) is now the `mpp` study of `vitkit reproduce`.

    .venv/bin/vitkit reproduce mpp --data fashion-mnist:../shared/data/fashion-mnist --budget-minutes 30 \
        --seeds 2 --threads 1 --out runs/reproduce/mpp-fashion

runs MPP pre-training (labels unused), supervised pre-training and the same fine-tuning on a labelled 2% from
the MPP encoder, the supervised model and from scratch, each arm a run directory (a killed study resumes),
and writes report.md / results.json / mpp.png beside the paper's numbers (src/vitkit/reproduce/mpp.py).
This script runs that study with the same flags.

What the earlier standalone setting of this script measured is in docs/experiments/masked-patch-prediction.md
(rows in results/mpp_transfer.jsonl).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from vitkit.reproduce import StudyRequest, reproduce


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="fashion-mnist:../shared/data/fashion-mnist")
    parser.add_argument("--out", default="runs/reproduce/mpp-fashion")
    parser.add_argument("--budget-minutes", type=float, default=30.0)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    summary = reproduce(
        "mpp",
        StudyRequest(
            data=args.data, budget_minutes=args.budget_minutes, seeds=args.seeds, out=args.out, threads=args.threads
        ),
    )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
