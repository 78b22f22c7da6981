"""A run's metrics.jsonl: one JSON object a line, appended as the run goes (the trainer's records and
evaluations), mirrored to TensorBoard where it is installed; read back with torn lines (a kill -9) skipped.
The run directory's layout is vitkit.runs's; this module owns the file's format."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from vitkit.atomic import atomic_write_text

log = logging.getLogger(__name__)

METRICS, TENSORBOARD = "metrics.jsonl", "tensorboard"  # a run's files of metrics


class MetricsLog:
    """Appends records to metrics.jsonl (flushed per line) and mirrors scalars to TensorBoard if installed."""

    def __init__(self, run_dir: Path, *, enabled: bool, tensorboard: bool):
        self.path = Path(run_dir) / METRICS
        self.enabled = enabled
        self.writer = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(Path(run_dir) / TENSORBOARD))
            except ImportError:  # tensorboard not installed: the JSONL log is enough
                pass
            except Exception as error:  # noqa: BLE001 - a broken install or an unwritable directory: said, not fatal
                log.warning("TensorBoard logging is off: %s: %s", type(error).__name__, error)

    def truncate_after(self, step: int) -> None:
        """Drop records logged after `step` (written after the checkpoint a resumed run restarts from)."""
        if not self.enabled or not self.path.is_file():
            return
        kept = [line for line, record in _lines(self.path) if record.get("step", 0) <= step and not record.get("final")]
        atomic_write_text(self.path, "".join(k + "\n" for k in kept))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.writer is not None:
            split = record.get("split", "train")
            for key, value in record.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step", "epoch"):
                    self.writer.add_scalar(f"{split}/{key}", value, record.get("step", 0))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The records of a metrics file, each a JSON object with an integer step where it has one; other lines
    (one cut by a kill -9, or damage: a list, a step of text, nesting past the parser's depth) are dropped."""
    out = []
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            continue
        step = record.get("step", 0) if isinstance(record, dict) else None
        if isinstance(step, int) and not isinstance(step, bool):
            out.append((line, record))
    return out


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl (or of RUN/metrics.jsonl for a run directory); torn lines skipped."""
    path = Path(path)
    return [record for _, record in _lines(path / METRICS if path.is_dir() else path)]
