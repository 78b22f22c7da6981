"""The run directory, owned here and nowhere else (DESIGN.md "A run").

    RUN/config.json            the full resolved config (what ran; on resume, what keeps running)
    RUN/metrics.jsonl          one JSON object per logged step / evaluation; the last line of a finished run
                               is the final evaluation
    RUN/checkpoints/step_NNNNNNN/   the model in vitkit's format + train_state.pt (optimiser, RNG, data position)
    RUN/checkpoints/LATEST     the name of the newest complete step_* checkpoint
    RUN/checkpoints/final/     the evaluated model of a finished run (the Polyak average when enabled; the step
                               it is of in its provenance: vitkit.run_model picks it by that)
    RUN/checkpoints/ema/       the Polyak-averaged weights (runs with optim.ema_decay > 0)
    RUN/checkpoints/unreadable-step_NNNNNNN/   a step a resume could not read and passed over, set aside
    RUN/sweep/lr_*/, RUN/sweep.json   an LR sweep's trial runs and its record (`--lr-sweep`)
    RUN/plots/, RUN/tensorboard/

A step checkpoint is written under a temporary name and renamed, then LATEST is replaced atomically,
so a crash at any moment leaves the previous checkpoint intact and LATEST naming a complete one.
`find_checkpoint(path)` is what every verb and `vitkit.load` use to turn a run directory into the
checkpoint it stands for.  `reconcile` is the one resume policy of every objective: the stored
config wins over a different request (the run keeps its own settings), volatile keys aside.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import re
import shutil
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import torch

from vitkit import atomic, run_config
from vitkit.atomic import atomic_write_text, fsync_dir
from vitkit.checkpoints import native, tensorfile
from vitkit.checkpoints.validate import unreadable_now
from vitkit.metrics_log import METRICS, MetricsLog
from vitkit.run_model import EMA, FINAL, standing, step_number

log = logging.getLogger(__name__)
_STEP = re.compile(r"step_\d+")  # a step checkpoint's name (save_step writes 7 digits)

CHECKPOINTS, LATEST = "checkpoints", "LATEST"
CONFIG, STATE_FILE, PLOTS = "config.json", "train_state.pt", "plots"
# What reading a damaged step checkpoint raises (a failed SHA-256, a cut-short or garbled train_state.pt)
UNREADABLE = (ValueError, RuntimeError, OSError, EOFError, AttributeError, pickle.UnpicklingError)
SWEEP, SWEEP_RECORD = "sweep", "sweep.json"  # an LR sweep's trials and record, written before the run's config
KEEP = 2  # step checkpoints kept besides the newest
_NAMED_UNFINISHED: set[tuple[Path, Path]] = set()  # run directories said to have no final model (find_checkpoint)
UNREADABLE_PREFIX = "unreadable-"  # a step a resume passed over, kept beside the others (never resumed from)
_SAID: set[tuple[str, str, str]] = set()  # (LATEST, what it names, the step used) already warned of
FULL_DISK = 1 << 20  # bytes free below which a failed write is taken for a full disk


def _save_state(payload: dict[str, Any], path: Path) -> None:
    """torch.save, whose write failures on a full disk read "[enforce fail at inline_container.cc] unexpected
    pos": raised as the OSError (ENOSPC) it is where the disk has under FULL_DISK bytes left."""
    try:
        torch.save(payload, path)
    except RuntimeError as error:
        if shutil.disk_usage(path.parent).free < FULL_DISK:
            raise OSError(errno.ENOSPC, f"No space left on device ({error})", str(path)) from error
        raise


