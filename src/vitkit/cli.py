"""The `vitkit` command: flags -> the config objects the Python API takes -> one API call.

Every verb that writes takes `--out DIR`; every verb that reports takes `--json` and then prints one
JSON object on stdout's last line.  Errors a user can fix exit with status 2 and one clear line.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Sequence


def _add_models(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("models", help="list the model presets (Table 1) with parameters and GFLOPs")
    parser.add_argument("--img-size", type=int, default=None, help="resolution for GFLOPs (default: each preset's)")
    parser.add_argument("--num-classes", type=int, default=1000, help="head size for the parameter count")
    parser.add_argument("--filter", default="", help="only names containing this text")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_run_models)


def _run_models(args: argparse.Namespace) -> int:
    import torch

    from vitkit.bench.flops import model_flops
    from vitkit.models import build_model, preset_config
    from vitkit.models.configs import HybridConfig, ResNetConfig, image_size

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
    if args.json:
        print(json.dumps({"models": rows}))
        return 0
    header = f"{'name':<14}{'layers':>7}{'hidden':>8}{'mlp':>7}{'heads':>6}{'params':>14}{'img':>6}{'GFLOPs':>9}"
    print(header)
    for r in rows:
        print(
            f"{r['name']:<14}{r['layers']!s:>7}{r['hidden']!s:>8}{r['mlp']!s:>7}{r['heads']!s:>6}"
            f"{r['params']:>14,}{r['img_size']:>6}{r['gflops']:>9.2f}"
        )
    return 0


def _list_models() -> list[str]:
    from vitkit.models import list_models

    return list_models()


def _add_pretrain_mpp(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "pretrain-mpp", help="self-supervised masked patch prediction pre-training (App. B.1.2); labels are not used"
    )
    parser.add_argument("--data", required=True, help="data source URI (digits, fashion-mnist:DIR, folder:DIR, ...)")
    parser.add_argument("--recipe", default=None, help="recipe whose model/data/augmentation to use (default: chosen "
                        "for the data set, as vitkit train); its optimiser is replaced by App. B.1.2's")
    parser.add_argument("--model", default=None, help="preset name (vitkit models lists them); default: the recipe's")
    parser.add_argument("--target", default="mean_color", choices=["mean_color", "downsampled", "pixels"],
                        help="3-bit mean colour (512 classes, the paper's), 4x4 downsized 3-bit patch, or L2 on pixels")
    parser.add_argument("--corrupt-rate", type=float, default=0.5, help="fraction of patches corrupted (BERT: 0.15)")
    parser.add_argument("--replace", type=float, nargs=3, default=(0.8, 0.1, 0.1), metavar=("MASK", "RANDOM", "KEEP"),
                        help="split of the corrupted patches: [mask] / random other patch / kept")
    parser.add_argument("--epochs", type=float, default=None)
    parser.add_argument("--batch-size", type=int, default=None, help="global batch (paper: 4096)")
    parser.add_argument("--lr", type=float, default=None, help="Adam learning rate (default: the paper's 2e-4)")
    parser.add_argument("--warmup-steps", type=int, default=None, help="default: min(10000, 5%% of the run)")
    parser.add_argument("--img-size", type=int, default=None)
    parser.add_argument("--max-minutes", type=float, default=None, help="stop cleanly after this long; re-run resumes")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", default=None, help="run directory (re-running with it resumes)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="GROUP.FIELD=VALUE",
                        help="any other TrainConfig field, e.g. --set run.checkpoint_every=200 (repeatable)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_run_pretrain_mpp)


def _run_pretrain_mpp(args: argparse.Namespace) -> int:
    import logging

    from vitkit.ssl.masked_patch import MPPConfig
    from vitkit.ssl.pretrain import mpp_train_config, pretrain
    from vitkit.train.config import apply_overrides
    from vitkit.train.resolve import Request, resolve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    mpp = MPPConfig(target=args.target, corrupt_rate=args.corrupt_rate, replace=tuple(args.replace))
    request = Request(data=args.data, recipe=args.recipe, model=args.model, epochs=args.epochs, batch_size=args.batch_size,
                      img_size=args.img_size, max_minutes=args.max_minutes, seed=args.seed, out=args.out, quiet=True,
                      runs_root="runs/mpp")
    config = mpp_train_config(resolve(request).config, lr=args.lr, warmup_steps=args.warmup_steps)
    config = apply_overrides(config, args.overrides)
    summary = pretrain(config, mpp)
    if args.json:
        print(json.dumps(summary))
    else:
        state = "finished" if summary["status"] == "finished" else "stopped by --max-minutes (re-run to resume)"
        print(f"MPP pre-training {state} at step {summary['step']}/{summary['steps']}: loss {summary['loss']}; "
              f"encoder checkpoint (no MPP head): {summary['checkpoint']}")
    return 0


def _add_convert(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("convert", help="convert a checkpoint (vitkit, official .npz, timm, HF) to vitkit, timm, hf or official")
    parser.add_argument("src", help="checkpoint directory or file, any supported format (detected)")
    parser.add_argument("dst", help="output directory (an .npz file for --to official)")
    parser.add_argument("--to", choices=("vitkit", "timm", "hf", "official"), default="vitkit", help="target format")
    _add_surgery_flags(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_run_convert)


def _add_surgery_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--img-size", type=int, default=None, help="new resolution: position embeddings interpolated in 2D")
    parser.add_argument("--resample", choices=("bilinear", "bicubic"), default="bilinear", help="interpolation for --img-size")
    parser.add_argument("--num-classes", type=int, default=None, help="replace the head by a zero-initialised D x K layer")
    parser.add_argument("--pre-logits", choices=("keep", "drop"), default=None, help="keep or drop the pre-logits layer")


def _read_checkpoint(args: argparse.Namespace) -> Any:
    from vitkit.checkpoints import read

    return read(args.src, img_size=args.img_size, num_classes=args.num_classes, pre_logits=args.pre_logits, resample=args.resample)


def _run_convert(args: argparse.Namespace) -> int:
    from vitkit.checkpoints import write

    checkpoint = _read_checkpoint(args)
    out = write(checkpoint, args.dst, to=args.to)
    params = sum(p.numel() for p in checkpoint.model.parameters())
    summary = {"src": args.src, "format": checkpoint.provenance.get("format"), "dst": str(out), "to": args.to, "params": params}
    print(json.dumps(summary) if args.json else f"wrote {out} ({args.to}, {params:,} parameters) from {args.src}")
    return 0


def _add_export_onnx(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("export-onnx", help="export a checkpoint to ONNX (dynamic batch), checked with onnxruntime")
    parser.add_argument("src", help="checkpoint directory or file, any supported format")
    parser.add_argument("out", help="output .onnx file")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset (>= 17)")
    _add_surgery_flags(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_run_export_onnx)


def _run_export_onnx(args: argparse.Namespace) -> int:
    from vitkit.checkpoints.onnx_export import check_onnx, export_onnx, onnxruntime_available

    checkpoint = _read_checkpoint(args)
    out = export_onnx(checkpoint.model, args.out, opset=args.opset)
    diff = check_onnx(checkpoint.model, out) if onnxruntime_available() else None
    if args.json:
        print(json.dumps({"out": str(out), "opset": args.opset, "max_abs_diff": diff}))
    else:
        check = f"onnxruntime vs PyTorch max |diff| = {diff:.3g}" if diff is not None else "onnxruntime not installed: not checked"
        print(f"wrote {out} (opset {args.opset}, dynamic batch); {check}")
    return 0


def _add_eval(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("eval", help="top-1/top-5, per-class accuracy and confusion matrix of a checkpoint or run")
    parser.add_argument("checkpoint", help="checkpoint (any format) or run directory (its final/newest checkpoint)")
    parser.add_argument("--data", required=True, help="data source URI, e.g. digits, fashion-mnist:DIR, folder:DIR")
    parser.add_argument("--split", choices=("train", "val", "test"), default="test", help="split to evaluate")
    _add_run_flags(parser)
    parser.add_argument("--max-images", type=int, default=None, help="evaluate a fixed random subset of this many images")
    parser.add_argument("--out", default=None, help="folder for eval_SPLIT.json + confusion_SPLIT.png (default RUN/eval for a run)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_run_eval)


def _add_run_flags(parser: argparse.ArgumentParser, batch_size: int = 64) -> None:
    parser.add_argument("--img-size", type=int, default=None, help="input resolution (default: the checkpoint's; position embeddings are resampled)")
    parser.add_argument("--batch-size", type=int, default=batch_size, help="images per forward pass (results do not depend on it)")
    parser.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, cuda:1, ...")


def _run_eval(args: argparse.Namespace) -> int:
    from vitkit.eval.accuracy import EvalConfig
    from vitkit.eval.commands import eval_command

    config = EvalConfig(img_size=args.img_size, batch_size=args.batch_size, device=args.device)
    report = eval_command(args.checkpoint, args.data, args.split, config, args.out, args.max_images)
    if args.json:
        print(json.dumps(report))
        return 0
    k = next(key for key in report if key.startswith("top") and key != "top1")
    print(f"{args.data} {args.split}: {report['num_images']} images at {report['img_size']} px")
    print(f"top-1 {100 * report['top1']:.2f}%   {k} {100 * report[k]:.2f}%")
    for name, value in report["per_class"].items():
        print(f"  {name:<24} {'-' if value is None else f'{100 * value:.1f}%'}")
    if "out" in report:
        print(f"wrote {report['out']}/eval_{args.split}.json and confusion_{args.split}.png")
    return 0


def _add_fewshot(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("fewshot", help="few-shot linear accuracy (Sec. 4.1): closed-form ridge on frozen features")
    parser.add_argument("checkpoint", help="checkpoint (any format) or run directory")
    parser.add_argument("--data", required=True, help="data source URI (its train split gives the shots, test the accuracy)")
    parser.add_argument("--shots", default="1,5,10,25", help="comma-separated k images per class")
    parser.add_argument("--seeds", type=int, default=3, help="repetitions with different shots (mean +- std)")
    parser.add_argument("--layer", default="features", help="representation: features (what the head reads), y, pre_logits")
    parser.add_argument("--max-test", type=int, default=None, help="evaluate on a fixed random subset of the test split")
    _add_run_flags(parser)
    parser.add_argument("--out", default=None, help="folder for fewshot.json")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_run_fewshot)


def _run_fewshot(args: argparse.Namespace) -> int:
    from vitkit.eval.commands import fewshot_command
    from vitkit.eval.fewshot import FewShotConfig

    try:
        shots = tuple(int(k) for k in args.shots.split(",") if k.strip())
    except ValueError:
        raise ValueError(f"--shots must be comma-separated integers, got {args.shots!r}") from None
    config = FewShotConfig(shots=shots, seeds=args.seeds, layer=args.layer, img_size=args.img_size,
                           batch_size=args.batch_size, max_test=args.max_test, device=args.device)
    report = fewshot_command(args.checkpoint, args.data, config, args.out)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{args.data}: {report['num_classes']} classes, {report['num_test']} test images, layer {report['layer']}")
    for k, entry in report["shots"].items():
        print(f"  {k:>3}-shot: {100 * entry['mean']:.2f}% +- {100 * entry['std']:.2f}  ({len(entry['runs'])} seeds)")
    return 0


def _add_predict(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("predict", help="top-k classes with probabilities for image files or folders")
    parser.add_argument("checkpoint", help="checkpoint (any format) or run directory")
    parser.add_argument("images", nargs="+", help="image files (JPEG/PNG/..., any mode and size) or folders")
    parser.add_argument("--top-k", type=int, default=5, help="classes per image")
    _add_run_flags(parser, batch_size=32)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_run_predict)


def _run_predict(args: argparse.Namespace) -> int:
    from vitkit.eval.commands import predict_command
    from vitkit.eval.predict import PredictConfig

    config = PredictConfig(top_k=args.top_k, img_size=args.img_size, batch_size=args.batch_size, device=args.device)
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
                print(f"{entry['file']}: {top}")
    return 1 if failed or not results else 0


def _add_serve(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve", help="HTTP inference server: /v1/predict, /v1/explain, /metrics and a web page")
    parser.add_argument("checkpoint", help="checkpoint (any format) or run directory")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port")
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:1, ...")
    parser.add_argument("--max-batch", type=int, default=32, help="images per model forward at most")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="how long a batch waits to fill up")
    parser.add_argument("--max-body-mb", type=float, default=8.0, help="request body limit in MiB")
    parser.add_argument("--max-queue", type=int, default=256, help="requests admitted at once; more get 503")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for the model (default: torch's)")
    parser.add_argument("--token", default=None, help="require 'Authorization: Bearer TOKEN' (all routes but the page)")
    parser.set_defaults(handler=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    import logging

    from vitkit.serve.config import ServeConfig

    try:
        from vitkit.serve.server import run_server
    except ImportError as error:
        raise ValueError(f"vitkit serve needs the serve extra ({error.name} is missing): pip install 'vitkit[serve]'") from error
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    config = ServeConfig(host=args.host, port=args.port, device=args.device, max_batch=args.max_batch,
                         max_wait_ms=args.max_wait_ms, max_body_mb=args.max_body_mb, max_queue=args.max_queue,
                         threads=args.threads, token=args.token)
    return run_server(args.checkpoint, config)


def _add_embed(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("embed", help="save the representation of every image of a split (.npy or .safetensors)")
    parser.add_argument("checkpoint", help="checkpoint (any format) or run directory")
    parser.add_argument("--data", required=True, help="data source URI")
    parser.add_argument("--split", choices=("train", "val", "test"), default="test", help="split to embed")
    parser.add_argument("--layer", default="pre_logits", help="y, pre_logits, features, logits, encoder_norm or blockNN (tokens)")
    parser.add_argument("--out", required=True, help="FILE.npy (+ FILE.labels.npy, FILE.json) or FILE.safetensors")
    _add_run_flags(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_run_embed)


def _run_embed(args: argparse.Namespace) -> int:
    from vitkit.eval.commands import embed_command

    report = embed_command(args.checkpoint, args.data, args.split, args.layer, args.out, img_size=args.img_size,
                           batch_size=args.batch_size, device=args.device)
    report.pop("class_names")
    print(json.dumps(report) if args.json else f"wrote {', '.join(report['files'])}: {report['shape']} ({args.layer})")
    return 0


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("inspect", help="the paper's inspection figures (Fig. 6, Fig. 7) as PNG + JSON")
    parser.add_argument("checkpoint", help="checkpoint (any format) or run directory")
    parser.add_argument("--images", nargs="*", default=[], help="image files for the attention figures")
    parser.add_argument("--data", default=None, help="data source URI: images for the attention figures")
    parser.add_argument("--split", choices=("train", "val", "test"), default="test", help="split of --data")
    parser.add_argument("--num-images", type=int, default=32, help="images drawn from --data")
    parser.add_argument("--num-overlays", type=int, default=8, help="images shown in the rollout figure")
    parser.add_argument("--components", type=int, default=28, help="filter principal components shown")
    parser.add_argument("--no-figures", action="store_true", help="numbers (inspect.json) only, no PNG files")
    _add_run_flags(parser, batch_size=8)
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--json", action="store_true", help="print one JSON object (summary numbers)")
    parser.set_defaults(handler=_run_inspect)


def _run_inspect(args: argparse.Namespace) -> int:
    from vitkit.inspect.report import InspectConfig, inspect_command, summary

    config = InspectConfig(num_components=args.components, num_overlays=args.num_overlays, batch_size=args.batch_size,
                           img_size=args.img_size, device=args.device, draw=not args.no_figures)
    report = summary(inspect_command(args.checkpoint, args.out, config, image_files=args.images, data=args.data,
                                     split=args.split, num_images=args.num_images))
    if args.json:
        print(json.dumps(report))
        return 0
    for line in report["lines"]:
        print(line)
    return 0


def _add_bench(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="measure inference and training images/s, FLOP/s and MFU of a preset")
    parser.add_argument("--model", default="vit_ti16", help="preset name (vitkit models lists them)")
    parser.add_argument("--img-size", type=int, default=None, help="resolution (default: the preset's)")
    parser.add_argument("--num-classes", type=int, default=1000, help="head size")
    parser.add_argument("--batch-size", type=int, default=32, help="images per step")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto",
                        help="fp32, bf16 autocast, or auto: bf16 where the device has native bf16 matmuls")
    parser.add_argument("--attn-impl", choices=("auto", "sdpa", "explicit"), default=None,
                        help="attention path (default: the preset's, auto)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (compile time reported as warm-up)")
    parser.add_argument("--mode", choices=("both", "inference", "training"), default="both", help="what to measure")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per mode")
    parser.add_argument("--steps", type=int, default=5, help="steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats (the median is reported)")
    parser.add_argument("--peak-tflops", type=float, default=None, help="peak for MFU (default: measure a large matmul)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="model-config field, e.g. --set depth=6 --set patch_size=4 (repeatable)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_run_bench)


def _bench_overrides(pairs: list[str]) -> dict[str, Any]:
    """`FIELD=VALUE` strings -> dict; values read as int, float, true/false/none, else text."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set wants FIELD=VALUE, got {pair!r}")
        lowered = text.lower()
        value: Any = {"true": True, "false": False, "none": None}.get(lowered, text)
        if value is text:
            for kind in (int, float):
                try:
                    value = kind(text)
                    break
                except ValueError:
                    continue
        out[key] = value
    return out


