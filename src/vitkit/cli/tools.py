"""`vitkit models`, `convert`, `export-onnx` and `bench`."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from vitkit.cli.flags import add_surgery_flags, bounded_int, emit, finite_float
from vitkit.models.configs import MAX_IMG

# what names a file, never a directory format's folder
FILE_SUFFIXES = (".npz", ".npy", ".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".onnx", ".h5", ".msgpack")


def add_models(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("models", help="list the model presets (Table 1) with parameters and GFLOPs")
    parser.add_argument(
        "--img-size", type=bounded_int(1, MAX_IMG), default=None, help="resolution for GFLOPs (default: each preset's)"
    )
    parser.add_argument("--num-classes", type=int, default=1000, help="head size for the parameter count")
    parser.add_argument("--filter", default="", help="only names containing this text")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run_models)


def run_models(args: argparse.Namespace) -> int:
    import torch

    from vitkit.models import build_model, preset_config
    from vitkit.models.configs import HybridConfig, ResNetConfig, image_size
    from vitkit.models.flops import model_flops

    rows = []
    for name in _list_models():
        if args.filter not in name:
            continue
        config = preset_config(name, num_classes=args.num_classes, img_size=args.img_size)
        with torch.device("meta"):
            params = sum(p.numel() for p in build_model(config).parameters())
        vit = config.vit if isinstance(config, HybridConfig) else config
        layers = "-" if isinstance(config, ResNetConfig) else vit.depth
        row = {
            "name": name,
            "layers": layers,
            "hidden": "-" if isinstance(config, ResNetConfig) else vit.hidden_size,
            "mlp": "-" if isinstance(config, ResNetConfig) else vit.mlp_dim,
            "heads": "-" if isinstance(config, ResNetConfig) else vit.num_heads,
            "params": params,
            "img_size": image_size(config),
            "gflops": round(model_flops(config) / 1e9, 2),
        }
        rows.append(row)
    if not rows:
        raise ValueError(f"no model name contains {args.filter!r}; vitkit models lists all")
    header = f"{'name':<14}{'layers':>7}{'hidden':>8}{'mlp':>7}{'heads':>6}{'params':>14}{'img':>6}{'GFLOPs':>9}"
    return emit(
        args,
        {"models": rows},
        [
            header,
            *(
                f"{r['name']:<14}{r['layers']!s:>7}{r['hidden']!s:>8}{r['mlp']!s:>7}{r['heads']!s:>6}"
                f"{r['params']:>14,}{r['img_size']:>6}{r['gflops']:>9.2f}"
                for r in rows
            ),
        ],
    )


def _list_models() -> list[str]:
    from vitkit.models import list_models

    return list_models()


def add_convert(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "convert", help="convert a checkpoint (vitkit, official .npz, timm, HF) to vitkit, timm, hf or official"
    )
    parser.add_argument("src", help="checkpoint directory or file, any supported format (detected)")
    parser.add_argument("dst", help="output directory (an .npz file for --to official)")
    parser.add_argument("--to", choices=("vitkit", "timm", "hf", "official"), default="vitkit", help="target format")
    parser.add_argument("--force", action="store_true", help="replace what dst already holds")
    add_surgery_flags(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run_convert)


def _read_checkpoint(args: argparse.Namespace) -> Any:
    """The checkpoint `args.src` names, a run directory included (its final model), with the surgery flags."""
    from vitkit.runs import open_checkpoint

    gb = args.max_model_gb
    if gb is not None and not gb >= 0:  # NaN too
        raise ValueError(f"--max-model-gb must be a number of GB >= 0 (inf: no limit), got {gb}")
    max_bytes = None if gb is None else gb * 1e9  # inf stays inf: no limit
    return open_checkpoint(
        args.src,
        img_size=args.img_size,
        num_classes=args.num_classes,
        pre_logits=args.pre_logits,
        resample=args.resample,
        max_bytes=max_bytes,
    )


def _refuse_overlap(src: str, dst: Path) -> None:
    """Refuse (even with --force) a destination that is the source, holds it or lies inside it (a run directory's
    own files aside: only its checkpoints/ are read), or lies inside any run's checkpoints/: replacing it
    would destroy the model being read, or a run's export that every verb reads."""
    from vitkit.runs import CHECKPOINTS, CONFIG, FINAL, LATEST, is_run_dir

    source, target = Path(src).resolve(), dst.resolve()
    guarded = source / CHECKPOINTS if is_run_dir(source) else source
    if target in (source, guarded, *source.parents) or guarded in target.parents:
        raise ValueError(f"{dst} is, holds or lies inside the checkpoint being read ({src}); write it elsewhere")
    for parent in target.parents:  # a run's: its config beside, or its LATEST or final inside (any folder is not)
        run = parent.parent
        if parent.name == CHECKPOINTS and any(p.exists() for p in (run / CONFIG, parent / LATEST, parent / FINAL)):
            raise ValueError(f"{dst} lies inside the checkpoints of the training run {run}; write it elsewhere")


