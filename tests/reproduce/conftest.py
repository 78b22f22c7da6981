"""The study tests train many tiny runs: skip each run's training-curve figure (0.5-1 s of matplotlib per run),
which the engine's own tests cover."""

from __future__ import annotations

import pytest

from vitkit.train import trainer


@pytest.fixture(autouse=True)
def _no_curve_plots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trainer, "plot_curves", lambda *args, **kwargs: None)
