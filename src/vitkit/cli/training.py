"""`vitkit train`, `finetune` and `pretrain-mpp`: one set of flags (pretrain-mpp adds MPP's), one engine."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

from vitkit.cli.flags import add_train_flags, columns_of, finite_float


def add_train(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("train", help="train a ViT (recipe chosen from the data set; default: digits)")
    add_train_flags(parser)
    parser.set_defaults(handler=run_train, init_from=None, lr_sweep=False, objective="classification")


def add_finetune(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("finetune", help="fine-tune a checkpoint (App. B.1.1): new zero-init head, new resolution")
    parser.add_argument("init_from", metavar="CHECKPOINT", help="any checkpoint vitkit can read, or a run directory")
    add_train_flags(parser, data_required=True)
    parser.add_argument(
        "--lr-sweep",
        action="store_true",
        help="sweep lr {0.001, 0.003, 0.01, 0.03} on a held-out "
        "10%% of train (2%% from 20,000 images, 1%% from 500,000), then train the best on all of it",
    )
    parser.set_defaults(handler=run_train, objective="classification")


def add_pretrain_mpp(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "pretrain-mpp", help="self-supervised masked patch prediction pre-training (App. B.1.2); labels are not used"
    )
    add_train_flags(parser, lr_help="Adam learning rate (default: the paper's 2e-4)", runs_root="runs/mpp")
    parser.add_argument(
        "--target",
        choices=["mean_color", "downsampled", "pixels"],
        help="3-bit mean colour (512 classes, the paper's; the default), 4x4 downsized 3-bit patch, or L2 on pixels",
    )
    parser.add_argument(
        "--corrupt-rate", type=finite_float, help="fraction of patches corrupted (default 0.5; BERT: 0.15)"
    )
    parser.add_argument(
        "--replace",
        type=finite_float,
        nargs=3,
        metavar=("MASK", "RANDOM", "KEEP"),
        help="split of the corrupted patches: [mask] / random other patch / kept (default 0.8 0.1 0.1)",
    )
    parser.add_argument("--warmup-steps", type=int, default=None, help="default: min(10000, 5%% of the run)")
    parser.set_defaults(handler=run_train, init_from=None, lr_sweep=False, objective="mpp")


# Each first-class flag and the --set key of the same field, which would silently override it (--set is applied
# after the flags).  data.steps, another field than --epochs that would also override it, is refused beside it.
FLAG_KEYS = {
    "epochs": "data.epochs",
    "batch_size": "data.batch_size",
    "lr": "optim.lr",
    "img_size": "model.img_size",
    "max_minutes": "run.max_minutes",
    "seed": "run.seed",
    "out": "run.out",
    "labels_per_class": "data.labels_per_class",
    "image_column": "data.image_column",
    "label_column": "data.label_column",
    "compile": "run.compile",
    "warmup_steps": "optim.warmup_steps",  # pretrain-mpp's own flags
    "target": "mpp.target",
    "corrupt_rate": "mpp.corrupt_rate",
    "replace": "mpp.replace",
}


def refuse_twice_given(args: argparse.Namespace) -> None:
    """A flag and a --set of the same field: one of the two would be dropped without a word."""
    listed = [item.partition("=")[0].strip() for item in args.overrides]
    keys = set(listed)
    twice = next((key for key in listed if listed.count(key) > 1), None)
    if twice:
        raise ValueError(f"--set {twice} was given more than once, and all but the last would be dropped; give it once")
    if getattr(args, "epochs", None) is not None and "data.steps" in keys:
        raise ValueError(
            "--epochs and --set data.steps both give the run's length (steps count where both are set): give one"
        )
    for dest, key in FLAG_KEYS.items():
        given = getattr(args, dest, None)
        if given is not None and given is not False and given != "" and key in keys:  # 0 is given; False is not
            flag = "--" + dest.replace("_", "-")
            raise ValueError(f"{flag} and --set {key} were both given, and one would be dropped; give one of them")
    sweeping = getattr(args, "lr_sweep", False) or "optim.lr_sweep" in keys
    if sweeping and (getattr(args, "lr", None) is not None or "optim.lr" in keys):
        raise ValueError(
            "--lr-sweep picks the learning rate among optim.lr_sweep, and would drop the one given with it (--lr "
            "or --set optim.lr): give one of them (other candidates: --set optim.lr_sweep=R1,R2,...)"
        )


def _config(args: argparse.Namespace) -> Any:
    """The resolved TrainConfig of the flags (the recipe chosen for the data, flags and --set applied)."""
    from vitkit.train.config import apply_overrides
    from vitkit.train.distributed import from_env
    from vitkit.train.resolve import Request, resolve

    mpp = args.objective == "mpp"
    refuse_twice_given(args)
    overrides = (*(f"data.{key}={value}" for key, value in columns_of(args).items()), *args.overrides)
    own = tuple(item for item in overrides if mpp and item.partition("=")[0].strip().startswith("mpp."))
    request = Request(
        data=args.data,
        recipe=args.recipe,
        model=args.model,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=None if mpp else args.lr,
        img_size=args.img_size,
        max_minutes=args.max_minutes,
        seed=args.seed,
        out=args.out,
        overrides=tuple(item for item in overrides if item not in own),  # mpp.*: once the MPP config exists
        labels_per_class=args.labels_per_class,
        strict=args.strict,
        compile=args.compile,
        quiet=args.json,
        init_from=args.init_from,
        lr_sweep=args.lr_sweep,
        world=from_env().world,
        runs_root=args.runs_root,
        labelled=not mpp,
    )
    resolved = resolve(request)
    config = resolved.config
    if mpp:
        from vitkit.ssl.masked_patch import MPPConfig
        from vitkit.train.objectives import mpp_train_config

        replace = tuple(args.replace) if args.replace is not None else None
        given = {"target": args.target, "corrupt_rate": args.corrupt_rate, "replace": replace}
        objective = MPPConfig(**{name: value for name, value in given.items() if value is not None})  # else defaults
        config = mpp_train_config(config, objective, lr=args.lr, warmup_steps=args.warmup_steps)
        config = apply_overrides(config, overrides)  # --set wins over App. B.1.2's settings too
    return resolved, config


# Loggers of loading a source, which every process does alike (a bad image was named once by each), the
# shard reader's among them where every process reads the same shards (listing them, scanning their labels,
# reading them into memory); the batches' loggers (vitkit.data.loader, .stream, .tarshards) name what each
# process reads of its own share.
LOADING_LOGGERS = ("sources", "inmemory", "listing", "images", "subsets", "hf", "tarshards.loading")


def quiet_other_ranks() -> bool:
    """Whether this is the main process; under torchrun the others log only warnings, and not those of
    loading the data (LOADING_LOGGERS), which rank 0 gives."""
    from vitkit.train.distributed import from_env

    if from_env().main:
        return True
    logging.getLogger("vitkit").setLevel(logging.WARNING)
    for name in LOADING_LOGGERS:
        logging.getLogger(f"vitkit.data.{name}").setLevel(logging.ERROR)
    return False


def run_train(args: argparse.Namespace) -> int:
    from vitkit.runs import RunDir
    from vitkit.train.plan_text import plan_lines
    from vitkit.train.sweep import train_with_sweep
    from vitkit.train.trainer import EvaluationError, reconcile

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stderr)
    main_process = quiet_other_ranks()
    resolved, config = _config(args)
    resuming = RunDir(config.run.out).latest() is not None
    config = reconcile(config, length_given=resolved.length_given)  # resuming: the run's own config, said first

    def say(lines: list[str], prefix: str = "") -> None:
        for line in lines if main_process else ():
            print(prefix + line, file=sys.stderr)

    if not resuming or config.recipe == resolved.config.recipe:
        say(resolved.notes)
        say(resolved.warnings, "warning: ")
    else:  # the notes describe the request; the stored run is what continues
        say([f"recipe: {config.recipe} (the stored config of the run in {config.run.out}, which this resumes)"])
    try:
        result = train_with_sweep(
            config,
            progress_stream=sys.stderr,
            on_plan=lambda plan: say(plan_lines(plan)),
            spent_s=time.monotonic() - args.started,  # the command's own start-up: imports, reading the data
        )
    except EvaluationError as err:  # the model is saved: say where, and how to evaluate it again
        print(f"vitkit {args.verb}: error: {err}", file=sys.stderr)
        return 1
    if main_process:
        print(json.dumps(result) if args.json else _final_line(result, config))
    return 128 + result.get("signal", 0) if result["status"] == "interrupted" else 0


def _interrupted_line(result: dict[str, Any]) -> str:
    """Where the stopped run is saved and how to resume it; a run the time budget ends has no fixed length."""
    resume = result.get("resume_out")
    where = f"{result['run_dir']}, a trial of the sweep in {resume}" if resume else result["run_dir"]
    plan = result.get("plan", {})
    at = f"{result['step']}/{result['steps']}"
    if _fitted(result):  # the step count is the recipe's cap, or (not given) the warm-up's estimate of the budget
        step, steps, ends = result["step"], result["steps"], "the time budget ends the schedule"
        at = f"{step} of at most {steps} ({ends})"
        if not plan.get("steps_given", True):
            at = f"{step} ({ends})" if plan.get("start_step") else f"{step} (~{steps} estimated; {ends})"
    again = resume or result["run_dir"]
    return f"interrupted at step {at}; checkpoint saved in {where} (re-run with --out {again} to resume)"


def _fitted(result: dict[str, Any]) -> bool:
    """Whether the run's plan fitted its schedule to a time budget (its step count is then a cap)."""
    from vitkit.train.config import budget_fitted

    plan = result.get("plan", {})
    return budget_fitted(plan.get("budget_minutes", 0), plan.get("budget_schedule", ""))


