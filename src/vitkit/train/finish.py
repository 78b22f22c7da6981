"""How a run ends: what it says, and an evaluation that fails after the model was saved (the trainer saves and
exports the final model first, so a failing evaluation loses nothing)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vitkit.runs import METRICS, PLOTS
from vitkit.train.config import TrainConfig
from vitkit.train.plots import plot_curves
from vitkit.train.stop import SignalFlag

log = logging.getLogger("vitkit.train.trainer")


class EvaluationError(RuntimeError):
    """The final evaluation failed after the trained model was saved; the message names it and how to retry."""


def log_end(status: str, signum: int, step: int, steps: int, budget_minutes: float, given: bool = True) -> None:
    """The line a run ends with, by how it ended; `given`: `steps` is the run's own length (a cap), else the
    budget's estimate."""
    if status == "finished" and step < steps:
        log.info("time budget: schedule annealed at step %d (%s %d)", step, "at most" if given else "about", steps)
    if status == "time_budget":
        log.info("time budget of %.1f min spent at step %d/%d: stopping", budget_minutes, step, steps)
    if status == "interrupted":
        log.warning(
            "stopped by signal %d at step %d; checkpoint saved, re-run the same command to resume", signum, step
        )


def log_nothing_left(run_dir: Path, step: int) -> None:
    """A re-run of a finished run: instead of a plan whose estimates and warnings would read as a run to come."""
    log.info(
        "%s finished at step %d: nothing left to train (another --epochs or --max-minutes does not lengthen a run "
        "whose schedule has annealed: start a new one from its weights with --set run.init_from=%s); its final "
        "model is evaluated",
        run_dir,
        step,
        run_dir,
    )


def log_spent(budget_minutes: float, trained_s: float, step: int) -> None:
    """A resumed run whose time budget earlier invocations already spent: it takes no step, and ends unannealed."""
    log.warning(
        "the time budget of %g min was spent before this invocation (%.2f min trained): the run stops at step %d, "
        "its schedule not annealed; a larger --max-minutes trains it to its end",
        budget_minutes,
        trained_s / 60,
        step,
    )


@contextlib.contextmanager
def evaluation_failure(run_dir: Path, config: TrainConfig, checkpoint: str, metrics: Any) -> Iterator[None]:
    """Turn a failing final evaluation into an EvaluationError naming the saved model and `vitkit eval` to retry."""
    retry = f"evaluate it with `vitkit eval {run_dir} --data {config.data.uri}`"
    try:
        yield
    except KeyboardInterrupt:  # Ctrl-C: still an interruption (exit 130), but the model is not lost
        metrics.close()
        log.warning("interrupted during the final evaluation; the trained model is saved in %s: %s", checkpoint, retry)
        raise
    except Exception as err:
        metrics.close()
        first = (str(err).strip().splitlines() or [""])[0]
        raise EvaluationError(
            f"the final {config.eval.final_split} evaluation failed ({type(err).__name__}: {first}); the trained model "
            f"is saved in {checkpoint}: {retry}"
        ) from err


def close_metrics(metrics: Any, final: dict[str, Any] | None, run_dir: Path) -> int:
    """The final record, then the curves of metrics.jsonl.  The run has finished: neither a plot that fails
    nor a signal that lands now (Ctrl-C as the accuracy is shown) makes it fail; the signal is said, and
    returned (0: none) for a caller with more to run after this run (a study), which stops there."""
    with SignalFlag() as signals:
        if final is not None:
            metrics.write({**final, "final": True})
        metrics.close()
        try:
            plot_curves(run_dir / METRICS, run_dir / PLOTS / "curves.png")
        except Exception as err:
            log.warning("could not draw plots/curves.png: %s", err)
    if signals.signum:
        log.info("signal %d came as the run finished; the run is complete, nothing was stopped", signals.signum)
    return signals.signum or 0
