"""Figures of the evaluation verbs: the confusion matrix; `save_figure` writes any figure atomically."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never open a window

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from vitkit.atomic import atomic_write  # noqa: E402


def save_figure(figure: plt.Figure, path: Path) -> Path:
    """Write `figure` as PNG to `path` atomically and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write(path, lambda tmp: figure.savefig(tmp, format="png", dpi=110, bbox_inches="tight"))
    finally:
        plt.close(figure)
    return path


def plain(name: str) -> str:
    """A class name as text a figure can draw: a folder's name that is not UTF-8 (its bytes kept as surrogates)
    with those bytes as \\x escapes, any other lone surrogate (a JSON escape), and a character the figures' font
    has no glyph for (CJK in DejaVu Sans: an empty box and a warning each), as \\u; `$` stays a dollar sign
    where the caller turns off mathtext."""
    try:
        text = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate outside the escaped bytes' range
        text = name.encode("utf-8", "backslashreplace").decode("utf-8")
    drawn = _glyphs()
    return "".join(c if ord(c) in drawn or c.isspace() else c.encode("unicode_escape").decode("ascii") for c in text)


@functools.cache
def _glyphs() -> frozenset[int]:
    """The characters the figures' default font draws."""
    from matplotlib import font_manager
    from matplotlib.ft2font import FT2Font

    return frozenset(FT2Font(font_manager.findfont(font_manager.FontProperties())).get_charmap())


def plot_confusion(confusion: Sequence[Sequence[int]], class_names: Sequence[str], path: Path) -> Path:
    """Confusion matrix: rows = true class, columns = predicted class; counts written in the cells when few."""
    matrix = np.asarray(confusion, dtype=np.int64)
    size = len(class_names)
    figure, ax = plt.subplots(figsize=(min(2 + 0.45 * size, 16), min(1.6 + 0.45 * size, 16)))
    image = ax.imshow(matrix, cmap="Blues")
    ticks = range(size) if size <= 50 else []
    ax.set_xticks(list(ticks))
    ax.set_yticks(list(ticks))
    if size <= 50:
        names = [plain(name) for name in class_names]
        ax.set_xticklabels(names, rotation=90, fontsize=7, parse_math=False)
        ax.set_yticklabels(names, fontsize=7, parse_math=False)
    if size <= 12:  # counts in the cells (text is slow to render; the JSON has them all)
        limit = matrix.max() / 2 if matrix.size else 0
        for (i, j), value in np.ndenumerate(matrix):
            ax.text(j, i, str(value), ha="center", va="center", fontsize=6, color="white" if value > limit else "black")
    ax.set_xlabel("Predicted class")
    ax.set_ylabel("True class")
    figure.colorbar(image, ax=ax, shrink=0.7)
    ax.set_title(f"Confusion matrix ({int(matrix.sum())} images)", fontsize=9)
    return save_figure(figure, path)
