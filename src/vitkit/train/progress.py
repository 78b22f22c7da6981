"""What a run shows while it trains: the tqdm bar (stderr, terminals only) and the train records of
metrics.jsonl (mean loss, gradient norm and objective metrics since the last record, learning rate,
images/s, training side)."""

from __future__ import annotations

import time
from typing import Any

import torch


class NoBar:
    """Stands in for tqdm where no bar is shown."""

    def update(self, n: int) -> None:
        pass

    def set_postfix(self, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(enabled: bool, steps: int, start: int, stream: Any) -> Any:
    """tqdm bar (steps, images/s, ETA) on `stream` when enabled and `stream` is a terminal."""
    if stream is None or not enabled or not getattr(stream, "isatty", lambda: False)():
        return NoBar()
    from tqdm import tqdm

    return tqdm(total=steps, initial=start, file=stream, unit="step", dynamic_ncols=True, smoothing=0.05)


class TrainRecords:
    """Collects step outputs (0-d tensors, read only when a record is due) into train records."""

    def __init__(self, step: int, batch_size: int, pending: list[dict[str, Any]] | None = None):
        self.pending = pending if pending is not None else []  # the train state's: a checkpoint keeps them
        self.batch_size = batch_size
        self.last_time, self.last_step = time.monotonic(), step

    def add(self, out: dict[str, Any]) -> None:
        self.pending.append(out)

    def record(self, step: int, epoch: float, **extra: Any) -> dict[str, Any] | None:
        """The record for the steps since the last one (None if every one was skipped); one host sync."""
        now = time.monotonic()
        images_per_s = (step - self.last_step) * self.batch_size / max(now - self.last_time, 1e-9)
        pending = list(self.pending)
        self.pending.clear()
        self.last_time, self.last_step = now, step
        good = [p for p in pending if not bool(p["skipped"])]
        if not good:
            return None
        means = {
            key: float(torch.stack([torch.as_tensor(p[key]).float().cpu() for p in good]).mean())
            for key in good[0]
            if key not in ("lr", "skipped")
        }
        means["grad_norm"] = means.pop("grad_norm")
        metrics = {k: (v if v == v else None) for k, v in means.items()}  # NaN (e.g. MPP pixel accuracy) -> null
        return {
            "step": step,
            "epoch": epoch,
            "split": "train",
            **metrics,
            "lr": good[-1]["lr"],
            "images_per_s": images_per_s,
            **extra,
        }
