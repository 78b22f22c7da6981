"""The plan in words: what `vitkit train` prints before the first step (the plan itself is train/plan.py's)."""

from __future__ import annotations

from vitkit.data.sources import mirror_keeps_label
from vitkit.train.plan import Plan

LONG_RUN_MINUTES = 60.0  # an unbudgeted plan longer than this says so and names --max-minutes
TIGHT_BUDGET = 0.25  # below this share of a budget left to train, the plan warns
# A Polyak average that still gives more than this weight to the starting weights at the last step is warned
# of: decay^steps (0.999 over 3,000 steps: 5%); a fine-tune's zero-initialised head is mostly still zero in it.
EMA_START_WEIGHT = 0.05


def plan_lines(plan: Plan) -> list[str]:
    """The plan in words, as `vitkit train` prints it before the first step."""
    rule = (
        f"lr {plan.base_lr:g} at global batch {plan.global_batch} (as set, not rescaled with the batch size)"
        if plan.lr_scaling == "none" or plan.base_batch == plan.global_batch
        else f"lr {plan.base_lr:g} x {plan.lr_scaling} rule ({plan.global_batch}/{plan.base_batch}) = {plan.lr:g}"
    )
    length = (
        f"{'at most ' if plan.fitted else ''}{plan.steps:,} steps ({plan.epochs:.1f} epochs)"
        + (", fewer where the budget ends first" if plan.fitted else "")
        if plan.steps_given
        else f"as many steps as the budget holds (about {_fit(plan)}, estimated)"
    )
    lines = [
        f"objective: {plan.objective}; model: {plan.params:,} parameters at {plan.img_size}px"
        + (", 1 channel (grayscale)" if plan.channels == 1 else ""),
        f"data: {plan.data}; training split read {plan.data_path or 'in memory'}",
        *(
            f"  {name}: {part['images']:,} images from {part['from'] or plan.data}"
            for name, part in plan.splits.items()
        ),
        f"effective global batch: {plan.global_batch} = {plan.processes} process(es) x {plan.micro_batch} x "
        f"{plan.accumulation} accumulation step(s); {length}, warmup {plan.warmup}",
        f"learning rate: {rule}" + (f", {plan.decay}" if plan.decay else "") + f"; {plan.optimizer}",
        f"augmentation: {', '.join(plan.augment) or 'none'}" + _flip_note(plan),
        f"device: {plan.device}; seed {plan.seed}; evaluation "
        + (f"every {plan.eval_every} steps" if plan.eval_every else "at the end only")
        + (
            "; each image and its mirror image, logits averaged (the one-view top-1 is reported too)"
            if plan.flip_views
            else ""
        ),
    ]
    if plan.host:
        lines.append(plan.host)
    lines.append(f"precision {plan.precision}" + (f" ({plan.precision_reason})" if plan.precision_reason else ""))
    lines.append(
        ("torch.compile: on" if plan.compiled else "torch.compile: off")
        + (f" ({plan.compile_reason})" if plan.compile_reason else "")
    )
    rate, until = plan.patch_dropout
    if rate > 0:
        keep = " (patches with content kept first)" if plan.patch_dropout_keep == "content" else ""
        lines.append(f"PatchDropout{keep}: {rate:g} until {until:.0%}, then every patch")
    return lines + _average_lines(plan) + estimate_lines(plan)


def _average_lines(plan: Plan) -> list[str]:
    """Polyak averaging in words, with a warning where the run is too short for the average to forget its start."""
    if plan.ema_decay <= 0:
        return []
    horizon = 1.0 / (1.0 - plan.ema_decay)
    lines = [
        f"Polyak averaging: decay {plan.ema_decay:g} (about the last {horizon:,.0f} steps); the evaluations and the "
        "final model use the average"
    ]
    steps = min(plan.steps, plan.measured.get("fit_steps", plan.steps))  # what a time budget holds of them
    start = plan.ema_decay**steps
    if steps and start > EMA_START_WEIGHT:  # 0 steps: the budget's evaluations leave none, said elsewhere
        lines.append(
            f"warning: after {steps:,} steps the average still gives {start:.0%} of its weight to the starting "
            f"weights; a run this short wants optim.ema_decay <= {1 - 3 / max(steps, 3):.3g} or none"
        )
    return lines


