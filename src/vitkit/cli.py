"""The `vitkit` command: flags -> the config objects the Python API takes -> one API call.

Every verb that writes takes `--out DIR`; every verb that reports takes `--json` and then prints one
JSON object on stdout's last line.  Errors a user can fix exit with status 2 and one clear line.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Sequence

Handler = Callable[[argparse.Namespace], int]


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
        "pretrain-mpp", help="self-supervised masked patch prediction pre-training (App. B.1.2), labels unused"
    )
    parser.add_argument("--data", required=True, help="data source URI (digits, fashion-mnist:DIR, folder:DIR, ...)")
    parser.add_argument("--model", default="auto", help="preset name, or auto: a small ViT for the data's resolution")
    parser.add_argument("--target", default="mean_color", choices=["mean_color", "downsampled", "pixels"],
                        help="3-bit mean colour (512 classes, the paper's), 4x4 downsized 3-bit patch, or L2 on pixels")
    parser.add_argument("--corrupt-rate", type=float, default=0.5, help="fraction of patches corrupted (BERT: 0.15)")
    parser.add_argument("--replace", type=float, nargs=3, default=(0.8, 0.1, 0.1), metavar=("MASK", "RANDOM", "KEEP"),
                        help="split of the corrupted patches: [mask] / random other patch / kept")
    parser.add_argument("--epochs", type=float, default=10.0)
    parser.add_argument("--batch-size", type=int, default=256, help="global batch (paper: 4096)")
    parser.add_argument("--lr", type=float, default=2e-4, help="Adam base learning rate (paper: 2e-4)")
    parser.add_argument("--warmup-steps", type=int, default=None, help="default min(10000, 5%% of the run)")
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--img-size", type=int, default=None)
    parser.add_argument("--patch-size", type=int, default=None)
    parser.add_argument("--max-minutes", type=float, default=None, help="stop cleanly after this long; re-run resumes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--out", default="runs/pretrain-mpp", help="run directory (re-running with it resumes)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_run_pretrain_mpp)


def _run_pretrain_mpp(args: argparse.Namespace) -> int:
    import logging

    from vitkit.ssl.masked_patch import MPPConfig
    from vitkit.ssl.pretrain import PretrainConfig, pretrain

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    mpp = MPPConfig(target=args.target, corrupt_rate=args.corrupt_rate, replace=tuple(args.replace))
    config = PretrainConfig(
        data=args.data, model=args.model, img_size=args.img_size, patch_size=args.patch_size, mpp=mpp,
        epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay, max_minutes=args.max_minutes, seed=args.seed, device=args.device,
    )
    summary = pretrain(config, args.out)
    if args.json:
        print(json.dumps(summary))
    else:
        state = "finished" if summary["finished"] else "stopped (re-run to resume)"
        print(f"MPP pre-training {state} at step {summary['step']}/{summary['total_steps']}: "
              f"loss {summary['loss']}, checkpoint {summary['checkpoint']}")
    return 0


VERBS: list[Callable[[argparse._SubParsersAction], None]] = [_add_models, _add_pretrain_mpp]


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