def _run_bench(args: argparse.Namespace) -> int:
    from vitkit.bench.throughput import BenchConfig, format_table, run_benchmark

    modes = ("inference", "training") if args.mode == "both" else (args.mode,)
    config = BenchConfig(
        model=args.model, img_size=args.img_size, num_classes=args.num_classes, batch_size=args.batch_size,
        precision=args.precision, attn_impl=args.attn_impl, compile=args.compile, modes=modes, warmup=args.warmup,
        steps=args.steps, repeats=args.repeats, peak_tflops=args.peak_tflops, device=args.device, threads=args.threads,
        overrides=_bench_overrides(args.set),
    )
    result = run_benchmark(config)
    print(json.dumps(result) if args.json else format_table(result))
    return 0


def _add_train_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", default="digits", help="data source URI: digits (default), fashion-mnist:DIR, "
                        "mnist:DIR, cifar10:DIR, cifar100:DIR, folder:DIR, npz:FILE")
    parser.add_argument("--model", default=None, help="model preset (vitkit models); default: the recipe's")
    parser.add_argument("--recipe", default=None, help="recipe name (paper-pretrain, paper-finetune, small-8px, ...; "
                        "each has a -tiny variant); default: chosen from the data set's size and resolution")
    parser.add_argument("--epochs", type=float, default=None)
    parser.add_argument("--batch-size", type=int, default=None, help="effective global batch (accumulated as needed)")
    parser.add_argument("--lr", type=float, default=None, help="peak learning rate")
    parser.add_argument("--img-size", type=int, default=None, help="training resolution in pixels")
    parser.add_argument("--max-minutes", type=float, default=None, help="stop cleanly when spent, evaluate and save")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", default=None, help="run directory (default runs/<data>-<model>-<time>); "
                        "re-running with the same directory resumes")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="GROUP.FIELD=VALUE",
                        help="override any config field, e.g. --set optim.warmup_steps=500 (type-checked)")
    parser.add_argument("--strict", action="store_true", help="stop on the first corrupt image instead of skipping it")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (the small-28px recipe "
                        "compiles by default; --set run.compile=false trains eagerly)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (no progress bar)")


