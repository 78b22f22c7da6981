"""Figures of the study reports, drawn like the paper's: one PNG of side-by-side panels, the paper's own
numbers in one panel where it gives numbers, vitkit's measured ones (mean over seeds, error bar = seed
standard deviation) in the other.

A `Panel` is a list of `Series`; kind "line" (x numeric, optionally log), "bar" (x are category
names; series side by side) or "scatter" (one dot per value, e.g. per head).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

from vitkit.eval.plots import save_figure  # noqa: E402

MARKERS = {"vit": "o", "resnet": "s", "hybrid": "D"}
COLORS = {"vit": "tab:blue", "resnet": "tab:red", "hybrid": "tab:green"}


@dataclass
class Series:
    label: str
    xs: Sequence  # numbers, or category names for bars
    ys: Sequence[float]
    errs: Sequence[float] | None = None  # seed standard deviations (None: not measured)
    marker: str = "o"
    dashed: bool = False
    line: bool = True  # False: markers only
    color: str | None = None


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: list[Series] = field(default_factory=list)
    kind: str = "line"  # "line", "bar" or "scatter"
    xlog: bool = False
    ylog: bool = False
    ylim: tuple[float, float] | None = None
    hline: tuple[float, str] | None = None  # a reference level and its label
    xticks: Sequence[float] | None = None  # label exactly these x values (e.g. the learning rates tried)


def draw(path: Path, panels: Sequence[Panel], width: float = 4.4, height: float = 3.4) -> Path:
    """Write the panels side by side into `path` (PNG)."""
    figure, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), height), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        {"line": _lines, "bar": _bars, "scatter": _scatter}[panel.kind](ax, panel)
        ax.set_title(panel.title, fontsize=9)
        ax.set_xlabel(panel.xlabel, fontsize=8)
        ax.set_ylabel(panel.ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        if panel.xlog:
            ax.set_xscale("log")
        if panel.ylog:
            ax.set_yscale("log")
        if panel.ylim:
            ax.set_ylim(*panel.ylim)
        if panel.xticks is not None:
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
            ax.set_xticks(list(panel.xticks), [f"{x:g}" for x in panel.xticks])
        if panel.hline:
            ax.axhline(panel.hline[0], color="grey", linestyle=":", linewidth=1, label=panel.hline[1])
        ax.grid(alpha=0.3)
        if any(s.label for s in panel.series):
            ax.legend(fontsize=6)
    figure.tight_layout()
    return save_figure(figure, path)


def _lines(ax, panel: Panel) -> None:
    for series in panel.series:
        errs = series.errs if series.errs is not None and any(e for e in series.errs) else None
        style = ("--" if series.dashed else "-") if series.line else "none"
        ax.errorbar(
            series.xs,
            series.ys,
            yerr=errs,
            marker=series.marker,
            markersize=4,
            capsize=2,
            linewidth=1.2,
            linestyle=style,
            label=series.label,
            color=series.color,
        )


def _bars(ax, panel: Panel) -> None:
    categories = list(dict.fromkeys(x for s in panel.series for x in s.xs))
    present = {c: [i for i, s in enumerate(panel.series) if c in list(s.xs)] for c in categories}
    width = 0.8 / max(len(panel.series), 1)
    for i, series in enumerate(panel.series):
        xs = [categories.index(x) + (present[x].index(i) - (len(present[x]) - 1) / 2) * width for x in series.xs]
        errs = series.errs if series.errs is not None and any(e for e in series.errs) else None
        ax.bar(xs, series.ys, width=width, yerr=errs, capsize=2, label=series.label, color=f"C{i}")
    ax.set_xticks(range(len(categories)))
    ax.set_xticklabels(categories, fontsize=7, rotation=20, ha="right")
    values = [y for s in panel.series for y in s.ys if not math.isnan(y)]
    if values and panel.ylim is None:  # bars of accuracies: zoom on the differences, as Table 8's digits do
        low, high = min(values), max(values)
        pad = max(high - low, 1e-3) * 0.6
        ax.set_ylim(max(low - pad, 0.0), high + pad)


def _scatter(ax, panel: Panel) -> None:
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # layers
    for series in panel.series:
        ax.scatter(series.xs, series.ys, s=14, marker=series.marker, label=series.label, alpha=0.8)


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return mean, sd
