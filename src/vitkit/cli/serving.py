"""`vitkit serve`: an HTTP inference server (optional extra `vitkit[serve]`); the logic lives in vitkit.serve."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

from vitkit.cli.flags import add_max_pixels, finite_float

TOKEN_VARIABLE = "VITKIT_SERVE_TOKEN"  # the bearer token, where a flag would show it in `ps`

if TYPE_CHECKING:
    from vitkit.serve.config import ServeConfig


def add_serve(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve", help="HTTP inference server: /v1/predict, /v1/explain, /metrics and a web page")
    parser.add_argument("checkpoint", help="checkpoint (any format) or run directory")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000)")
    parser.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:1, ...")
    parser.add_argument(
        "--max-batch", type=int, default=32, help="images per model forward at most (default 32, at most 1024)"
    )
    parser.add_argument("--max-wait-ms", type=finite_float, default=5.0, help="how long a batch waits to fill up")
    parser.add_argument("--max-body-mb", type=finite_float, default=8.0, help="request body limit in MiB")
    parser.add_argument(
        "--max-bodies-mb",
        type=finite_float,
        default=None,
        help="request bodies held in memory at once, all requests (MiB; default max(256, 4 x body limit); at least "
        "twice the body limit)",
    )
    parser.add_argument("--max-queue", type=int, default=256, help="requests admitted at once; more get 503")
    parser.add_argument("--threads", type=int, default=None, help="torch threads for the model (default: torch's)")
    add_max_pixels(parser)
    parser.add_argument("--decode-workers", type=int, default=2, help="threads decoding large uploads at once")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the model in a thread of the server process instead of a model process of its own",
    )
    parser.add_argument(
        "--token",
        default=None,
        help=f"require 'Authorization: Bearer TOKEN' (all routes but the page); default ${TOKEN_VARIABLE}, which, "
        "unlike a flag, other users' `ps` does not show",
    )
    parser.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from vitkit.checkpoints import checked
    from vitkit.device import pick_device
    from vitkit.eval.features import require_classifier
    from vitkit.runs import find_checkpoint

    config = serve_config(args)  # a bad flag first: it costs nothing to check
    found = find_checkpoint(args.checkpoint)
    with _quiet("vitkit.checkpoints"):  # what its header makes us assume is said once, as the model process loads it
        _, model = checked(found)  # a path that names no checkpoint, or a damaged one, stops before the bind
    require_classifier(model, found)  # as does an encoder without a head, in any format
    pick_device(args.device)  # as does a device this host has not

    try:
        from vitkit.serve.server import run_server
    except ImportError as error:
        raise ValueError(
            f"vitkit serve needs the serve extra ({error.name} is missing): pip install 'vitkit[serve]'"
        ) from error
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    return run_server(found, config)  # the checkpoint found, which the model process then opens as it is


def serve_config(args: argparse.Namespace) -> ServeConfig:
    """The server's settings from the command's flags."""
    from vitkit.serve.config import ServeConfig

    return ServeConfig(
        host=args.host,
        port=args.port,
        device=args.device,
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_body_mb=args.max_body_mb,
        max_queue=args.max_queue,
        max_bodies_mb=args.max_bodies_mb,
        threads=args.threads,
        token=args.token if args.token is not None else _token_from_environment(),
        model_process=not args.in_process,
        decode_workers=args.decode_workers,
        max_pixels=args.max_pixels,
    )


def _token_from_environment() -> str | None:
    """$VITKIT_SERVE_TOKEN; None where it is unset.  Set but empty is refused: `VITKIT_SERVE_TOKEN=$SECRET` with
    SECRET unset would otherwise serve without authentication."""
    token = os.environ.get(TOKEN_VARIABLE)
    if token is not None and not token.strip():
        raise ValueError(f"{TOKEN_VARIABLE} is set but empty; unset it to serve without a token")
    return token


@contextlib.contextmanager
def _quiet(name: str) -> Iterator[None]:
    """The logger `name`'s warnings left unsaid for a while (errors still said)."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
