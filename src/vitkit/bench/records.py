"""Run records as data: one JSON object per measured run, appended to a `.jsonl` file (STYLE.md section 8).

A row says when and where it was measured (UTC date, the git commit, the command, the host class: CPU
model and x86 family/model (`cpu_id`), ISA level, native bf16, threads, torch version, and any
torch/oneDNN setting that restricts the host, as an emulated class) beside the caller's figures.  The
benchmark scripts append their rows to `benchmarks/results/<name>.jsonl`; prose cites rows, it never is the
only copy.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vitkit import host as hosts
from vitkit.atomic import atomic_write_text

# torch's and oneDNN's own settings that make this machine behave as a lesser host class
EMULATION_VARS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
RESULTS = "benchmarks/results"  # where the scripts' rows go, from the repository's root


def git_commit(cwd: str | os.PathLike | None = None) -> str:
    """The checked-out commit (short), "+dirty" when tracked files differ from it; "" outside a git tree.

    Rows appended to benchmarks/results/ do not count: a queue of benchmarks writes one row after another."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ":(top)", f":(top,exclude){RESULTS}"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return head + ("+dirty" if dirty else "")


# The commit of the code this process runs, read when it started (imported this module): a benchmark that
# writes its row an hour later names that code, not whatever was checked out by then.
COMMIT = git_commit(Path(__file__).resolve().parent)


def context(
    command: Iterable[str] | None = None, config_changes: Iterable[str] = (), device: str = "cpu"
) -> dict[str, Any]:
    """The fields every row carries: date, commit (COMMIT), command, config changes and the host."""
    emulated = {name: os.environ[name] for name in EMULATION_VARS if os.environ.get(name)}
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": COMMIT,
        "command": " ".join(command if command is not None else [Path(sys.argv[0]).name, *sys.argv[1:]]),
        "config_changes": list(config_changes),
        **hosts.current(device).to_dict(),
        **({"emulated": emulated} if emulated else {}),
    }


def append_row(
    path: str | os.PathLike,
    figures: dict[str, Any],
    *,
    command: Iterable[str] | None = None,
    config_changes: Iterable[str] = (),
    device: str = "cpu",
) -> dict[str, Any]:
    """Append one row (the context, then `figures`) to the `.jsonl` file at `path`; returns the row.

    The file is rewritten whole through a temporary file, so a killed process leaves it as it was.
    """
    row = {**context(command, config_changes, device), **figures}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    before = path.read_text(encoding="utf-8") if path.exists() else ""
    if before and not before.endswith("\n"):
        before += "\n"
    atomic_write_text(path, before + json.dumps(row, sort_keys=False) + "\n")
    return row


def read_rows(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every row of a results file, in order."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
