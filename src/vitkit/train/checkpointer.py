"""The checkpointer: when and what the training engine saves into the run directory, and resuming from it.

A step checkpoint is the bare model in vitkit's format plus `train_state.pt`: the TrainState, every
process's random streams (`"rng_ranks"`, indexed by rank), the data position (`"data"`) and the objective's
own state (e.g. MPP's [mask] embedding and head under `"mpp"`).  The random streams, and under FSDP2 the
full state, are gathered first (collectives of every process); only rank 0 writes; every process waits
for the write.  The layout itself is `vitkit.runs.RunDir`'s.
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from vitkit.atomic import remove_torn
from vitkit.checkpoints import native
from vitkit.checkpoints.tensorfile import unpickler_stop
from vitkit.checkpoints.validate import NOT_NOW, unreadable_now
from vitkit.models import build_model
from vitkit.runs import EMA, FINAL, LATEST, UNREADABLE, RunDir
from vitkit.train import distributed
from vitkit.train.ema import averaged
from vitkit.train.state import TrainState

log = logging.getLogger(__name__)


def _problem(error: BaseException) -> str:
    """An error's text for a warning; a train state the weights-only unpickler refused is named by what it
    stopped at, without torch's advice to unpickle it unrestricted (which would run whatever it holds)."""
    if isinstance(error, pickle.UnpicklingError):
        stop = unpickler_stop(error)
        return "it holds pickled objects other than tensors, refused unread" + (f" ({stop})" if stop else "")
    return str(error).strip() or f"{type(error).__name__}: the file is empty or ends early"


class Checkpointer:
    """Saves every `every` steps (and when asked), restores the newest checkpoint, exports `final`/`ema`."""

    def __init__(
        self,
        run: RunDir,
        *,
        every: int,
        meta: dict[str, Any],
        main: bool,
        sharded: bool = False,
        extra: Callable[[], dict[str, Any]] = dict,
    ):
        self.run, self.every, self.meta, self.main, self.sharded = run, every, meta, main, sharded
        self.extra = extra  # () -> the data position and the objective's state, saved beside the TrainState

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def save(self, state: TrainState) -> Path | None:
        """Write checkpoints/step_<step>/ (all processes call this; rank 0 writes)."""
        full = _gather_sharded(state) if self.sharded else None  # a collective: all processes
        rng_ranks = distributed.all_gather_bytes(state.rng_state())  # a collective: every process's streams
        path = None
        if self.main:
            payload = (
                state.state_dict() if full is None else {**state.state_dict(optimizer=False), "optimizer": full[1]}
            )
            payload.update(self.extra(), rng_ranks=rng_ranks)
            module = state.module if full is None else _plain_copy(state.module, full[0])
            path = self.run.save_step(state.step, lambda tmp: native.save(module, tmp, **self.meta), payload)
        distributed.barrier()
        return path

    def restore(self, state: TrainState, *, load_extra: Callable[[dict[str, Any]], None]) -> Path | None:
        """Resume order step (1): the newest checkpoint of the run directory that reads, if any (weights,
        optimiser, step, rank 0's RNG, then `load_extra` with the whole payload for the data position, the
        objective and the other processes' random streams).  A step whose files cannot be read (weights that
        fail their SHA-256, a cut-short train state) is passed over for the one before, with a warning; one this
        user may not read now (permissions, a storage error: `NOT_NOW`) stops the resume."""
        candidates = self.run.resume_candidates()
        found = self._readable(candidates, None if self.sharded else state)
        if found is None:
            return None
        path, payload, checkpoint = found
        weights, payload["class_names"] = checkpoint.model.state_dict(), checkpoint.class_names  # for `load_extra`
        self.run.loaded.add(path)
        if path != candidates[0] and self.main:  # fell back: LATEST names an unreadable step
            self.run.resumed_from(path, candidates[: candidates.index(path)])
        if self.sharded:
            _load_sharded(state, weights, payload)
        else:
            native.load_state_dict_strict(state.module, weights, source=str(path))
            state.load_state_dict(payload)
        load_extra(payload)
        return path

    def _readable(
        self, candidates: list[Path], state: TrainState | None
    ) -> tuple[Path, dict[str, Any], native.Checkpoint] | None:
        """The first of `candidates` whose train state and weights read (and whose train state fits `state`,
        where given): (path, payload, the step's model checkpoint)."""
        for index, path in enumerate(candidates):
            try:
                payload = RunDir.read_state(path)
                if state is not None:
                    state.check_state_dict(payload)
                return path, payload, native.load(path, map_location="cpu")
            except OSError as error:
                if error.errno not in NOT_NOW:
                    self._step_back(candidates, index, error)
                    continue
                before = candidates[index + 1] if index + 1 < len(candidates) else None
                raise unreadable_now(path, error, self.run.checkpoints / LATEST, before) from error
            except UNREADABLE as error:
                self._step_back(candidates, index, error)
        return None

    def _step_back(self, candidates: list[Path], index: int, error: BaseException) -> None:
        """Pass over the damaged `candidates[index]` for the one before, with a warning; an error after the last."""
        problem = _problem(error)
        if index + 1 == len(candidates):
            raise ValueError(
                f"no step checkpoint of {self.run.path} can be read; the last tried, {candidates[index].name}: "
                f"{problem}. Remove {self.run.checkpoints / LATEST} to start the run over"
            ) from error
        log.warning(
            "%s cannot be read (%s); resuming from %s, the step before",
            candidates[index],
            problem,
            candidates[index + 1].name,
        )

    def export(self, state: TrainState) -> None:
        """checkpoints/final: the evaluated model (the Polyak average when enabled), and checkpoints/ema."""
        if not self.main or self.sharded:
            return
        exports = [self.run.export(FINAL)] + ([self.run.export(EMA)] if state.ema is not None else [])
        for directory in exports:  # what an export a kill cut short left there
            remove_torn(directory)
        meta = {**self.meta, "provenance": {**self.meta.get("provenance", {}), "step": state.step}}  # run_model
        with averaged(state.ema, state.module) as module:
            for directory in exports:  # ema: the name runs.find_checkpoint prefers over LATEST
                native.save(module, directory, **meta)


def _plain_copy(module: torch.nn.Module, weights: dict[str, Any]) -> torch.nn.Module:
    copy = build_model(module.config)
    copy.load_state_dict(weights)
    return copy


def _gather_sharded(state: TrainState) -> tuple[dict[str, Any], dict[str, Any]]:
    """FSDP2: the full (unsharded) model and optimiser state dicts on the CPU (a collective).

    The optimiser state is keyed by parameter names (torch.distributed.checkpoint's format), loadable
    with weights_only=True.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return (
        get_model_state_dict(state.model, options=options),
        get_optimizer_state_dict(state.model, state.optimizer, options=options),
    )


def _load_sharded(state: TrainState, weights: dict[str, Any], payload: dict[str, Any]) -> None:
    """FSDP2 resume: every process reads the full checkpoint and keeps its shards."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(state.model, weights, options=options)
    set_optimizer_state_dict(state.model, state.optimizer, optim_state_dict=payload["optimizer"], options=options)
    state.load_state_dict(payload, optimizer=False)