def _final_line(result: dict[str, Any], config: Any) -> str:
    if result["status"] == "interrupted":
        return _interrupted_line(result)
    split = config.eval.final_split
    note = " (time budget spent)" if result["status"] == "time_budget" else ""
    given = result.get("plan", {}).get("steps_given", True)
    steps = f"{result['step']}/{result['steps']}" if given else f"{result['step']} (~{result['steps']} estimated)"
    if not given and result.get("plan", {}).get("start_step"):  # a resumed run's estimate: of this invocation only
        steps = str(result["step"])
    if given and result["status"] == "time_budget" and result["step"] < result["steps"]:  # a cap the budget cut
        steps = f"{result['step']} of at most {result['steps']}"
    if given and _fitted(result) and result["status"] == "finished" and result["step"] < result["steps"]:  # annealed
        steps = f"{result['step']} (the schedule fitted to the time budget; at most {result['steps']})"
    took = f"{result['wall_minutes']:.2f} min"
    if result.get("plan", {}).get("start_step") and "minutes" in result:  # resumed: the run's whole training too
        took += f" this time with its start-up, {result['minutes']:.2f} min of training in all"
    done = f"after {steps} steps, {took}{note}; run: {result['run_dir']}"
    final = result.get(split)
    if config.mpp is not None:
        held = (
            (
                f"held-out MPP loss {final['loss']:.4f}"
                + (f", top-1 {100 * final['top1']:.2f}%" if final.get("top1") is not None else "")
            )
            if final
            else "no held-out evaluation"
        )
        return f"masked patch prediction: {held} {done}; encoder checkpoint (no MPP head): {result['checkpoint']}"
    return (
        f"{split} accuracy: top-1 {100 * final['top1']:.2f}%, top-{final.get('k', 5)} {100 * final['top5']:.2f}% on "
        f"{final['count']} images {done}"
    )