def _add_train(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("train", help="train a ViT (recipe chosen from the data set; default: digits)")
    _add_train_flags(parser)
    parser.set_defaults(handler=_run_train, init_from=None, lr_sweep=False)


def _add_finetune(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("finetune", help="fine-tune a checkpoint (App. B.1.1): new zero-init head, new resolution")
    parser.add_argument("init_from", metavar="CHECKPOINT", help="any checkpoint vitkit can read")
    _add_train_flags(parser)
    parser.add_argument("--lr-sweep", action="store_true", help="sweep lr {0.001, 0.003, 0.01, 0.03} on a held-out "
                        "10%% (2%% for large sets) of train, then train the best on all of it")
    parser.set_defaults(handler=_run_train)


def _run_train(args: argparse.Namespace) -> int:
    import logging
    import os

    from vitkit.train.resolve import Request, resolve
    from vitkit.train.sweep import train_with_sweep

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    request = Request(data=args.data, recipe=args.recipe, model=args.model, epochs=args.epochs,
                      batch_size=args.batch_size, lr=args.lr, img_size=args.img_size, max_minutes=args.max_minutes,
                      seed=args.seed, out=args.out, overrides=tuple(args.overrides), strict=args.strict,
                      compile=args.compile, quiet=args.json, init_from=args.init_from, lr_sweep=args.lr_sweep,
                      world=int(os.environ.get("WORLD_SIZE", "1")))
    resolved = resolve(request)
    main_process = os.environ.get("RANK", "0") == "0"  # under torchrun only rank 0 talks
    if not main_process:
        logging.getLogger("vitkit").setLevel(logging.WARNING)
    for line in resolved.notes if main_process else ():
        print(line, file=sys.stderr)
    for line in resolved.warnings if main_process else ():
        print(f"warning: {line}", file=sys.stderr)
    result = train_with_sweep(resolved.config, progress_stream=sys.stderr)
    split = resolved.config.eval.final_split
    if not main_process:
        return 0
    if args.json:
        print(json.dumps(result))
    elif result["status"] == "interrupted":
        print(f"interrupted at step {result['step']}/{result['steps']}; checkpoint saved in {result['run_dir']} "
              f"(re-run with --out {result['run_dir']} to resume)")
    else:
        final = result[split]
        note = " (time budget spent)" if result["status"] == "time_budget" else ""
        print(f"{split} accuracy: top-1 {100 * final['top1']:.2f}%, top-5 {100 * final['top5']:.2f}% on "
              f"{final['count']} images after {result['step']}/{result['steps']} steps, "
              f"{result['wall_minutes']:.2f} min{note}; run: {result['run_dir']}")
    return 128 + result.get("signal", 0) if result["status"] == "interrupted" else 0


VERBS: list[Callable[[argparse._SubParsersAction], None]] = [_add_models, _add_pretrain_mpp, _add_convert, _add_export_onnx, _add_eval, _add_fewshot, _add_predict, _add_serve, _add_embed, _add_inspect, _add_bench, _add_train, _add_finetune]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitkit", description="Vision Transformer (Dosovitskiy et al. 2021) toolkit")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for add in VERBS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except (ValueError, FileNotFoundError, NotADirectoryError, PermissionError) as err:
        print(f"vitkit {args.verb}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"vitkit {args.verb}: interrupted", file=sys.stderr)
        return 130


def _entry(argv: Sequence[str] | None = None) -> Any:  # pragma: no cover - console script shim
    sys.exit(main(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
