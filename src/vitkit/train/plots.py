"""The run's records: metrics.jsonl (one JSON object per line), TensorBoard events, plots/curves.png."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class MetricsLog:
    """Appends records to `metrics.jsonl` (flushed per line) and mirrors scalars to TensorBoard if installed."""

    def __init__(self, run_dir: Path, *, enabled: bool, tensorboard: bool):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled = enabled
        self.writer = None
        if enabled and tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(str(Path(run_dir) / "tensorboard"))
            except Exception:  # tensorboard not installed (or broken): the JSONL log is enough
                self.writer = None

    def truncate_after(self, step: int) -> None:
        """Drop records logged after `step` (written after the checkpoint a resumed run restarts from)."""
        if not self.enabled or not self.path.is_file():
            return
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut by a kill -9
                continue
            if record.get("step", 0) <= step and not record.get("final"):
                kept.append(line)
        from vitkit.checkpoints.native import atomic_write_text

        atomic_write_text(self.path, "".join(k + "\n" for k in kept))

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.writer is not None:
            split = record.get("split", "train")
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step", "epoch"):
                    self.writer.add_scalar(f"{split}/{key}", value, record.get("step", 0))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def read_metrics(path: Path) -> list[dict[str, Any]]:
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def plot_curves(metrics_path: Path, out_png: Path) -> Path:
    """Loss (train and eval) and top-1 accuracy (eval) against the optimiser step, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    train = [r for r in records if r.get("split") == "train" and "loss" in r]
    if train:
        ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train", lw=1)
    for split in ("val", "test"):
        rows = [r for r in records if r.get("split") == split and "top1" in r]
        if rows:
            ax_loss.plot([r["step"] for r in rows], [r["loss"] for r in rows], "o-", label=split, ms=3)
            ax_acc.plot([r["step"] for r in rows], [100 * r["top1"] for r in rows], "o-", label=f"{split} top-1", ms=3)
    ax_loss.set(xlabel="step", ylabel="loss", title="loss")
    ax_acc.set(xlabel="step", ylabel="accuracy (%)", title="top-1 accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    from vitkit.checkpoints.native import atomic_write

    atomic_write(out_png, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
    plt.close(fig)
    return out_png
