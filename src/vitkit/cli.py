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


VERBS: list[Callable[[argparse._SubParsersAction], None]] = [_add_models]


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