class RunDir:
    """One run directory: its layout, checkpoints, stored config and metrics."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.checkpoints = self.path / CHECKPOINTS
        self.loaded: set[Path] = set()  # step checkpoints read whole (hashed) by a resume: kept with no second hash

    def sweep_trial(self, lr: float) -> RunDir:
        """The run directory of its LR sweep's trial at learning rate `lr`."""
        return RunDir(self.path / SWEEP / f"lr_{lr:g}")

    def sweep_trials(self) -> list[RunDir]:
        """The run directories of its LR sweep's trials, by name ([] without a sweep)."""
        return [RunDir(p) for p in sorted((self.path / SWEEP).glob("*/"))]  # "*/": directories alone

    def create(self) -> None:
        """The directory, made where it is free or holds a vitkit run; never over a file, or where its config.json
        is another's (a model checkpoint's, a project's), which the run's config would replace."""
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"{self.path} is a file; choose another --out for the run (a directory)")
        stored = self.stored_config()  # a JSON object, or None without config.json
        if stored is None and self.path.is_dir() and not self.checkpoints.is_dir() and _others(self.path):
            raise ValueError(
                f"{self.path} holds files and is not a vitkit run (no {CONFIG}); choose a new or empty directory "
                "for --out"
            )
        if stored is not None and not all(isinstance(stored.get(key), dict) for key in ("model", "data", "run")):
            raise ValueError(
                f"{self.path} is not a vitkit run: its {CONFIG} is another's (a model checkpoint's?), which the "
                "run's would replace; choose another --out for the run"
            )
        self.path.mkdir(parents=True, exist_ok=True)
        _writable(self.path, "choose another --out")  # named now, not by the temporary of the first file written

    @contextmanager
    def locked(self) -> Iterator[None]:
        """The directory, made (`create`) and locked (`lock`) while the block runs; what a killed run left
        half-written in it (its files' and plots' temporaries) is removed once the lock is held, and a
        `checkpoints/` that cannot be written is refused before the run trains."""
        self.create()
        descriptor = self.lock()
        try:
            for directory in (self.path, self.path / PLOTS, self.checkpoints):
                atomic.remove_torn(directory)
            self._check_checkpoints()
            yield
        finally:
            atomic.unlock_directory(descriptor)

    def _check_checkpoints(self) -> None:
        """A ValueError where `checkpoints/` exists and cannot take a file: the first save would fail minutes in."""
        if self.checkpoints.exists() or self.checkpoints.is_symlink():
            _writable(self.checkpoints, "the run saves its checkpoints there: make it a directory this user may "
                      "write, or choose another --out")  # fmt: skip

    def lock(self) -> int | None:
        """An exclusive lock on the directory (`atomic.lock_directory`) for as long as a run trains in it; a
        ValueError where another process holds it.  The descriptor to pass to `atomic.unlock_directory`, or None
        where the platform has no flock."""
        try:
            return atomic.lock_directory(self.path)
        except BlockingIOError:
            raise ValueError(
                f"{self.path} is in use by another vitkit process (a run training there now); wait for it to end, "
                "or choose another --out"
            ) from None

    # ----------------------------------------------------------------------------- checkpoints
    def latest(self, *, with_state: bool = True) -> Path | None:
        """The complete step checkpoint LATEST names, or None without LATEST.  Where it names a missing or
        incomplete one (or no step of this run), the newest complete step checkpoint, said in a warning; an
        error where there is none (removing LATEST then starts the run over).

        `with_state=False` asks only for the model (reading, not resuming): train_state.pt may be absent.
        """
        pointer = self.checkpoints / LATEST
        if not pointer.is_file():
            return None
        with open(pointer, "rb") as file:  # a step's name: more than that is damage, never read whole
            named = file.read(64).decode("utf-8", "replace").strip()
        try:
            if _STEP.fullmatch(named) and self._complete(self.checkpoints / named, with_state):
                return self.checkpoints / named
        except OSError as error:  # a storage error reading its config.json (validate.NOT_NOW): not incomplete
            raise unreadable_now(self.checkpoints / named, error, pointer) from error
        steps = [
            p for p in self.checkpoints.glob("step_*") if _STEP.fullmatch(p.name) and self._complete(p, with_state)
        ]
        if not steps:
            raise ValueError(
                f"{pointer} names {named[:80]!r}, which is missing or incomplete, and no other step checkpoint is "
                f"complete; remove {pointer} to start over"
            )
        newest = max(steps, key=step_number)
        said = (str(pointer.resolve()), named, newest.name)
        if said in _SAID:  # a resume and the verbs read LATEST several times
            return newest
        _SAID.add(said)
        log.warning(
            "%s names %r, which is missing or incomplete; using %s, the newest complete step checkpoint",
            pointer,
            named[:80],
            newest.name,
        )
        return newest

    def resume_candidates(self) -> list[Path]:
        """Where a resume may start, in order: `latest()`, then the older complete step checkpoints, newest
        first (for when the newer ones' files cannot be read)."""
        first = self.latest()
        if first is None:
            return []
        older = [
            p
            for p in self.checkpoints.glob("step_*")
            if _STEP.fullmatch(p.name) and step_number(p) < step_number(first) and self._complete(p, True)
        ]
        return [first, *sorted(older, key=step_number, reverse=True)]

    def resumed_from(self, path: Path, passed: list[Path]) -> None:
        """Point LATEST at `path`, the step a resume fell back to, and set aside the unreadable newer steps it
        `passed` over, as `unreadable-step_N`: one written off the checkpoint cadence (a signal's) was never
        written again and, being newest by name, outlived the good steps that pruning then removed.  Set aside,
        not removed: its weights may be whole (a train state of a newer torch), and nothing is lost."""
        atomic_write_text(self.checkpoints / LATEST, path.name + "\n")
        for damaged in passed:
            aside = damaged.with_name(f"{UNREADABLE_PREFIX}{damaged.name}")
            shutil.rmtree(aside, ignore_errors=True)  # the same step set aside before
            log.warning("%s cannot be read: set aside as %s; the run trains its steps again", damaged, aside.name)
            damaged.rename(aside)

    @staticmethod
    def _reads(path: Path) -> bool:
        """Whether a complete step checkpoint's files read: weights whose header describes the file exactly (which
        bounds the bytes hashed next) and that match their SHA-256, a train state that loads."""
        try:
            meta = json.loads((path / CONFIG).read_text())
            native.check_weights(meta, path / CONFIG, path / native.WEIGHTS)
            RunDir.read_state(path)
        except UNREADABLE:
            return False
        return True

    @staticmethod
    def _complete(path: Path, with_state: bool) -> bool:
        return path.is_dir() and native.is_native(path) and (not with_state or (path / STATE_FILE).is_file())

    def save_step(self, step: int, write_model: Callable[[Path], object], payload: dict[str, Any]) -> Path:
        """Write `checkpoints/step_<step>/` (model via `write_model(dir)` + train_state.pt) atomically, point
        LATEST at it and prune old step checkpoints."""
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        name = f"step_{step:07d}"
        final, tmp = self.checkpoints / name, self.checkpoints / f".{name}.tmp"
        if self._complete(final, with_state=True) and (final in self.loaded or self._reads(final)):  # resumed at: kept
            atomic_write_text(self.checkpoints / LATEST, name + "\n")  # (removing it first left a window)
            self._prune(name)  # a kill may have come between this step's save and its pruning
            return final
        for torn in self.checkpoints.glob(".step_*.tmp"):  # left by a save that crashed before its rename
            shutil.rmtree(torn, ignore_errors=True)
        try:
            write_model(tmp)
            atomic.atomic_write(tmp / STATE_FILE, lambda path: _save_state(payload, path))
            fsync_dir(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # not left on a full disk
            raise
        if final.exists():  # an incomplete copy of this step
            shutil.rmtree(final)
        os.replace(tmp, final)
        atomic_write_text(self.checkpoints / LATEST, name + "\n")
        fsync_dir(self.checkpoints)
        self._prune(name)
        return final

    def _prune(self, newest: str) -> None:
        """Remove the step checkpoints older than the KEEP before `newest`."""
        older = sorted(p for p in self.checkpoints.glob("step_*") if p.is_dir() and p.name != newest)
        for old in older[: -KEEP or None]:
            shutil.rmtree(old, ignore_errors=True)

    def export(self, name: str) -> Path:
        """Where a named export (`final`, `ema`) lives."""
        if name not in (FINAL, EMA):
            raise ValueError(f"unknown export {name!r}; expected {FINAL!r} or {EMA!r}")
        return self.checkpoints / name

    @staticmethod
    def read_state(path: Path) -> dict[str, Any]:
        """train_state.pt of a step checkpoint: tensors and plain containers only (weights_only=True), its
        records stored as torch.save writes them (a compressed one could inflate to any size)."""
        file = Path(path) / STATE_FILE
        tensorfile.is_stored_zip(file)
        return torch.load(file, map_location="cpu", weights_only=True)

    def model_checkpoint(self) -> Path:
        """The checkpoint this run stands for, as every verb reads it (`vitkit.run_model.standing`)."""
        return standing(self.checkpoints, lambda: self.latest(with_state=False))

    # -------------------------------------------------------------------------------- config
    def stored_config(self) -> dict[str, Any] | None:
        path = self.path / CONFIG
        if not path.is_file():
            return None
        return run_config.read_stored(path)

    def write_config(self, config: dict[str, Any]) -> None:
        self.create()
        atomic_write_text(self.path / CONFIG, json.dumps(config, indent=2) + "\n")

    def reconcile(
        self, requested: dict[str, Any], length_bounds_budget: Collection[str] = (), *, length_given: bool = True
    ) -> tuple[dict[str, Any], list[str]]:
        """The config a run in this directory continues with, and the keys where the request differed
        (vitkit.run_config.reconcile); the request itself where the directory holds no run to continue."""
        stored = self.stored_config()
        if stored is None or self.latest() is None:
            return requested, []
        return run_config.reconcile(stored, requested, length_bounds_budget, self.path, length_given=length_given)

    # ------------------------------------------------------------------------------- metrics
    def metrics(self, *, enabled: bool, tensorboard: bool) -> MetricsLog:
        return MetricsLog(self.path, enabled=enabled, tensorboard=tensorboard)


def _writable(directory: Path, remedy: str) -> None:
    """A ValueError naming `directory` and the `remedy` where a file cannot be made in it."""
    try:
        atomic.check_writable(directory)
    except OSError as error:
        raise ValueError(f"{directory} cannot be written ({error.strerror or error}); {remedy}") from None


def _others(directory: Path) -> bool:
    """Whether `directory` holds what is not a run's before its config: anything but hidden files (.DS_Store,
    .git), lost+found and an LR sweep's trials and record."""
    return any(
        p.name not in (SWEEP, SWEEP_RECORD, "lost+found") and not p.name.startswith(".") for p in directory.iterdir()
    )


def is_run_dir(path: str | os.PathLike) -> bool:
    """A directory made by `vitkit train` / `pretrain-mpp` (it has checkpoints/, or config.json + metrics.jsonl)."""
    path = Path(path)
    listed = (path / CHECKPOINTS).is_dir() or ((path / CONFIG).is_file() and (path / METRICS).is_file())
    return path.is_dir() and not native.is_native(path) and listed


def data_reading(path: str | os.PathLike, uri: str) -> dict[str, Any]:
    """How the run that `path` names (RUN or RUN/checkpoints/NAME) read `uri`, where it was trained on it: its
    `image_column`/`label_column`, and `labelled=False` for masked patch prediction (a source without labels
    reads as it trained).  Else nothing: columns are found by their types and labels are read."""
    path = Path(path)
    for run in (path, path.parent.parent):
        stored = RunDir(run).stored_config() if is_run_dir(run) else None
        data = (stored or {}).get("data", {})
        if isinstance(data, dict) and data.get("uri") == uri:
            found: dict[str, Any] = {key: data[key] for key in ("image_column", "label_column") if data.get(key)}
            return {**found, "labelled": False} if (stored or {}).get("mpp") else found
    return {}


def find_checkpoint(path: str | os.PathLike) -> Path:
    """The checkpoint a path names: a run directory's (see `RunDir.model_checkpoint`), else the path itself
    (any checkpoint format; `vitkit.checkpoints.read` detects it)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist (expected a checkpoint or a run directory)")
    if path.name == CHECKPOINTS and path.is_dir() and not native.is_native(path):  # RUN/checkpoints given
        path = path.parent
    if not is_run_dir(path):
        return path
    found = RunDir(path).model_checkpoint()
    _name_unfinished(path, found)
    return found


def _name_unfinished(run: Path, found: Path) -> None:
    """Warn, once a process, where a run stands for a step checkpoint for want of `final` (FSDP writes none)."""
    if found.name in (FINAL, EMA) or (run / CHECKPOINTS / FINAL).exists() or (run, found) in _NAMED_UNFINISHED:
        return
    with suppress(OSError, ValueError):  # a damaged config.json is for the verbs that read it to name
        if ((RunDir(run).stored_config() or {}).get("run") or {}).get("parallel") == "fsdp":
            return
    _NAMED_UNFINISHED.add((run, found))
    log.warning("%s has no final model (its run has not finished, or is training now): using %s, its last "
                "checkpoint", run, found.name)  # fmt: skip


def open_checkpoint(path: str | os.PathLike, **read_options: Any) -> native.Checkpoint:
    """Read the checkpoint `path` names (a run directory or any checkpoint format), model in eval mode."""
    from vitkit.checkpoints import read

    found = find_checkpoint(path)
    if found != Path(path):
        log.info("using checkpoint %s", found)
    checkpoint = read(found, **read_options)
    checkpoint.model.eval()
    return checkpoint