def estimate_lines(plan: Plan) -> list[str]:
    """The warm-up's estimate in words; a long unbudgeted run says so and names --max-minutes."""
    measured = plan.measured
    if not measured:
        return []
    speed = (
        f"warm-up: {measured['images_per_s']:,.0f} images/s in forward + backward passes "
        "(a real step adds the batch and the optimiser)"
    )
    if plan.fitted:
        fitted = (
            f"time budget {plan.budget_minutes:g} min, schedule fitted to it (ends annealed): about "
            f"{measured.get('fit_epochs', 0):g} epoch{'' if measured.get('fit_epochs', 0) == 1 else 's'} fit by "
            "the warm-up's estimate"
        )
        if plan.steps_given and measured.get("fit_epochs", 0) > plan.epochs:  # the steps run out before the time
            fitted += f"; its own {plan.steps:,} steps ({plan.epochs:.1f} epochs) end it first"
        if measured.get("final_eval_seconds"):  # the Budget keeps this back (trainer.fit)
            fitted += (
                f", {measured['final_eval_seconds']:g} s kept for the final evaluation "
                f"({measured['eval_image_ms']:.2f} ms an image, timed)"
            )
        if plan.start_step:
            fitted += f"; resuming at step {plan.start_step:,}, the rest of the schedule in the training time left"
        lines = [speed, fitted]
        left, whole = measured.get("train_seconds"), plan.budget_minutes * 60
        startup = measured.get("startup_seconds", 0.0)
        if startup >= whole:  # the usable budget is its floor, 1 s
            lines.append(
                f"warning: the start-up took {startup:g} s of the {whole:g}-s budget; the run trains {left:g} s, "
                "evaluates, and ends late: a larger --max-minutes trains more"
            )
        elif left is not None and left < TIGHT_BUDGET * whole:
            evaluation = measured["eval_seconds"]
            late = startup + evaluation > whole  # the evaluation alone outlasts what start-up left
            ending = f": the run ends late, after about {minutes((startup + left + evaluation) / 60)}" if late else ""
            which = "the evaluations" if plan.eval_every else "the final evaluation"  # periodic: of the steps that fit
            lines.append(
                f"warning: of the {plan.budget_minutes:g}-min budget, {left:g} s are left to train after start-up "
                f"and {which} ({evaluation:g} s){ending}; a larger --max-minutes trains more"
            )
        return lines
    steps = (
        f"the remaining {plan.steps - plan.start_step:,} of {plan.steps:,} steps (resuming at step {plan.start_step:,})"
        if plan.start_step
        else f"{plan.steps:,} steps"
    )
    lines = [speed, f"estimated time: at least {minutes(measured['eta_minutes'])} for {steps}"]
    if plan.budget_minutes:  # a cut budget (run.budget_schedule=cut): the schedule is the recipe's
        lines.append(
            f"time budget {plan.budget_minutes:g} min, the schedule cut by it: this invocation stops when it is spent "
            "(unannealed where the steps outlast it), evaluates and saves; a re-run continues"
        )
    if not plan.budget_minutes and measured["eta_minutes"] > LONG_RUN_MINUTES:
        lines.append(
            f"warning: this run is planned for {minutes(measured['eta_minutes'])}; "
            "--max-minutes M fits every schedule into M minutes instead"
        )
    return lines


def minutes(value: float) -> str:
    return f"{value / 60:.1f} h" if value >= 90 else f"{value:.1f} min"


def _fit(plan: Plan) -> str:
    """The steps and epochs a budget without a length of its own holds: those of the seconds the final
    evaluation leaves (the estimate line's), else the plan's length."""
    if "fit_steps" in plan.measured:
        return f"{plan.measured['fit_steps']:,}, {plan.measured['fit_epochs']:.1f} epochs"
    return f"{plan.steps:,}, {plan.epochs:.1f} epochs"


def _flip_note(plan: Plan) -> str:
    """Where the source cannot tell whether a mirror image keeps its label, say which convention runs."""
    if "horizontal flip" in plan.augment and mirror_keeps_label(plan.data) is None:
        return (
            " (flips: the convention for natural images; --set augment.flip=false if a mirror image changes the label)"
        )
    return ""
