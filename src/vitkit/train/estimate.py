"""A measured rehearsal before the clock starts: compiled graphs built, speed measured, the ETA computed.

`rehearse` runs forward + backward passes of blank batches laid out as the training ones, for every
(PatchDropout rate, side) phase the schedule still needs: the first pass of each compiles (under
torch.compile; one graph per phase), the next ones are timed.  It runs under a forked RNG and without
an optimiser step, and clears the gradients, so weights, gradients and random streams are exactly what
they would be without it.  `eta` turns the timings into images/s, the time the run will take and,
under a fitted budget, how many epochs fit.  The rehearsal leaves out what a real step adds to its passes:
making the batch (augmentation; data workers sharing the cores), clipping, the optimiser step (Muon's
Newton-Schulz iterations), logging.  `SpeedCheck` measures that per-step overhead on the first real steps
and the ETA is computed again with it (CIFAR-10 on a 2-core AMD EPYC: the rehearsal alone estimated 90.6
epochs in 30 minutes, the run trained 69.6).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import torch
from torch import nn

from vitkit.device import synchronize
from vitkit.train.plan import LONG_RUN_MINUTES, Plan
from vitkit.train.schedule import Schedule

Phase = tuple[float, int]  # (PatchDropout rate, side)
CHECK_SKIP = 5  # real steps the speed check leaves out: data workers starting, caches warming
CHECK_SECONDS = 60.0  # the check times about this long of real steps ...
CHECK_SHARE = 0.03  # ... and at most this share of a time budget


def rehearse(module: nn.Module, phases: list[Phase], run_once: Callable[[float, int], None], device: torch.device,
             *, timed: int = 2) -> tuple[float, dict[Phase, float]]:
    """Run `run_once(rate, side)` (one micro-batch forward + backward) 1 + `timed` times per phase.

    Returns the seconds spent in all and, per phase, the median seconds of the timed passes (the first
    pass of each phase, which compiles or warms caches, is not timed).  `module` is the bare model: it is
    put in training mode and its gradients are cleared afterwards, also when a pass fails.
    """
    start, was_training = time.monotonic(), module.training
    module.train()
    timings: dict[Phase, float] = {}
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            for rate, side in phases:
                seconds = []
                for index in range(1 + timed):
                    begin = time.perf_counter()
                    run_once(rate, side)
                    synchronize(device)
                    if index:
                        seconds.append(time.perf_counter() - begin)
                if seconds:
                    timings[(rate, side)] = sorted(seconds)[len(seconds) // 2]
    finally:  # also when compilation fails: the caller may go on eagerly
        module.train(was_training)
        for param in module.parameters():
            param.grad = None
    return time.monotonic() - start, timings


def eta(plan: Plan, schedule: Schedule, timings: dict[Phase, float], *, start_step: int = 0, eval_images: int = 0,
        budget_left_s: float | None = None, position: float | None = None, overhead_s: float = 0.0) -> dict[str, Any]:
    """Images/s, the minutes the run will take from `start_step`, and (fitted budget) the epochs that fit.

    A step costs `accumulation` micro-batch passes of its phase plus `overhead_s` (what `SpeedCheck`
    measured; a step never counts less than half its passes); an evaluation image costs a third of a
    training image at the model's side (forward only), with every patch.  The ETA weighs the phases by
    their steps, the epochs that fit a budget by their time (`_fit_steps`), from schedule fraction
    `position` (the budget clock's; default: the steps').
    """
    if not timings:
        return {}

    def seconds(rate: float, side: int) -> float:
        passes = plan.accumulation * timings.get((rate, side), max(timings.values()))
        return max(passes + overhead_s, passes / 2)

    step_s = [(end - begin, seconds(rate, side)) for begin, end, side, rate in schedule.spans()]
    mean_step_s = sum(length * seconds for length, seconds in step_s) / sum(length for length, _ in step_s)
    per_image_s = timings.get((0.0, plan.img_size), max(timings.values())) / plan.micro_batch
    evals = (plan.steps // plan.eval_every if plan.eval_every else 0) + 1
    eval_s = evals * eval_images * per_image_s / 3
    train_s = (plan.steps - start_step) * mean_step_s
    out = {"images_per_s": round(plan.global_batch / mean_step_s, 1), "step_seconds": round(mean_step_s, 4),
           "eta_minutes": round((train_s + eval_s) / 60, 2)}
    if budget_left_s is not None:
        spans = [(begin, end, seconds) for (begin, end, *_), (_, seconds) in zip(schedule.spans(), step_s)]
        start = start_step / plan.steps if position is None else position
        fit_steps = _fit_steps(spans, plan.steps, start, max(0.0, budget_left_s - eval_s))
        out["fit_epochs"] = round((start_step + fit_steps) * plan.global_batch / plan.num_train, 1)
        out["eta_minutes"] = round(min(out["eta_minutes"], budget_left_s / 60), 2)
    return out


def _fit_steps(spans: list[tuple[float, float, float]], steps: int, start: float, seconds: float) -> float:
    """Steps that fit in `seconds` under a fitted budget, from schedule fraction `start`.

    The budget clock maps what is left of the schedule onto the time left, so each phase gets its share of
    the time (not of the steps) and runs at its own speed: a PatchDropout phase planned for 80% of the
    schedule takes 80% of the time and holds more than 80% of the steps.  A phase holds at most its planned
    steps (a machine fast enough for the steps to lead moves on early).
    """
    left = [(max(begin, start), end, step_s) for begin, end, step_s in spans if end > start]
    total = sum(end - begin for begin, end, _ in left)
    if total <= 0:
        return 0.0
    return sum(min((end - begin) / total * seconds / step_s, (end - begin) * steps) for begin, end, step_s in left)


class SpeedCheck:
    """The rehearsal's speed checked on real steps: the per-step overhead its passes leave out.

    Times the steps [begin, end) of one phase, whole (batch, passes, optimiser, logging) and returns the
    seconds a real step takes beyond the rehearsed passes of that phase.  The overhead does not depend
    on the tokens (the batch and the optimiser step are the same in every phase), so `eta` adds it to every
    phase.  The window is a count of steps, the same on every process; it aims at CHECK_SECONDS of steps
    (at most CHECK_SHARE of a budget and a quarter of the steps left), at least 10.  A window that crosses a
    phase change measures nothing; `ends_in(steps)` says whether the window ends before the run does.
    """

    def __init__(self, timings: dict[Phase, float], accumulation: int, start_step: int, step_s: float,
                 budget_s: float | None, total_steps: int):
        self.timings, self.accumulation = timings, accumulation
        target = CHECK_SECONDS if budget_s is None else min(CHECK_SECONDS, CHECK_SHARE * budget_s)
        self.begin = start_step + CHECK_SKIP
        self.end = self.begin + max(10, min(round(target / max(step_s, 1e-6)), (total_steps - self.begin) // 4))
        self._began: tuple[float, Phase] | None = None

    def ends_in(self, steps: int) -> bool:
        return self.end < steps

    def observe(self, step: int, clock: Callable[[], float], phase: Phase) -> float | None:
        """Call after every step (`step`: steps done; `clock`: read at the window's ends only); at the window's
        end, the overhead in seconds per step."""
        if step == self.begin:
            self._began = (clock(), phase)
        elif step == self.end and self._began is not None and self._began[1] == phase and phase in self.timings:
            real_s = (clock() - self._began[0]) / (self.end - self.begin)
            return real_s - self.accumulation * self.timings[phase]
        return None


def checked(plan: Plan, schedule: Schedule, check: SpeedCheck, overhead_s: float, *, step: int, position: float,
            eval_images: int, budget_left_s: float | None) -> dict[str, Any]:
    """`plan.measured` again from step `step` (schedule position `position`, in steps) with the overhead the
    check measured; "checked" keeps the window and the rehearsal's figures beside the new ones."""
    before = plan.measured
    measured = eta(plan, schedule, check.timings, start_step=step, eval_images=eval_images, budget_left_s=budget_left_s,
                   position=position / plan.steps, overhead_s=overhead_s)
    rehearsed = {key: before[key] for key in ("images_per_s", "eta_minutes", "fit_epochs") if key in before}
    return {**measured, "checked": {"steps": [check.begin, check.end], "overhead_ms": round(1e3 * overhead_s, 2),
                                    "rehearsal": rehearsed}}


def check_lines(plan: Plan) -> list[str]:
    """What the speed check found, in words (logged once it has run)."""
    measured, check = plan.measured, plan.measured["checked"]
    window, rehearsed = check["steps"], check["rehearsal"]
    line = (f"speed check over steps {window[0]:,}-{window[1]:,}: {measured['images_per_s']:,.0f} images/s over the "
            f"schedule (the rehearsal: {rehearsed.get('images_per_s', 0):,.0f}; {check['overhead_ms']:g} ms a step "
            "beyond the forward and backward passes)")
    if plan.fitted:
        return [line, f"about {measured.get('fit_epochs', 0):g} epochs fit in the budget (the rehearsal: "
                      f"{rehearsed.get('fit_epochs', 0):g})"]
    return [line, f"estimated time left: {_minutes(measured['eta_minutes'])} (the rehearsal: "
                  f"{_minutes(rehearsed.get('eta_minutes', 0))} for the whole run)"]


def eta_lines(plan: Plan) -> list[str]:
    """The measured part of the plan, in words; a long unbudgeted run says so and names --max-minutes."""
    measured = plan.measured
    if not measured:
        return []
    lines = [f"measured speed: {measured['images_per_s']:,.0f} images/s ({plan.device}, {plan.precision})"]
    if plan.fitted:
        lines.append(f"time budget {plan.budget_minutes:g} min, schedule fitted to it: about "
                     f"{measured.get('fit_epochs', 0):g} of at most {plan.epochs:.1f} epochs fit; it ends annealed")
    else:
        lines.append(f"estimated time: {_minutes(measured['eta_minutes'])} for {plan.steps:,} steps "
                     f"({plan.epochs:.1f} epochs)")
    if "check_steps" in measured:
        first, last = measured["check_steps"]
        again = ("the estimate and the regularisation decision are made" if measured.get("check_decides")
                 else "the estimate is made")
        lines.append(f"speed check: steps {first:,}-{last:,} are timed whole (batch, passes, optimiser), and {again} "
                     "again from them")
    if not plan.budget_minutes and measured["eta_minutes"] > LONG_RUN_MINUTES:
        lines.append(f"warning: this run is planned for {_minutes(measured['eta_minutes'])}; "
                     "--max-minutes M fits every schedule into M minutes instead")
    return lines


def _minutes(value: float) -> str:
    return f"{value / 60:.1f} h" if value >= 90 else f"{value:.1f} min"