def run_convert(args: argparse.Namespace) -> int:
    from vitkit.atomic import remove_torn_beside
    from vitkit.checkpoints import official, write
    from vitkit.runs import is_run_dir

    if not args.dst.strip():
        raise ValueError("the destination is empty: name the file or directory to write")
    dst = official.npz_path(args.dst) if args.to == "official" else Path(args.dst)  # the file written: NAME.npz
    if is_run_dir(dst):  # even with --force: the model would sit beside the run's checkpoints, and verbs read those
        raise ValueError(f"{dst} is a training run; write the converted model to another destination")
    _refuse_overlap(args.src, dst)
    remove_torn_beside(dst)  # what a killed write of dst left
    if args.to != "official" and dst.exists() and not dst.is_dir():  # --force would not help
        raise ValueError(f"{dst} is a file; --to {args.to} writes a directory: choose another destination")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())) and not args.force:
        what = "is not empty" if dst.is_dir() else "is a file"
        raise ValueError(f"{dst} already exists and {what}; choose another destination or pass --force")
    if args.to != "official" and not dst.exists() and dst.suffix.lower() in FILE_SUFFIXES:
        raise ValueError(
            f"{dst} is named as a file ({dst.suffix}); --to {args.to} writes a directory (config.json and "
            "model.safetensors): give a directory name, or --to official for an .npz"
        )
    checkpoint = _read_checkpoint(args)
    created = not dst.exists()
    try:
        out = write(checkpoint, dst, to=args.to)
    except BaseException:
        if created and dst.exists():  # a failed write leaves nothing it made
            if dst.is_dir():
                shutil.rmtree(dst)
            else:
                dst.unlink()
        raise
    params = sum(p.numel() for p in checkpoint.model.parameters())
    summary = {
        "src": args.src,
        "format": checkpoint.provenance.get("format"),
        "dst": str(out),
        "to": args.to,
        "params": params,
    }
    return emit(args, summary, [f"wrote {out} ({args.to}, {params:,} parameters) from {args.src}"])


def add_export_onnx(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("export-onnx", help="export a checkpoint to ONNX (dynamic batch), checked with onnxruntime")
    parser.add_argument("src", help="checkpoint directory or file, any supported format")
    parser.add_argument("out", help="output .onnx file")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset (>= 17)")
    parser.add_argument("--force", action="store_true", help="replace the file if it exists")
    add_surgery_flags(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run_export_onnx)


def run_export_onnx(args: argparse.Namespace) -> int:
    from vitkit.atomic import remove_torn_beside
    from vitkit.checkpoints.onnx_export import verified_export

    if Path(args.out).is_dir():
        raise ValueError(f"{args.out} is a directory; name the .onnx file to write")
    if not Path(args.out).parent.is_dir():
        raise ValueError(f"{Path(args.out).parent} does not exist; make it, or name a .onnx file elsewhere")
    _refuse_overlap(args.src, Path(args.out))
    remove_torn_beside(args.out)  # what a killed export left
    if Path(args.out).exists() and not args.force:
        raise ValueError(f"{args.out} already exists; choose another file or pass --force to replace it")
    checkpoint = _read_checkpoint(args)
    out, diff = verified_export(checkpoint.model, args.out, opset=args.opset)
    check = (
        f"onnxruntime vs PyTorch max |diff| = {diff:.3g}"
        if diff is not None
        else "onnxruntime not installed: not checked"
    )
    return emit(
        args,
        {"out": str(out), "opset": args.opset, "max_abs_diff": diff},
        [f"wrote {out} (opset {args.opset}, dynamic batch); {check}"],
    )


def add_bench(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="measure inference and training images/s, FLOP/s and MFU of a preset")
    parser.add_argument("--model", default="vit_ti16", help="preset name (vitkit models lists them)")
    parser.add_argument(
        "--img-size", type=bounded_int(1, MAX_IMG), default=None, help="resolution (default: the preset's)"
    )
    parser.add_argument("--num-classes", type=int, default=1000, help="head size")
    parser.add_argument("--batch-size", type=int, default=32, help="images per step")
    parser.add_argument(
        "--precision",
        choices=("auto", "fp32", "bf16"),
        default="auto",
        help="fp32, bf16 autocast, or auto: bf16 where the device has native bf16 matmuls",
    )
    parser.add_argument(
        "--attn-impl",
        choices=("auto", "sdpa", "explicit"),
        default=None,
        help="attention path (default: the preset's, auto)",
    )
    parser.add_argument(
        "--compile", action="store_true", help="torch.compile the model (compile time reported as warm-up)"
    )
    parser.add_argument("--mode", choices=("both", "inference", "training"), default="both", help="what to measure")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per mode")
    parser.add_argument("--steps", type=int, default=5, help="steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (the median is reported)")
    parser.add_argument(
        "--peak-tflops", type=finite_float, default=None, help="peak for MFU (default: measure a large matmul)"
    )
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="model-config field, e.g. --set depth=6 --set patch_size=4 (repeatable)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run_bench)


def _bench_overrides(model: str, pairs: list[str]) -> dict[str, Any]:
    """`--set FIELD=VALUE` (or model.FIELD=VALUE) strings, type-checked against the preset's model config."""
    from vitkit.models import preset_config
    from vitkit.overrides import parse_fields, split_item

    items = {}
    for pair in pairs:
        key, text = split_item(pair, "field=value", "depth=6")
        items[key.removeprefix("model.")] = text
    return parse_fields(preset_config(model), items, "model")


def run_bench(args: argparse.Namespace) -> int:
    from vitkit.bench.throughput import BenchConfig, format_table, run_benchmark

    modes = ("inference", "training") if args.mode == "both" else (args.mode,)
    config = BenchConfig(
        model=args.model,
        img_size=args.img_size,
        num_classes=args.num_classes,
        batch_size=args.batch_size,
        precision=args.precision,
        attn_impl=args.attn_impl,
        compile=args.compile,
        modes=modes,
        warmup=args.warmup,
        steps=args.steps,
        repeats=args.repeats,
        peak_tflops=args.peak_tflops,
        device=args.device,
        threads=args.threads,
        overrides=_bench_overrides(args.model, args.set),
    )
    result = run_benchmark(config)
    return emit(args, result, format_table(result).splitlines())
