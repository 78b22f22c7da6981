"""The parts a Trainer is made of, assembled from the config before the first step (STYLE.md section 5).

`RunParts` builds, in order: the run directory and the config it continues with (`reconcile`), the data
splits and the objective, the model with its optimiser, EMA and augmentation generator (`TrainState`), the
batches, the checkpointer (resuming from it when the directory holds a run), the host choices (precision,
torch.compile), the metrics and the non-finite guard.  train/trainer.py's `Trainer` runs them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import torch

from vitkit.data.stream import ShardBatches, ShardSet
from vitkit.device import autocast_dtype
from vitkit.models.configs import in_channels
from vitkit.run_config import canonical_source
from vitkit.runs import RunDir
from vitkit.train import choices, compiled, distributed
from vitkit.train.assemble import (
    IndexBatches,
    Splits,
    check_fits_data,
    initial_model,
    load_splits,
    source_images,
)
from vitkit.train.checkpointer import Checkpointer
from vitkit.train.config import TrainConfig, from_dict, to_dict
from vitkit.train.ema import ModelEMA
from vitkit.train.guard import NonFiniteGuard
from vitkit.train.objectives import build_objective
from vitkit.train.optim import build_optimizer
from vitkit.train.plan import (
    HostChoices,
    augment_seed,
    init_seed,
    micro_batch_size,
    resumed_seeds,
    schedule_of,
    total_steps,
)
from vitkit.train.schedule import scaled_lr
from vitkit.train.state import TrainState
from vitkit.train.transfer_recipes import LENGTH_BOUNDS_BUDGET

log = logging.getLogger("vitkit.train.trainer")  # the trainer's messages, wherever they are said

LENGTH_KEYS = frozenset({"data.epochs", "data.steps", "run.max_minutes"})  # a request for another length
UNBOUNDED = 2**62  # the batch streams' bound for a run whose time budget alone decides its length


def reconcile(config: TrainConfig, *, length_given: bool = True) -> TrainConfig:
    """The config a run in `config.run.out` continues with: the stored one when the directory holds a run
    (vitkit.runs' one resume policy), with a warning naming what the request changed, from the main process
    (`length_given`: the request named its length, so a stored budget's own length overrides it: said)."""
    run = RunDir(config.run.out)
    merged, changed = run.reconcile(to_dict(config), LENGTH_BOUNDS_BUDGET, length_given=length_given)
    if changed and distributed.current().main:  # one run, one warning, from the main process
        longer = set(changed) & LENGTH_KEYS
        log.warning(
            "%s already holds a run with a different config (%s); resuming it with its own config "
            "(choose another --out for a new run%s)",
            run.path,
            ", ".join(changed[:8]),
            f"; to train it longer, start a new run from its weights (--set run.init_from={run.path} with another "
            f"--out and the new {', '.join(sorted(longer))})"
            if longer
            else "",
        )
    if not changed and run.latest() is None:
        return config
    try:
        return from_dict(merged)
    except ValueError as error:
        raise ValueError(f"{run.path / 'config.json'} does not read as a run's config: {error}") from None


def _check_every_process_agrees(config: TrainConfig, data: Splits) -> None:
    """Under torchrun, every process must train the same config on the same data: a ValueError on every process
    naming what differs (flags given to one process only, another data directory) before any model is made."""
    if distributed.current().world == 1:
        return
    facts = agreed_facts(config, data)
    facts.update({key + REAL: path for key, path in real_paths(facts).items()})
    differ = distributed.differences_from_rank_0(facts, alike=_one_place)
    if differ:
        raise ValueError(
            "the processes of this torchrun do not agree on what to train: "
            + "; ".join(differ[:4])
            + (" ..." if len(differ) > 4 else "")
            + ". Give every process the same flags and the same data"
        )


PATH_KEYS = ("data.uri", "run.init_from", "run.out")  # one place however spelt: the spelling or the real path agrees
REAL = " (real path)"  # beside a path key: its real path, which travels with the facts


def _one_place(key: str, theirs: dict[str, Any], ours: dict[str, Any]) -> bool:
    """Whether a path (PATH_KEYS, or its REAL form) names one place on two processes: its spelling or its real
    path agrees."""
    path = key.removesuffix(REAL)
    return path in PATH_KEYS and any(theirs.get(k) == ours.get(k) for k in (path, path + REAL))


def real_paths(facts: dict[str, Any]) -> dict[str, str]:
    """The PATH_KEYS of `facts` as real paths: "folder:photos", "folder:./photos" and "folder:/abs/photos/" name
    one source on one machine (on several, the same relative spelling may be two real paths, and agrees)."""
    return {key: canonical_source(facts[key]) for key in PATH_KEYS if facts.get(key)}


def agreed_facts(config: TrainConfig, data: Splits) -> dict[str, Any]:
    """What every process of a run must share, by the name a message gives it: "optim.lr", "recipe" (a field
    outside the groups), "train images", "classes", "test images"."""
    facts: dict[str, Any] = {}
    for group, fields in to_dict(config).items():
        facts.update(
            {f"{group}.{name}": value for name, value in fields.items()}
            if isinstance(fields, dict)
            else {group: fields}
        )
    for display in ("run.progress", "run.threads"):  # each process's own, harmlessly
        facts.pop(display, None)
    facts.update({"train images": len(data.train), "classes": data.train.class_names})
    facts["test images"] = len(data.test) if data.test is not None else 0
    return facts


class RunParts:
    """A run assembled from its parts (see the module docstring); the Trainer adds the loop."""

    def __init__(
        self,
        config: TrainConfig,
        info: distributed.DistInfo,
        device: torch.device,
        started: float,
        *,
        data: Splits | None = None,
        progress_stream: Any = None,
    ):
        self.info, self.device, self.started, self.progress_stream = info, device, started, progress_stream
        self.run = RunDir(config.run.out)
        if info.main:
            self.run.create()
        distributed.barrier()
        self.config = config = reconcile(config)
        torch.manual_seed(init_seed(config.run.seed, info.rank))  # weights and dropout
        wants_test = config.mpp is None or config.mpp.eval_images > 0
        self.data = data or load_splits(config, need_test=wants_test)
        self.source_count = source_images(config) if data is None else None  # splits given: the caller's data
        self.data = self.data if wants_test else dataclasses.replace(self.data, test=None, evals={})
        check_fits_data(config, self.data.train)
        _check_every_process_agrees(config, self.data)
        self.num_train, self.micro = len(self.data.train), micro_batch_size(config, info.world)
        self.length = total_steps(config, self.num_train)  # None: the time budget alone decides
        self.objective = build_objective(config, self.data.train.num_classes, in_channels(config.model))
        self.skipped_before = self.skipped_total = 0  # batches' corrupt samples of earlier invocations / in all
        self.stored_precision, self.stored_compiled = None, None  # as an earlier invocation chose: kept on resume
        self.resumed = False  # this invocation continues a checkpoint of an earlier one
        self._build_model()
        batches = ShardBatches if isinstance(self.data.train, ShardSet) else IndexBatches  # both TrainBatches
        self.batches = batches(
            self.data.train,
            seed=config.run.seed,
            global_batch=config.data.batch_size,
            micro_batch=self.micro,
            rank=info.rank,
            world=info.world,
            device=device,
            total_steps=self.length or UNBOUNDED,
            workers=config.data.workers,
            strict=config.data.strict,
        )
        self.checkpointer = Checkpointer(
            self.run,
            every=config.run.checkpoint_every,
            meta=self._meta(),
            main=info.main,
            sharded=self.sharded,
            extra=self._extra_state,
        )
        self._resume()
        self.choices = self._choose()
        self.metrics = self.run.metrics(enabled=info.main, tensorboard=config.run.tensorboard)
        if info.main:
            self.metrics.truncate_after(self.state.step)
            self.run.write_config(to_dict(config))
        self.guard = NonFiniteGuard(
            self.state, config.run.nan_patience, report=self._report_skip, last_good=self.run.latest
        )

    # ------------------------------------------------------------------------------- assembly
    def _build_model(self) -> None:
        config, info, device = self.config, self.info, self.device
        module = initial_model(config, self.data.train.class_names if config.mpp is None else None).to(device)
        network = self.objective.network(module)  # what the optimiser trains (MPP: a wrapper around the encoder)
        self.sharded = config.run.parallel == "fsdp" and info.launched
        model = distributed.wrap(network, info, device, config.run.parallel)
        self.eager = model
        self.deferred = config.run.nan_check == "deferred" or (  # Muon has no fused kernel to skip a step
            config.run.nan_check == "auto"
            and device.type == "cuda"
            and config.run.parallel != "fsdp"
            and config.optim.name != "muon"
        )
        # Fused kernels on the CPU too: one pass over the parameters (AdamW's step 2.2 -> 0.7 ms at small-28px).
        optimizer = build_optimizer(
            model if config.run.parallel == "fsdp" else network,
            config.optim,
            self._peak_lr(),
            fused=self.deferred or device.type == "cpu",
        )
        generator = torch.Generator(device=device).manual_seed(augment_seed(config.run.seed, info.rank))
        ema = ModelEMA(module, config.optim.ema_decay) if config.optim.ema_decay > 0 else None
        self.state = TrainState(model=model, module=module, optimizer=optimizer, generator=generator, ema=ema)

    def _peak_lr(self) -> float:
        """The peak learning rate after the batch-size scaling rule (the plan's `lr`)."""
        optim, batch = self.config.optim, self.config.data.batch_size
        return scaled_lr(optim.lr, batch, optim.base_batch_size or batch, optim.lr_scaling)

    def _count_skipped(self) -> int:
        """Corrupt samples skipped: the training split's (the same on every process) plus what every process's
        batches dropped in this and earlier invocations.  A collective: every process calls it."""
        streamed = self.batches.skipped
        if self.info.world > 1:  # each process counts its own batches; the record holds the total
            streamed = distributed.sum_across(streamed, self.device)
        self.skipped_total = self.skipped_before + streamed
        return self.data.train.skipped + self.skipped_total

    def _training_left_s(self) -> float | None:
        """Seconds of a time budget left to train in (None: no budget); the Trainer's, whose clock times start-up."""
        raise NotImplementedError

    def _choose(self) -> HostChoices:
        """Precision and compilation for this host and model (train/choices.py); compiles when chosen."""
        config = self.config
        phases = schedule_of(config, self.length or 1, 1.0).phases(start=self.state.step / (self.length or math.inf))
        picked = choices.choose(
            config,
            self.state.module,
            self.device,
            micro_batch=self.micro,
            accumulation=config.data.batch_size // self.info.world // self.micro,
            graphs=len(phases),
            steps=None if self.length is None else self.length - self.state.step,
            budget_s=self._training_left_s(),
            stored_precision=self.stored_precision,
            stored_compiled=self.stored_compiled,
        )
        self.autocast_dtype = autocast_dtype(picked.precision)
        if picked.compiled:
            self.state.model = compiled.compile_for_training(self.eager, self.device)
        return picked

    def _meta(self) -> dict[str, Any]:
        provenance = {
            "recipe": self.config.recipe,
            "data": self.config.data.uri,
            "run_dir": str(self.run.path),
            **self.objective.provenance(),
        }
        names = self.data.train.class_names if self.config.mpp is None else None
        return {
            "class_names": names,
            "mean": self.config.data.mean,
            "std": self.config.data.std,
            "provenance": provenance,
        }

    def _extra_state(self) -> dict[str, Any]:
        return {
            "data": self.batches.state_dict(),
            "skipped_samples": self.skipped_total,
            "precision": self.choices.precision,
            "compiled": self.choices.compiled,
            "source_images": self.source_count,
            **self.objective.state_dict(),
        }

    def _check_same_data(self, stored: int | None) -> None:
        """A resumed run reads the images it was trained on: a source that gained or lost some since would give
        its class-stratified hold-outs (test, val, N a class) drawn again, training images in its test split.
        Counted from the listing (source_images), so a file that now decodes, or no longer does, is no change."""
        now = self.source_count
        if stored is None or now is None or stored == now:  # None: a checkpoint before the count, or given splits
            return
        raise ValueError(
            f"{self.config.data.uri} holds {now:,} training images, {stored:,} when this run started: its held-out "
            f"images would be drawn again, and some it trained on would be tested; choose another --out for a "
            f"new run ({self.run.path} resumes on the images it started with)"
        )

    def _check_same_classes(self, stored: list[str] | None) -> None:
        """A resumed run's outputs stand for the classes it started with: a source whose class folders changed
        (one replaced by another, the count alike) would make each output learn another class from here on."""
        now = self.checkpointer.meta["class_names"]  # what this run saves with its steps (MPP: none)
        if stored is None or now is None or list(stored) == list(now):
            return
        changed = sorted(set(stored) ^ set(now)) or ["their order"]
        raise ValueError(
            f"{self.config.data.uri}'s classes differ from those this run started with ({', '.join(changed)[:200]}): "
            f"its outputs would stand for other classes; choose another --out for a new run ({self.run.path} "
            "resumes on the classes it started with)"
        )

    def _resume(self) -> None:
        def load_extra(payload: dict[str, Any]) -> None:
            self.objective.load_state_dict(payload)
            self.batches.load_state_dict(payload.get("data") or {"step": self.state.step})
            self.skipped_before = int(payload.get("skipped_samples", 0))  # streamed by the earlier invocations
            self.stored_precision, self.stored_compiled = payload.get("precision"), payload.get("compiled")
            self._check_same_data(payload.get("source_images"))
            self._check_same_classes(payload.get("class_names"))
            self._resume_rng(payload.get("rng_ranks"))

        resumed = self.checkpointer.restore(self.state, load_extra=load_extra)
        if resumed is None:
            if self.info.main and self.run.stored_config() is not None:  # an earlier invocation died before saving
                log.warning("no checkpoint in %s: starting from step 0", self.run.path)
            return
        self.resumed = True
        fitted = self.config.run.fitted  # which ends annealed before its length
        if self.state.ended and not fitted and self.length is not None and self.state.step < self.length:
            self.state.ended = False  # made longer by hand: the steps added are trained
        log.info("resuming %s at step %d", resumed, self.state.step)

    def _resume_rng(self, stored: list[dict[str, torch.Tensor]] | None) -> None:
        """Every process continues its own random streams (dropout, stochastic depth, augmentation) from the
        checkpoint's per-rank states when it was written by as many processes.  Otherwise (another number of
        processes, or a checkpoint that kept rank 0's alone) rank 0 continues its own and the others a
        (seed, rank, step) stream: the run goes on, but not as an uninterrupted one would have."""
        info = self.info
        if stored is not None and len(stored) == info.world:
            self.state.set_rng_state(stored[info.rank])
            return
        if info.main and not self.state.ended and (stored is not None or info.world > 1):  # ended: none is drawn
            kept = "rank 0's random streams alone" if stored is None else f"the random streams of {len(stored)}"
            how = "ranks > 0 continue from a (seed, rank, step) stream" if info.world > 1 else "only rank 0's go on"
            log.warning(
                "the checkpoint holds %s process(es) and this run has %d: %s, so the weights will differ from an "
                "uninterrupted run's (resume with the same number of processes to continue exactly)",
                kept,
                info.world,
                how,
            )
        if info.rank:
            weights, augment = resumed_seeds(self.config.run.seed, info.rank, self.state.step)
            torch.manual_seed(weights)
            self.state.generator.manual_seed(augment)

    def _split_sizes(self) -> dict[str, Any]:
        """Images per part and where each came from (the plan prints them)."""
        parts = {"train": self.data.train, **self.data.evals}
        if self.data.test is not None:
            parts[self.config.eval.final_split] = self.data.test
        return {name: {"images": len(part), "from": part.origin} for name, part in parts.items()}

    def _epoch(self, step: int) -> float:
        return round(step * self.config.data.batch_size / self.num_train, 4)

    def _report_skip(self, record: dict[str, Any]) -> None:
        self.metrics.write({**record, "epoch": self._epoch(record["step"])})
