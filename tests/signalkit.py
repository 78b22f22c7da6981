"""A stop signal sent at a chosen moment of a run, as a scheduler's `kill PID` would send it."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any


def sigterm_on_first_call(real: Callable[..., Any]) -> tuple[Callable[..., Any], list[int]]:
    """`real`, sending this process SIGTERM as it is first called; and the list that counts its calls."""
    calls: list[int] = []

    def terminated(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(*args)

    return terminated, calls
