"""`vitkit reproduce STUDY --data URI`: one of the paper's experiments as a study of runs, with a report."""

from __future__ import annotations

import argparse
import logging
import sys

from vitkit.cli.flags import emit, finite_float

STUDIES = ("data-size", "compute", "posemb", "head", "shape", "mpp", "attention", "speed", "transfer")
TRANSFER_ONLY = ("pretrain_data", "init", "families")  # flags of the transfer study alone


def add_reproduce(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "reproduce",
        help="run one of the paper's experiments as a study and report it beside the paper's numbers",
        description="Studies: data-size (Sec. 4.3), compute (Sec. 4.4), posemb (App. D.4), head (App. D.3), "
        "shape (App. D.2), mpp (Sec. 4.6), attention (Sec. 4.5), speed (App. D.5), transfer (Sec. 3.2, 4.2: "
        "pre-train, then fine-tune, against the target alone).  Every arm is a "
        "run directory under --out: re-running the same command resumes a killed study and reuses "
        "finished arms.",
    )
    parser.add_argument("study", choices=STUDIES)
    parser.add_argument(
        "--data", default="digits", help="data source URI (digits, fashion-mnist:DIR, cifar10:DIR, ...)"
    )
    parser.add_argument(
        "--budget-minutes",
        type=finite_float,
        default=30.0,
        help="wall-clock budget of the whole study; model sizes and arm lengths scale to it",
    )
    parser.add_argument(
        "--seeds", type=int, default=1, help="repeat every arm with seeds 0..S-1 (the report shows the spread)"
    )
    parser.add_argument("--out", default=None, help="study directory (default runs/reproduce/<study>-<data>)")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads per arm (0 = torch's default; 1 is fastest for small models on a busy CPU)",
    )
    parser.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--pretrain-data",
        default="",
        metavar="URI",
        help="transfer: the source to pre-train on (default: the target's own training split, "
        "which tests the mechanics only)",
    )
    parser.add_argument(
        "--init",
        default="",
        metavar="RUN",
        help="transfer: a pre-trained ViT checkpoint or run directory instead of pre-training one",
    )
    parser.add_argument(
        "--families",
        action="store_true",
        help="transfer: also pre-train and fine-tune the BiT ResNet and the hybrid of similar FLOPs",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run_reproduce)


def run_reproduce(args: argparse.Namespace) -> int:
    from vitkit.reproduce import StudyRequest, reproduce
    from vitkit.reproduce.arms import StudyInterrupted

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    given = [f"--{key.replace('_', '-')}" for key in TRANSFER_ONLY if getattr(args, key)]
    if given and args.study != "transfer":
        raise ValueError(f"{', '.join(given)}: only the transfer study takes these flags")
    name = args.data.split(":")[0]
    out = args.out or f"runs/reproduce/{args.study}-{name}"
    request = StudyRequest(
        data=args.data,
        budget_minutes=args.budget_minutes,
        seeds=args.seeds,
        out=out,
        threads=args.threads,
        device=args.device,
        pretrain_data=args.pretrain_data,
        init=args.init,
        families=args.families,
    )
    try:
        summary = reproduce(args.study, request)
    except StudyInterrupted as stop:
        print(f"vitkit reproduce: {stop}", file=sys.stderr)
        return 128 + stop.signum if stop.signum else 130
    lines = [f"{c['verdict']:<30} {c['claim']}" for c in summary["claims"]]
    lines.append(f"report: {summary['report']} ({summary['arm_minutes']:.1f} arm-minutes)")
    return emit(args, summary, lines)
