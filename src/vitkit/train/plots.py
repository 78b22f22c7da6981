"""plots/curves.png of a run: loss (train and evaluation) and top-1 accuracy against the optimiser step."""

from __future__ import annotations

from pathlib import Path

from vitkit.eval.plots import plt, save_figure
from vitkit.metrics_log import read_metrics

COLOURS = {"train": "C0", "val": "C1", "test": "C2"}  # a split is one colour in both panels


def plot_curves(metrics_path: Path, out_png: Path) -> Path:
    """Loss (train and eval) and top-1 accuracy (eval) against the optimiser step, as one PNG."""
    records = read_metrics(metrics_path)
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    train = [r for r in records if r.get("split") == "train" and r.get("loss") is not None]
    if train:
        ax_loss.plot(
            [r["step"] for r in train], [r["loss"] for r in train], label="train", lw=1, color=COLOURS["train"]
        )
    for split in ("val", "test"):
        rows = [r for r in records if r.get("split") == split and r.get("top1") is not None]
        if rows:
            steps, style = [r["step"] for r in rows], {"ms": 3, "color": COLOURS[split]}
            ax_loss.plot(steps, [r["loss"] for r in rows], "o-", label=split, **style)
            ax_acc.plot(steps, [100 * r["top1"] for r in rows], "o-", label=f"{split} top-1", **style)
    ax_loss.set(xlabel="step", ylabel="loss", title="loss")
    ax_acc.set(xlabel="step", ylabel="accuracy (%)", title="top-1 accuracy")
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.tight_layout()
    return save_figure(fig, out_png)
