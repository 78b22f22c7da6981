"""The study tests train many tiny runs: skip each run's training-curve figure (0.5-1 s of matplotlib per run),
which the engine's own tests cover."""

from __future__ import annotations

import sys

import pytest

from vitkit.train import plots, trainer  # noqa: F401  (trainer: the engine's modules are loaded before the scan)


@pytest.fixture(autouse=True)
def _no_curve_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    # Whichever engine module draws the curves imported the function by name: replace it there.
    users = [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("vitkit.")
        and module is not plots
        and getattr(module, "plot_curves", None) is plots.plot_curves
    ]
    assert users, "no engine module calls train.plots.plot_curves: update this fixture"
    for module in users:
        monkeypatch.setattr(module, "plot_curves", lambda *args, **kwargs: None)
