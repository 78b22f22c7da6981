"""plots/curves.png: a split is drawn in one colour in both panels (loss, top-1)."""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.colors import to_hex

from vitkit.train import plots


def test_each_split_has_one_colour_in_both_panels(tmp_path: Path, monkeypatch) -> None:
    """Each panel took colours from its own cycle: val was orange in the loss panel and blue in the accuracy one."""
    records = [{"step": s, "split": "train", "loss": 2.0 / s} for s in (1, 2, 3)]
    records += [{"step": s, "split": split, "loss": 1.0, "top1": 0.5} for split in ("val", "test") for s in (2, 3)]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    drawn = []
    monkeypatch.setattr(plots, "save_figure", lambda figure, path: drawn.append(figure) or path)
    plots.plot_curves(metrics, tmp_path / "curves.png")
    loss, accuracy = drawn[0].axes
    colours = {
        panel: {line.get_label().removesuffix(" top-1"): to_hex(line.get_color()) for line in axis.get_lines()}
        for panel, axis in (("loss", loss), ("accuracy", accuracy))
    }
    assert set(colours["loss"]) == {"train", "val", "test"} and set(colours["accuracy"]) == {"val", "test"}
    assert colours["accuracy"] == {split: colours["loss"][split] for split in ("val", "test")}
    assert len(set(colours["loss"].values())) == 3
