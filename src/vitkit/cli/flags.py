"""Flag groups shared by the verbs, and `emit`, the one way a verb prints its result."""

from __future__ import annotations

import argparse
import json
import math
import unicodedata
from collections.abc import Callable, Iterable
from typing import Any

from vitkit.data.images import MAX_PIXELS
from vitkit.models.configs import MAX_IMG
from vitkit.train.config import MAX_SEED


def finite_float(text: str) -> float:
    """A float flag's value: a finite number (argparse's `float` takes "nan" and "inf")."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan  # not a number at all: the same words
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def bounded_int(low: int, high: int | None = None) -> Callable[[str], int]:
    """An int flag's type: a whole number from `low` to `high` (None: no upper bound), refused at parsing."""
    span = f"from {low:,}" + (f" to {high:,}" if high is not None else " up")

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer {span}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected an integer {span}, got {text!r}")
        return value

    parse.__name__ = "integer"  # argparse names the type in "invalid <name> value"
    return parse


def add_max_pixels(parser: argparse.ArgumentParser) -> None:
    """--max-pixels: the decompression-bomb guard of the verbs that decode a user's image files."""
    parser.add_argument(
        "--max-pixels",
        type=bounded_int(1),
        default=MAX_PIXELS,
        help=f"largest image accepted, in pixels, read from its header (default {MAX_PIXELS:,}: Pillow's limit; "
        "Pillow refuses more than twice that itself); decoding one at the limit can take over 1 GB",
    )


def add_surgery_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--img-size",
        type=bounded_int(1, MAX_IMG),
        default=None,
        help="new resolution: position embeddings interpolated in 2D",
    )
    parser.add_argument(
        "--resample", choices=("bilinear", "bicubic"), default="bilinear", help="interpolation for --img-size"
    )
    parser.add_argument(
        "--num-classes", type=int, default=None, help="replace the head by a zero-initialised D x K layer"
    )
    parser.add_argument(
        "--pre-logits", choices=("keep", "drop"), default=None, help="keep or drop the pre-logits layer"
    )
    parser.add_argument(
        "--max-model-gb",
        type=float,
        default=None,
        help="refuse a model with more GB of weights (default: the memory available now; inf: no limit)",
    )


def add_run_flags(parser: argparse.ArgumentParser, batch_size: int = 64) -> None:
    parser.add_argument(
        "--img-size",
        type=bounded_int(1, MAX_IMG),
        default=None,
        help="input resolution (default: the checkpoint's; position embeddings are resampled)",
    )
    parser.add_argument(
        "--batch-size",
        type=bounded_int(1),
        default=batch_size,
        help="images per forward pass (results do not depend on it)",
    )
    parser.add_argument("--device", default="auto", help="auto (CUDA if available), cpu, cuda, cuda:1, ...")


def add_train_flags(
    parser: argparse.ArgumentParser,
    *,
    lr_help: str = "peak learning rate",
    runs_root: str = "runs",
    data_required: bool = False,
) -> None:
    """The flags of every training verb (train, finetune, pretrain-mpp); `data_required`: no default data set
    (a fine-tune's target is the user's, not the bundled digits)."""
    sources = "fashion-mnist:DIR, mnist:DIR, cifar10:DIR, cifar100:DIR, folder:DIR, npz:FILE, wds:DIR, hf:DIR"
    parser.add_argument(
        "--data",
        required=data_required,
        default=None if data_required else "digits",
        help=f"data source URI: {'digits, ' if data_required else 'digits (default), '}{sources}",
    )
    parser.add_argument("--model", default=None, help="model preset (vitkit models); default: the recipe's")
    parser.add_argument(
        "--recipe",
        default=None,
        help="recipe name (paper-pretrain, paper-finetune, small-8px, ...; "
        "each has a -tiny variant); default: chosen from the data set's size and resolution",
    )
    _add_length_flags(parser, lr_help)
    parser.add_argument(
        "--out",
        default=None,
        help=f"run directory (default {runs_root}/<data>-<model>-<time>); re-running with the same directory resumes",
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="GROUP.FIELD=VALUE",
        help="override any config field, e.g. --set optim.warmup_steps=500 (type-checked)",
    )
    add_column_flags(parser)
    parser.add_argument("--strict", action="store_true", help="stop on the first corrupt image instead of skipping it")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model, whatever the run's length "
        "(by default a run compiles where that saves more time than it costs; --set run.compile=off never)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object (no progress bar)")
    parser.set_defaults(runs_root=runs_root)


def _add_length_flags(parser: argparse.ArgumentParser, lr_help: str) -> None:
    """The first-class flags of a run's schedule and size: epochs, batch, lr, resolution, budget, seed, labels."""
    parser.add_argument("--epochs", type=finite_float, default=None, help="passes over the training split")
    parser.add_argument(
        "--batch-size", type=bounded_int(1), default=None, help="effective global batch (accumulated as needed)"
    )
    parser.add_argument("--lr", type=finite_float, default=None, help=lr_help)
    parser.add_argument("--img-size", type=bounded_int(1, MAX_IMG), default=None, help="training resolution in pixels")
    parser.add_argument(
        "--max-minutes",
        type=finite_float,
        default=None,
        help="time budget of the whole run: every schedule is fitted to it and the run ends annealed "
        "(--set run.budget_schedule=cut stops this invocation instead; 0: no budget)",
    )
    parser.add_argument("--seed", type=bounded_int(0, MAX_SEED), default=None)
    parser.add_argument(
        "--labels-per-class",
        type=int,
        default=None,
        metavar="N",
        help="train on a fixed N images of every class (nested: the 10 inside the 100; a learning-rate "
        "sweep's hold-out comes out of them); default: every training image",
    )


def emit(args: argparse.Namespace, report: Any, lines: Iterable[str] | None) -> int:
    """One JSON object with --json (DESIGN.md "Contracts"), else the human-readable lines; exit status 0."""
    if args.json:
        print(json.dumps(report))
    else:
        for line in lines or ():
            print(shown(line))
    return 0


def shown(line: str) -> str:
    """`line` for a terminal: control characters (an ESC sequence or a newline in a class name a checkpoint
    gives) written as escapes, so that the names cannot rewrite or forge what is printed.  JSON escapes its own."""
    return "".join(
        char if char == "\t" or unicodedata.category(char) != "Cc" else char.encode("unicode_escape").decode()
        for char in line
    )


def add_column_flags(parser: argparse.ArgumentParser) -> None:
    """--image-column / --label-column: which columns of an hf: source to read, where it has several."""
    parser.add_argument("--image-column", default="", help="hf: sources: the image column, if several")
    parser.add_argument("--label-column", default="", help="hf: sources: the label column, if several")


def columns_of(args: argparse.Namespace) -> dict[str, str]:
    """The columns the flags chose (none: as the run read its data, else found by their types)."""
    return {key: value for key in ("image_column", "label_column") if (value := getattr(args, key, ""))}
