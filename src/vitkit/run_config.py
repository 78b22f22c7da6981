"""How a re-run's requested config meets the config stored in its run directory.

A re-run continues with the stored config, except the VOLATILE keys (time budget, display, hardware,
cadence), which come from the request; a request that differs in a FOREIGN key (other data, other weights,
another subset of labels) or in the model is another run, refused in that directory.  The layout of a run
directory is vitkit.runs'.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

# Keys of config.json a re-run may change without forking the run: budget, display, hardware, cadence.
VOLATILE = frozenset(
    {
        "run.max_minutes",
        "run.progress",
        "run.out",
        "run.device",
        "run.threads",
        "run.tensorboard",
        "run.log_every",
        "run.checkpoint_every",
        "run.checkpoint_minutes",
        "data.workers",
    }
)
# Keys that make a request another run (other weights to start from, other images to train on): refused in
# a directory that holds a run, as another model (model.*) is.
GROUP_KEYS = ("model", "data", "augment", "optim", "eval", "run", "mpp")  # a run config's groups of fields
MAX_CONFIG_BYTES = 1 << 24  # a run's config.json is a few kB; past this it is damage
FOREIGN = frozenset({"data.uri", "run.init_from", "data.labels_per_class", "data.train_fraction"})


def read_stored(path: Path) -> dict[str, Any]:
    """A run's config.json, read as untrusted: bounded in size and depth, a JSON object of field groups."""
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"{path} is {path.stat().st_size:,} bytes, no run's config; the run directory is damaged")
    try:
        stored = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as err:  # not JSON, not UTF-8, or nested past the parser's depth
        raise ValueError(
            f"{path} is not valid JSON ({type(err).__name__}: {err}); the run directory is damaged"
        ) from None
    if not isinstance(stored, dict) or not all(isinstance(stored.get(k), dict | None) for k in GROUP_KEYS):
        raise ValueError(
            f"{path} is not a JSON object of field groups: no vitkit run's config, or a damaged one; choose "
            "another --out (a run's checkpoints resume with this command once its config.json is removed)"
        )
    return stored


def reconcile(
    stored: dict[str, Any],
    requested: dict[str, Any],
    length_bounds_budget: Collection[str],
    path: Path,
    *,
    length_given: bool = True,
) -> tuple[dict[str, Any], list[str]]:
    """The config the run in `path` continues with, and the keys where the request differed.  A request without
    a budget keeps the stored one where it decided the run's length: no length of its own, or a recipe of
    `length_bounds_budget` (whose epochs only cap a budgeted run).  That kept budget is no change to warn of, nor
    is the recipe's length a request without `length_given` (--epochs, data.epochs, data.steps) comes with."""
    merged = json.loads(json.dumps(stored))
    for key in VOLATILE:
        group, name = key.split(".")
        if group in requested and name in requested[group]:
            merged.setdefault(group, {})[name] = requested[group][name]
    bounded = _budget_is_length(stored) or stored.get("recipe") in length_bounds_budget
    asked = _spelt_as_stored(json.loads(json.dumps(requested)), merged)
    if bounded and not merged["run"].get("max_minutes"):  # its budget is (or caps) its length
        merged["run"]["max_minutes"] = stored["run"]["max_minutes"]
        asked.setdefault("run", {})["max_minutes"] = stored["run"]["max_minutes"]  # kept as documented: no change
        if _budget_is_length(stored) and not length_given:  # the recipe's epochs, not the user's
            asked.setdefault("data", {}).update({k: stored["data"].get(k) for k in ("epochs", "steps")})
    changed = sorted(_diff(merged, asked))
    foreign = [key for key in changed if key in FOREIGN or key.startswith("model.")]
    if foreign:
        raise ValueError(
            f"{path} holds a run with another {', '.join(foreign[:4])}; choose another --out for a new "
            "run (or re-run the command that made it to resume it)"
        )
    return merged, changed


def _budget_is_length(config: dict[str, Any]) -> bool:
    """A run whose length is its fitted time budget: no epochs, no steps, a positive run.max_minutes."""
    data, run = config.get("data", {}), config.get("run", {})
    return not data.get("epochs") and not data.get("steps") and (run.get("max_minutes") or 0) > 0


def _spelt_as_stored(requested: dict[str, Any], stored: dict[str, Any]) -> dict[str, Any]:
    """`requested` with its data source and starting checkpoint spelt as the stored run's where both name the
    same file (a relative path against an absolute one, or through a link): that is not another run."""
    for group, name in (("data", "uri"), ("run", "init_from")):
        new, old = requested.get(group, {}).get(name), stored.get(group, {}).get(name)
        if isinstance(new, str) and isinstance(old, str) and new != old and _place(new) == _place(old):
            requested[group][name] = old
    return requested


def same_source(first: str, second: str) -> bool:
    """Whether two data URIs (or checkpoint paths) name one source, however spelt; an empty one names none."""
    return bool(first) and bool(second) and (first == second or _place(first) == _place(second))


def canonical_source(spec: str) -> str:
    """A data URI or checkpoint path with its path made real ("folder:photos" -> "folder:/home/me/photos"), for
    comparing processes' configs; a spec without a path ("digits") as given."""
    kind, path = _place(spec)
    if not kind and "/" not in spec and not os.path.exists(spec):  # a name ("digits"), not a path
        return spec
    return f"{kind}:{path}" if kind else path


def _place(spec: str) -> tuple[str, str]:
    """A source URI or checkpoint path as (kind, real path): "folder:photos" and "folder:/home/me/photos" agree."""
    kind, sep, path = spec.partition(":")
    if not sep or len(kind) < 2:  # a plain path (or a Windows drive letter)
        kind, path = "", spec
    return kind, os.path.realpath(path) if path else ""


def _diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    keys = set(old) | set(new)
    out = []
    for key in keys:
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}")
    return out
