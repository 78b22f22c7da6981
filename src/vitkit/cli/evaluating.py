"""`vitkit eval`, `fewshot`, `predict`, `embed` and `inspect`.

Each takes a checkpoint or run directory in and gives numbers and files out.
"""

from __future__ import annotations

import argparse
import json
import sys

from vitkit.cli.flags import add_column_flags, add_max_pixels, add_run_flags, bounded_int, columns_of, emit, shown


def add_eval(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("eval", help="top-1/top-5, per-class accuracy and confusion matrix of a checkpoint or run")
    parser.add_argument("checkpoint", help="checkpoint (any format) or run directory (its final/newest checkpoint)")
    parser.add_argument("--data", required=True, help="data source URI, e.g. digits, fashion-mnist:DIR, folder:DIR")
    parser.add_argument("--split", choices=("train", "val", "test"), default="test", help="split to evaluate")
    add_run_flags(parser)
    parser.add_argument(
        "--max-images", type=bounded_int(1), default=None, help="evaluate a fixed random subset of this many images"
    )
    parser.add_argument(
        "--flip-views",
        action="store_true",
        help="average the logits of each image and its mirror image (only where a mirror keeps the label)",
    )
    parser.add_argument(
        "--out", default=None, help="folder for eval_SPLIT.json + confusion_SPLIT.png (default RUN/eval for a run)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_column_flags(parser)
    parser.set_defaults(handler=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from vitkit.data.sources import check_mirror_views
    from vitkit.eval.accuracy import AccuracyConfig
    from vitkit.eval.commands import eval_command
    from vitkit.eval.evaluator import one_view_note

    check_mirror_views(args.data, args.flip_views)
    config = AccuracyConfig(
        img_size=args.img_size, batch_size=args.batch_size, device=args.device, flip_views=args.flip_views
    )
    report = eval_command(args.checkpoint, args.data, args.split, config, args.out, args.max_images, columns_of(args))
    k = next(key for key in report if key.startswith("top") and key[3:].isdigit() and key != "top1")
    lines = [
        f"model {report['checkpoint']}",
        f"{args.data} {args.split}: {report['num_images']} images at {report['img_size']} px{_held(report)}",
        f"top-1 {100 * report['top1']:.2f}%   top-{k[3:]} {100 * report[k]:.2f}%{one_view_note(report)}",
        *(
            f"  {name:<24} {'-' if value is None else f'{100 * value:.1f}%'}"
            for name, value in report["per_class"].items()
        ),
    ]
    if "out" in report:
        written = [f"{report['out']}/{name}" for name in report["files"]]  # no confusion plot above its limit
        lines.append(f"wrote {' and '.join(written)}")
    else:  # a checkpoint file, not a run directory: no default folder
        lines.append(f"wrote nothing (--out DIR keeps eval_{args.split}.json and its confusion matrix)")
    return emit(args, report, lines)


def _held(report: dict) -> str:
    """Where the scored images are a hold-out of a source without a test split, which (and what scores the rest)."""
    origin = report.get("origin", "")
    if report["split"] != "test" or "hold-out of" not in origin:
        return ""
    return f" ({origin}; --split train scores the others)"


def add_fewshot(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("fewshot", help="few-shot linear accuracy (Sec. 4.1): closed-form ridge on frozen features")
    parser.add_argument("checkpoint", help="checkpoint (any format) or run directory")
    parser.add_argument(
        "--data", required=True, help="data source URI (its train split gives the shots, test the accuracy)"
    )
    parser.add_argument("--shots", default="1,5,10,25", help="comma-separated k images per class")
    parser.add_argument(
        "--seeds", type=bounded_int(1), default=3, help="repetitions with different shots (mean +- std)"
    )
    parser.add_argument(
        "--layer", default="features", help="representation: features (what the head reads), y, pre_logits"
    )
    parser.add_argument(
        "--max-test", type=bounded_int(1), default=None, help="evaluate on a fixed random subset of the test split"
    )
    add_run_flags(parser)
    parser.add_argument("--out", default=None, help="folder for fewshot.json")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_column_flags(parser)
    parser.set_defaults(handler=run_fewshot)


def run_fewshot(args: argparse.Namespace) -> int:
    from vitkit.eval.commands import fewshot_command
    from vitkit.eval.fewshot import FewShotConfig

    try:
        shots = tuple(int(k) for k in args.shots.split(","))  # "1,,5" names no count between its commas
    except ValueError:
        shots = ()
    if not shots or min(shots) < 1:
        raise ValueError(f"--shots must be comma-separated integers of 1 or more, got {args.shots!r}")
    config = FewShotConfig(
        shots=shots,
        seeds=args.seeds,
        layer=args.layer,
        img_size=args.img_size,
        batch_size=args.batch_size,
        max_test=args.max_test,
        device=args.device,
    )
    report = fewshot_command(args.checkpoint, args.data, config, args.out, columns_of(args))
    return emit(
        args,
        report,
        [
            f"model {report['checkpoint']}",
            f"{args.data}: {report['num_classes']} classes, {report['num_test']} test images, layer {report['layer']}",
            *(
                f"  {k:>3}-shot: {100 * entry['mean']:.2f}% +- {100 * entry['std']:.2f}  ({len(entry['runs'])} seeds)"
                for k, entry in report["shots"].items()
            ),
        ],
    )


def add_predict(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("predict", help="top-k classes with probabilities for image files or folders")
    parser.add_argument("checkpoint", help="checkpoint (any format) or run directory")
    parser.add_argument("images", nargs="+", help="image files (JPEG/PNG/..., any mode, up to --max-pixels) or folders")
    parser.add_argument("--top-k", type=bounded_int(1), default=5, help="classes per image")
    add_max_pixels(parser)
    add_run_flags(parser, batch_size=32)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run_predict)


def run_predict(args: argparse.Namespace) -> int:
    from vitkit.eval.commands import predict_command
    from vitkit.eval.predict import PredictConfig

    config = PredictConfig(
        top_k=args.top_k,
        img_size=args.img_size,
        batch_size=args.batch_size,
        device=args.device,
        max_pixels=args.max_pixels,
    )
    results = predict_command(args.checkpoint, args.images, config)
    failed = [r for r in results if "error" in r]
    for entry in failed:
        print(f"vitkit predict: error: {entry['error']}", file=sys.stderr)
    if not results:
        print("vitkit predict: error: no image files found", file=sys.stderr)
    if args.json:
        print(json.dumps({"results": results, "failed": len(failed)}))
    else:
        for entry in results:
            if "predictions" in entry:
                top = ", ".join(f"{p['class']} {100 * p['probability']:.1f}%" for p in entry["predictions"])
                print(shown(f"{entry['file']}: {top}"))
    return 2 if not results else 1 if failed else 0


def add_embed(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("embed", help="save the representation of every image of a split (.npy or .safetensors)")
    parser.add_argument("checkpoint", help="checkpoint (any format) or run directory")
    parser.add_argument("--data", required=True, help="data source URI")
    parser.add_argument("--split", choices=("train", "val", "test"), default="test", help="split to embed")
    parser.add_argument(
        "--layer", default="pre_logits", help="y, pre_logits, features, logits, encoder_norm or blockNN (tokens)"
    )
    parser.add_argument("--out", required=True, help="FILE.npy (+ FILE.labels.npy, FILE.json) or FILE.safetensors")
    parser.add_argument("--force", action="store_true", help="replace the files if they exist")
    add_run_flags(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_column_flags(parser)
    parser.set_defaults(handler=run_embed)


def run_embed(args: argparse.Namespace) -> int:
    from vitkit.eval.commands import embed_command

    report = embed_command(
        args.checkpoint,
        args.data,
        args.split,
        args.layer,
        args.out,
        img_size=args.img_size,
        batch_size=args.batch_size,
        device=args.device,
        columns=columns_of(args),
        force=args.force,
    )
    report.pop("class_names")
    return emit(args, report, [f"wrote {', '.join(report['files'])}: {report['shape']} ({args.layer})"])


def add_inspect(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("inspect", help="the paper's inspection figures (Fig. 6, Fig. 7) as PNG + JSON")
    parser.add_argument("checkpoint", help="checkpoint (any format) or run directory")
    parser.add_argument("--images", nargs="*", default=[], help="image files for the attention figures")
    parser.add_argument("--data", default=None, help="data source URI: images for the attention figures")
    parser.add_argument("--split", choices=("train", "val", "test"), default="test", help="split of --data")
    parser.add_argument("--num-images", type=bounded_int(1), default=32, help="images drawn from --data")
    parser.add_argument("--num-overlays", type=bounded_int(1), default=8, help="images shown in the rollout figure")
    parser.add_argument("--components", type=int, default=28, help="filter principal components shown")
    parser.add_argument("--no-figures", action="store_true", help="numbers (inspect.json) only, no PNG files")
    add_run_flags(parser, batch_size=8)
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--force", action="store_true", help="replace figures in a folder without inspect.json")
    parser.add_argument("--json", action="store_true", help="print one JSON object (summary numbers)")
    add_column_flags(parser)
    parser.set_defaults(handler=run_inspect)


def run_inspect(args: argparse.Namespace) -> int:
    from vitkit.inspect.report import InspectConfig, inspect_command, summary

    config = InspectConfig(
        num_components=args.components,
        num_overlays=args.num_overlays,
        batch_size=args.batch_size,
        img_size=args.img_size,
        device=args.device,
        draw=not args.no_figures,
    )
    report = summary(
        inspect_command(
            args.checkpoint,
            args.out,
            config,
            image_files=args.images,
            data=args.data,
            split=args.split,
            num_images=args.num_images,
            columns=columns_of(args),
            force=args.force,
        )
    )
    return emit(args, report, report["lines"])
