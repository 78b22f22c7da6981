"""The `vitkit` command: flags -> the config objects the Python API takes -> one API call.

Every verb that writes takes `--out DIR`; every verb that reports takes `--json` and then prints one
JSON object on stdout's last line.  Errors a user can fix exit with status 2 and one clear line.
One module per family of verbs: training.py (train, finetune, pretrain-mpp), evaluating.py (eval,
fewshot, predict, embed, inspect), serving.py (serve), tools.py (models, convert, export-onnx, bench),
data.py (shard), studies.py (reproduce);
flags.py holds the flag groups they share.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from vitkit.cli import data, evaluating, serving, studies, tools, training

VERBS: list[Callable[[argparse._SubParsersAction], None]] = [
    tools.add_models,
    training.add_pretrain_mpp,
    tools.add_convert,
    tools.add_export_onnx,
    evaluating.add_eval,
    evaluating.add_fewshot,
    evaluating.add_predict,
    serving.add_serve,
    evaluating.add_embed,
    evaluating.add_inspect,
    tools.add_bench,
    training.add_train,
    training.add_finetune,
    data.add_shard,
    studies.add_reproduce,
]
TRAINING = ("train", "finetune", "pretrain-mpp")  # they write a run directory, and go on from its checkpoints
DISTRIBUTED = TRAINING  # the verbs that share one job over torchrun's processes
RESUMABLE = (*TRAINING, "reproduce")  # a re-run of these goes on where it stopped
STARTED_OVER = ("shard",)  # a re-run of these removes what an interrupted one wrote and starts over


class _Parser(argparse.ArgumentParser):
    """argparse without prefix matching: `--e 1` or `--max-minute 5` is an unknown flag, not a guess."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vitkit", description="Vision Transformer (Dosovitskiy et al. 2021) toolkit")
    parser.add_argument("--version", action="version", version=f"vitkit {_version()}")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB", parser_class=_Parser)
    for add in VERBS:
        add(sub)
    parser.set_defaults(verbs=sub.choices)  # each verb's parser, for its own usage on an unknown flag
    return parser


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line; an unknown flag is refused by its verb's parser (the verb's usage, not vitkit's),
    naming the flag it may be a typo of."""
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:
        verb = args.verbs[args.verb]
        flags = [flag for action in verb._actions for flag in action.option_strings]
        close = [m for word in unknown for m in difflib.get_close_matches(word.split("=")[0], flags, n=1)]
        hint = f" (did you mean {close[0]}?)" if close else ""
        scheme = str(getattr(args, "data", "") or "").partition(":")[0] + ":"
        given = list(sys.argv[1:] if argv is None else argv)
        if "--data" in given and scheme != ":" and all(word.startswith(scheme) for word in unknown):
            hint = (
                " (the shell expanded a {a..b} range or {a,b} list in --data into several words: quote the URI, "
                "--data 'wds:DIR/train-{000000..000009}.tar')"
            )
        verb.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    del args.verbs
    return args


def _version() -> str:
    from vitkit import __version__

    return __version__


def main(argv: Sequence[str] | None = None, *, since_process_start: bool = False) -> int:
    """Run one verb; exit status 2 for an error a user can fix.  `since_process_start`: the command is the
    process (the console script, `python -m vitkit`), so a time budget counts from its start."""
    started = time.monotonic()
    if since_process_start:
        from vitkit.host import process_seconds

        started -= process_seconds()
    args = _parse(argv)
    args.started = started
    try:
        for flag, what in (("out", "a path"), ("model", "a model name (vitkit models lists them)")):
            if getattr(args, flag, None) == "":  # an unset shell variable: a default would be used, unsaid
                raise ValueError(f"--{flag} is empty: give {what}")
        from vitkit.train.distributed import from_env

        if from_env().world > 1 and args.verb not in DISTRIBUTED:
            raise ValueError(  # each process would do the whole job, and print and write it, again
                f"vitkit {args.verb} runs in one process: run it without torchrun (torchrun runs "
                f"{', '.join(DISTRIBUTED)})"
            )
        with _terminated_as_interrupt():
            return args.handler(args)
    except (
        ValueError,
        FileNotFoundError,
        FileExistsError,
        NotADirectoryError,
        IsADirectoryError,
        PermissionError,
    ) as err:
        _traceback_if_asked()
        print(f"vitkit {args.verb}: error{_process()}: {_sentence(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:
        by = " by SIGTERM" if isinstance(stop, Terminated) else ""
        goes_on = "; re-run the same command to go on from what it saved" if args.verb in RESUMABLE else ""
        goes_on = "; re-run the same command to start it over" if args.verb in STARTED_OVER else goes_on
        out = getattr(args, "out", None)
        if goes_on and out and not _saved_anything(args.verb, out):
            # a training run may have written its config.json and first metrics: nothing a re-run goes on from
            first = " before its first checkpoint: a re-run starts it over"
            goes_on = first if args.verb in TRAINING else " before it saved anything"
        print(f"vitkit {args.verb}: interrupted{by}{goes_on}", file=sys.stderr)
        return 143 if by else 130
    except Exception as err:
        problem = _known_failure(err)
        if problem is None:
            raise
        _traceback_if_asked()
        print(f"vitkit {args.verb}: error{_process()}: {problem}", file=sys.stderr)
        return 2


def _saved_anything(verb: str, out: str) -> bool:
    """Whether an interrupted verb left what a re-run goes on from: a step checkpoint of a training run or of its
    sweep's trials (with its config and metrics alone it starts over), another verb's output.  True where it
    cannot be told (a re-run says what it finds)."""
    from vitkit.runs import RunDir

    try:
        if verb not in TRAINING:
            return os.path.isdir(out) and bool(os.listdir(out))
        runs = [RunDir(out), *RunDir(out).sweep_trials()]
        return any(run.latest(with_state=False) is not None for run in runs)
    except (OSError, ValueError):
        return True


def _traceback_if_asked() -> None:
    """With VITKIT_TRACEBACK=1, the traceback of the error being handled before its one line (an error a user can
    fix is one line; a bug reported as one is found by its traceback)."""
    if os.environ.get("VITKIT_TRACEBACK", "") not in ("", "0"):
        traceback.print_exc()


class Terminated(KeyboardInterrupt):
    """SIGTERM outside a training loop (which saves and stops at a step instead): stopped as Ctrl-C stops it."""


@contextlib.contextmanager
def _terminated_as_interrupt():
    """SIGTERM, in this process, raises `Terminated` while a verb runs: it ended the process without a word in
    start-up or in a run's final save, export or evaluation, where Ctrl-C said what it left.  A child (a
    DataLoader worker forked meanwhile) keeps the default, ending at once."""
    if sys.platform == "win32" or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield  # another handler is the embedding program's, or not the main thread's to replace
        return
    owner = os.getpid()

    def stop(signum: int, frame: Any) -> None:
        if os.getpid() != owner:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _sentence(err: Exception) -> str:
    """An error's text; an OS error about a path as "PATH: what" rather than Python's "[Errno N] what: 'PATH'"."""
    if isinstance(err, OSError) and err.errno is not None and err.strerror and err.filename is not None:
        names = [name for name in (err.filename, err.filename2) if name is not None]  # a rename's: both
        paths = [os.fsdecode(name) if isinstance(name, str | bytes | os.PathLike) else str(name) for name in names]
        if isinstance(err, FileExistsError) and len(paths) == 1 and os.path.isfile(paths[0]):  # mkdir's, open(x)'s
            return f"{paths[0]} already exists as a file: choose another path (--out)"
        return f"{' -> '.join(paths)}: {err.strerror}"
    text = str(err)
    if text.startswith("Caught ") and "\nOriginal Traceback" in text:  # raised again from a DataLoader worker
        last = text.strip().splitlines()[-1]  # "module.ErrorClass: what", the worker's own line
        return last.partition(": ")[2] or last
    return text


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
STORAGE = {  # errors of the storage itself, which a user fixes there: named, not a traceback
    errno.EROFS: "the file system is read-only: remount it read-write, or write elsewhere (--out)",
    errno.EIO: "the storage reported an I/O error: check the disk or network file system, then re-run",
}
MEMORY_WORDS = ("can't allocate memory", "not enough memory", "out of memory")
PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")  # gloo's, a peer killed


def _known_failure(err: Exception) -> str | None:
    """The line for a run out of memory or disk space (a user can fix either), or one whose torchrun peer ended,
    or None for any other error.  A full disk is named as the error's own text says it (safetensors raises its
    own class)."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if (isinstance(err, OSError) and err.errno in NO_SPACE) or "No space left on device" in str(err):
        if any(word in str(err) for word in ("/dev/shm", "shared memory", "/torch_")):
            lines = str(err).splitlines()  # a worker's error: "Caught RuntimeError in DataLoader worker ...", then it
            text = next((line.strip() for line in lines if "No space left on device" in line), text)
            text = text.removeprefix("RuntimeError: ")
            return (
                f"shared memory (/dev/shm) is full ({text}): DataLoader workers pass batches through it; use "
                "--set data.workers=0, or give the container more (docker run --shm-size)"
            )
        return f"no space left on the device ({text}); free some, or write elsewhere (--out)"
    if (
        isinstance(err, MemoryError)
        or type(err).__name__ == "OutOfMemoryError"
        or (isinstance(err, RuntimeError) and any(word in str(err) for word in MEMORY_WORDS))
    ):
        return f"out of memory ({text[:300]}); lower --batch-size or --img-size, or use a smaller model"
    if isinstance(err, OSError) and err.errno in STORAGE:
        return f"{_sentence(err)} ({STORAGE[err.errno]})"
    if _process() and isinstance(err, RuntimeError) and any(word in str(err) for word in PEER_GONE):
        return (
            f"another process of this torchrun job ended ({text[:200]}); the run's last checkpoint is kept: "
            "re-run the same command to resume it"
        )
    return None


def _process() -> str:
    """The error's " (process R of W)" under torchrun: every process prints its own, as one may hit it alone."""
    from vitkit.train.distributed import from_env

    try:
        info = from_env()
    except ValueError:  # torchrun's variables half set: said where the command checks them
        return ""
    return f" (process {info.rank} of {info.world})" if info.world > 1 else ""


def _entry(argv: Sequence[str] | None = None) -> Any:  # pragma: no cover - the console script and __main__
    if not os.environ.get("WORLD_SIZE"):  # a plain process (distributed.from_env's rule, without importing torch)
        sys.exit(main(argv, since_process_start=True))
    from vitkit.train import distributed  # under torchrun, perhaps with DDP's process group: see its leave

    try:
        code = main(argv, since_process_start=True)
    except SystemExit as stop:  # argparse's usage errors (2), --help and --version (0)
        code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    except BaseException:  # a crash: its traceback, then the status Python gives an uncaught exception
        traceback.print_exc()
        code = 1
    distributed.leave(code)
