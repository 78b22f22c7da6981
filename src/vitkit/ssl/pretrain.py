"""Masked-patch-prediction pre-training (App. B.1.2) on the training engine's parts.

Paper settings: Adam, base learning rate 2e-4, 10k warmup steps, cosine decay, batch 4096, 1M steps
on JFT ("diminishing returns after 100k steps").  `mpp_train_config` turns any resolved
`TrainConfig` (a recipe chosen for the data set, as `vitkit train` does) into these settings: no
classification head, AdamW 2e-4 with betas (0.9, 0.999), cosine decay, clip 1, warmup
min(10k, 5% of the run) so small runs scale it down.  The weight decay is not given for MPP; 0.1,
the paper's value for supervised pre-training (App. B.1), is used.  The augmentation keeps the
recipe's crop and flip; Mixup, CutMix, RandAugment and label smoothing are switched off (they are
label-side or colour-altering tricks of supervised training).

The run is the engine's: `vitkit.train.distributed` (torchrun, DDP, gloo/NCCL), `train.optim`
(parameter groups), `train.schedule`, `train.state` (TrainState, atomic `checkpoints/step_N/`
+ LATEST, exact resume), `data.loader` (one deterministic sample stream, a function of the step)
and `train.plots.MetricsLog` (metrics.jsonl).  Only the step differs: `train_step` feeds the MPP
module instead of a classifier.  Each checkpoint is the *encoder alone* in vitkit's format (no
[mask] embedding, no MPP head; those live in `train_state.pt`), and `checkpoints/final/` is
written at the end, so `vitkit finetune RUN/checkpoints/final` and `vitkit fewshot RUN` take it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from vitkit.checkpoints import native
from vitkit.data import loader
from vitkit.data.sources import ImageSet, load_split
from vitkit.data.transforms import eval_transform, train_transform
from vitkit.models import build_model
from vitkit.models.configs import HybridConfig, ResNetConfig, image_size, in_channels
from vitkit.ssl.masked_patch import MaskedPatchPrediction, MPPConfig
from vitkit.train import distributed
from vitkit.train.config import TrainConfig, to_dict
from vitkit.train.loop import step_batches
from vitkit.train.optim import build_optimizer, set_lr
from vitkit.train.plots import MetricsLog
from vitkit.train.schedule import lr_multiplier, resolve_warmup, scaled_lr
from vitkit.train.state import TrainState, latest_checkpoint, load_checkpoint, save_checkpoint

log = logging.getLogger(__name__)

PAPER_LR = 2e-4  # App. B.1.2: Adam base learning rate
PAPER_WARMUP = 10_000  # App. B.1.2: warmup steps (of 1M)


def mpp_train_config(config: TrainConfig, *, lr: float | None = None, warmup_steps: int | None = None) -> TrainConfig:
    """App. B.1.2's optimiser on top of a resolved TrainConfig; the encoder loses its head (K = 0).

    Warmup defaults to min(10k, 5% of the run); pass `warmup_steps` for another value.
    """
    model = config.model
    if isinstance(model, ResNetConfig):
        raise ValueError("masked patch prediction needs a ViT or hybrid (patch tokens); got a ResNet")
    # No head, and no pre-logits layer: it belongs to the supervised head.  (dataclasses.replace, since
    # `with_overrides` skips None values.)
    vit = dataclasses.replace(model.vit if isinstance(model, HybridConfig) else model, num_classes=0, representation_size=None)
    model = dataclasses.replace(model, vit=vit) if isinstance(model, HybridConfig) else vit
    optim = dataclasses.replace(
        config.optim, name="adamw", lr=lr or PAPER_LR, base_batch_size=0, lr_scaling="none", betas=(0.9, 0.999),
        weight_decay=0.1, schedule="cosine", end_lr_fraction=0.0, clip_norm=1.0, warmup_steps=warmup_steps or 0,
        warmup_fraction=0.0 if warmup_steps else 0.05, loss="softmax", lr_sweep=(), ema_decay=0.0,
    )
    augment = dataclasses.replace(config.augment, mixup=0.0, cutmix=0.0, randaugment=None, label_smoothing=0.0)
    data = dataclasses.replace(config.data, val_fraction=0.0)
    return dataclasses.replace(config, recipe=f"mpp({config.recipe})", model=model, optim=optim, augment=augment, data=data)


def warmup_of(config: TrainConfig, steps: int) -> int:
    """Warmup steps of a run of `steps`: explicit steps, else the fraction capped at the paper's 10k."""
    warmup = resolve_warmup(steps, config.optim.warmup_steps, config.optim.warmup_fraction)
    return warmup if config.optim.warmup_steps else min(PAPER_WARMUP, warmup)


@dataclasses.dataclass
class MPPState(TrainState):
    """The engine's TrainState plus the MPP-only weights ([mask] embedding, head) in `train_state.pt`.

    `module` is the encoder, so the engine's checkpoints hold a plain ViT; `mpp` is the wrapper.
    """

    mpp: MaskedPatchPrediction | None = None

    def state_dict(self) -> dict[str, Any]:
        extra = {k: v for k, v in self.mpp.state_dict().items() if not k.startswith("encoder.")}
        return {**super().state_dict(), "mpp": extra}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        own = {k for k in self.mpp.state_dict() if not k.startswith("encoder.")}
        saved = state.get("mpp", {})
        if set(saved) != own or any(saved[k].shape != self.mpp.state_dict()[k].shape for k in own):
            raise ValueError(f"train_state.pt holds MPP weights {sorted(saved)} that do not fit this MPP model ({sorted(own)})")
        with torch.no_grad():
            for name, tensor in self.mpp.named_parameters():
                if name in saved:
                    tensor.copy_(saved[name])


def train_step(net: nn.Module, optimizer: torch.optim.Optimizer, batch: list[Tensor], generator: torch.Generator,
               lr: float, clip_norm: float, autocast_dtype: torch.dtype | None) -> dict[str, Any]:
    """One optimiser step of the MPP loss over micro-batches (normalised floats); gradients are averaged.

    A non-finite loss or gradient norm skips the update (the optimiser state is untouched) and
    reports "skipped": True.  Returns floats "loss", "accuracy" (None for the "pixels" target), "grad_norm".
    """
    set_lr(optimizer, lr)
    optimizer.zero_grad(set_to_none=True)
    losses, accuracies = [], []
    for index, images in enumerate(batch):
        last = index == len(batch) - 1
        sync = contextlib.nullcontext() if last or not hasattr(net, "no_sync") else net.no_sync()
        autocast = torch.autocast(images.device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()
        with sync:
            with autocast:
                out = net(images, generator)
            (out["loss"] / len(batch)).backward()
        losses.append(out["loss"].detach().float())
        accuracies.append(out["accuracy"].float())
    params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
    grad_norm = nn.utils.clip_grad_norm_(params, clip_norm) if clip_norm > 0 else nn.utils.get_total_norm([p.grad for p in params])
    loss = torch.stack(losses).mean()
    finite = bool(torch.isfinite(grad_norm) & torch.isfinite(loss))
    if finite:
        optimizer.step()
    else:
        optimizer.zero_grad(set_to_none=True)
    accuracy = float(torch.stack(accuracies).mean())
    return {"loss": float(loss), "accuracy": accuracy if math.isfinite(accuracy) else None,
            "grad_norm": float(grad_norm), "skipped": not finite}


@torch.no_grad()
def evaluate_mpp(model: MaskedPatchPrediction, images: Tensor, size: int, mean: tuple[float, ...], std: tuple[float, ...],
                 device: torch.device, batch_size: int = 256, seed: int = 12345) -> dict[str, float | None]:
    """MPP loss and top-1 / top-5 accuracy over the corrupted patches of held-out uint8 images (fixed corruption seed)."""
    was_training = model.training
    model.eval()
    generator = torch.Generator(device=device).manual_seed(seed)
    loss_sum, hits1, hits5, count = 0.0, 0.0, 0.0, 0
    for start in range(0, len(images), batch_size):
        batch = eval_transform(images[start : start + batch_size].to(device), size, mean, std, model.in_chans)
        out = model(batch, generator)
        weight = int(out["mask"].sum())
        loss_sum += float(out["loss"]) * weight
        count += weight
        if model.config.target != "pixels":
            logits = out["predictions"][out["mask"]].reshape(-1, model.num_colors)  # (M*S, colours)
            labels = out["targets"][out["mask"]].reshape(-1, 1)
            best = logits.topk(min(5, model.num_colors), dim=-1).indices
            hits1 += float((best[:, :1] == labels).any(-1).float().mean()) * weight
            hits5 += float((best == labels).any(-1).float().mean()) * weight
    model.train(was_training)
    classify = model.config.target != "pixels"
    return {"loss": loss_sum / count, "top1": hits1 / count if classify else None, "top5": hits5 / count if classify else None}


def _dist_info() -> tuple[distributed.DistInfo, bool]:
    """This process's place: an already joined group (e.g. a test), else torchrun's variables; and whether we join."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
        rank = torch.distributed.get_rank()
        return distributed.DistInfo(rank=rank, world=world, local_rank=rank % max(1, torch.cuda.device_count())), False
    return distributed.from_env(), True


def _check_run_config(run_dir: Path, resolved: dict[str, Any], resuming: bool) -> None:
    """Refuse to resume a run directory that was written with another configuration (time budget and display aside)."""
    path = run_dir / "config.json"
    if resuming and path.is_file():
        old = json.loads(path.read_text())
        volatile = {"max_minutes", "progress", "out", "device", "threads", "tensorboard", "log_every", "checkpoint_every"}
        differ = [f"{group}.{key}" for group, values in resolved.items() if isinstance(values, dict)
                  for key in values if key not in volatile and old.get(group, {}).get(key) != values[key]]
        if differ:
            raise ValueError(f"{run_dir} holds an MPP run with another configuration (differs in {differ[:6]}); "
                             "use a new --out")


def pretrain(config: TrainConfig, mpp: MPPConfig, *, train: ImageSet | None = None, held_out: ImageSet | None = None,
             eval_images: int = 1024) -> dict[str, Any]:
    """Run (or resume) MPP pre-training into `config.run.out`; returns a summary dict.

    `config` should come from `mpp_train_config`.  `train` / `held_out` replace loading
    `config.data.uri`'s train / test split (labels are never used).  The summary holds "status"
    ("finished" or "time_budget"), "step", "steps", "loss", "accuracy", "checkpoint" and, when
    finished, "test" (held-out MPP loss / top-1 / top-5 over `eval_images` test images).
    """
    return run_pretraining(config, mpp, train=train, held_out=held_out, eval_images=eval_images)[1]


def run_pretraining(config: TrainConfig, mpp: MPPConfig, *, train: ImageSet | None = None, held_out: ImageSet | None = None,
                    eval_images: int = 1024) -> tuple[MaskedPatchPrediction, dict[str, Any]]:
    """`pretrain`, also returning this process's MaskedPatchPrediction module."""
    if not config.run.out:
        raise ValueError("run.out (the run directory) must be set")
    info, join = _dist_info()
    device = distributed.pick_device(config.run.device, info)
    if join:
        distributed.setup(info, device)
    threads = torch.get_num_threads()
    if config.run.threads > 0:
        torch.set_num_threads(config.run.threads)
    try:
        return _run(config, mpp, info, device, train, held_out, eval_images)
    finally:
        torch.set_num_threads(threads)
        if join:
            distributed.teardown()


def _run(config: TrainConfig, mpp: MPPConfig, info: distributed.DistInfo, device: torch.device,
         train: ImageSet | None, held_out: ImageSet | None, eval_images: int) -> tuple[MaskedPatchPrediction, dict[str, Any]]:
    started = time.monotonic()
    run_dir = Path(config.run.out)
    size, channels = image_size(config.model), in_channels(config.model)
    mean, std = config.data.mean[:channels], config.data.std[:channels]
    mpp = dataclasses.replace(mpp, mean=tuple(mean), std=tuple(std))  # targets undo the run's own normalisation
    if train is None:
        train = load_split(config.data.uri, "train", image_size=size, seed=config.run.seed, strict=config.data.strict)
    if held_out is None and eval_images:
        try:
            held_out = load_split(config.data.uri, "test", image_size=size, seed=config.run.seed, strict=config.data.strict)
        except ValueError as err:  # e.g. a folder without val/ or test/: pre-training needs no test split
            log.warning("no held-out MPP evaluation: %s", err)
    steps = max(1, config.data.steps or math.ceil(config.data.epochs * len(train) / config.data.batch_size))
    warmup = warmup_of(config, steps)
    local, rest = divmod(config.data.batch_size, info.world)
    micro = config.data.micro_batch_size or local
    if rest or local % micro:
        raise ValueError(f"batch {config.data.batch_size} does not split into {info.world} process(es) x micro-batches of {micro}")
    lr = scaled_lr(config.optim.lr, config.data.batch_size, config.optim.base_batch_size or config.data.batch_size,
                   config.optim.lr_scaling)

    model, state = _build_and_resume(config, mpp, info, device, run_dir, lr)
    net, optimizer, generator = state.model, state.optimizer, state.generator
    metrics = MetricsLog(run_dir, enabled=info.main, tensorboard=config.run.tensorboard)
    metrics.truncate_after(state.step)  # records written after the checkpoint this run restarts from
    meta = {"class_names": None, "mean": mean, "std": std,
            "provenance": {"objective": "masked_patch_prediction", "mpp": _jsonable(dataclasses.asdict(mpp)), "data": config.data.uri,
                           "recipe": config.recipe, "run_dir": str(run_dir)}}
    autocast_dtype = torch.bfloat16 if config.run.precision == "bf16" or (config.run.precision == "auto" and device.type == "cuda") else None
    log.info("MPP pre-training (%s target, %.0f%% corrupted) on %d images: %d steps of %d, lr %.1e, warmup %d",
             mpp.target, 100 * mpp.corrupt_rate, len(train), steps, config.data.batch_size, lr, warmup)
    num_classes = max(1, train.num_classes)
    status, last, invocation = "finished", {}, time.monotonic()
    model.train()
    stream = loader.IndexStream(len(train), config.run.seed)
    for raw in step_batches(config, train, stream, state.step, steps, info, micro, device):
        batch = [train_transform(images, labels, num_classes, size, mean, std, channels, config.augment, generator)[0]
                 for images, labels in raw]
        step_lr = lr * lr_multiplier(state.step, steps, warmup, config.optim.schedule, config.optim.end_lr_fraction)
        out = train_step(net, optimizer, batch, generator, step_lr, config.optim.clip_norm, autocast_dtype)
        state.step += 1
        state.nan_streak = state.nan_streak + 1 if out["skipped"] else 0
        state.skipped_steps += int(out["skipped"])
        if state.nan_streak >= config.run.nan_patience:
            raise ValueError(f"MPP loss/gradient was NaN or Inf for {state.nan_streak} consecutive steps, the last at step "
                             f"{state.step}; last good checkpoint: {latest_checkpoint(run_dir) or 'none'}")
        if state.step % config.run.log_every == 0 or state.step == steps:
            last = {"step": state.step, "epoch": round(state.step * config.data.batch_size / len(train), 4), "split": "train",
                    **{k: out[k] for k in ("loss", "accuracy", "grad_norm")}, "lr": step_lr,
                    "seconds": round(time.monotonic() - started, 1)}
            metrics.write(last)
            log.info("step %d/%d  MPP loss %.4f  accuracy %s  lr %.2e", state.step, steps, out["loss"], out["accuracy"], step_lr)
        out_of_time = config.run.max_minutes > 0 and (time.monotonic() - started) / 60 >= config.run.max_minutes
        out_of_time = distributed.any_true(out_of_time, device)
        if state.step % config.run.checkpoint_every == 0 or out_of_time or state.step == steps:
            state.elapsed += time.monotonic() - invocation
            invocation = time.monotonic()
            if info.main:
                save_checkpoint(run_dir, state, meta)
            distributed.barrier()
        if out_of_time and state.step < steps:
            status = "time_budget"
            log.info("time budget of %.1f min spent at step %d/%d; re-run with the same --out to resume",
                     config.run.max_minutes, state.step, steps)
            break
    summary = _finish(model, state, status, steps, last, run_dir, meta, metrics, info, held_out, eval_images, size, device)
    metrics.close()
    return model, summary


def _jsonable(value: Any) -> Any:
    """Tuples -> lists, as a JSON round trip stores them (so stored and requested configs compare equal)."""
    return json.loads(json.dumps(value))


def _build_and_resume(config: TrainConfig, mpp: MPPConfig, info: distributed.DistInfo, device: torch.device,
                      run_dir: Path, lr: float) -> tuple[MaskedPatchPrediction, MPPState]:
    """The MPP module, its optimiser and state (STYLE.md section 5 order: resume a checkpoint of the run
    directory, else start from scratch), and config.json written by rank 0."""
    torch.manual_seed(config.run.seed)  # the same init on every rank
    model = MaskedPatchPrediction(build_model(config.model), mpp).to(device)
    net = distributed.wrap(model, info, device, "ddp")
    optimizer = build_optimizer(model, config.optim, lr)
    generator = torch.Generator(device=device).manual_seed(config.run.seed * 7919 + info.rank)  # crops, flips, corruption
    state = MPPState(model=net, module=model.encoder, optimizer=optimizer, generator=generator, mpp=model)
    resolved = _jsonable({**to_dict(config), "mpp": dataclasses.asdict(mpp)})
    resumed = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    if info.main:
        run_dir.mkdir(parents=True, exist_ok=True)
        _check_run_config(run_dir, resolved, resumed is not None)
        native.atomic_write_text(run_dir / "config.json", json.dumps(resolved, indent=2) + "\n")
    distributed.barrier()
    if resumed is not None:
        load_checkpoint(resumed, state, device)
        if info.rank:  # only rank 0's generator is saved: the others continue from a (seed, rank, step) stream
            generator.manual_seed(config.run.seed * 7919 + info.rank + 7 * state.step)
        log.info("resuming %s at step %d", resumed, state.step)
    return model, state


def _finish(model: MaskedPatchPrediction, state: MPPState, status: str, steps: int, last: dict[str, Any], run_dir: Path,
            meta: dict[str, Any], metrics: MetricsLog, info: distributed.DistInfo, held_out: ImageSet | None,
            eval_images: int, size: int, device: torch.device) -> dict[str, Any]:
    """The summary; a finished run also writes `checkpoints/final` and the held-out MPP evaluation."""
    summary: dict[str, Any] = {"status": status, "run_dir": str(run_dir), "step": state.step, "steps": steps,
                               "skipped_steps": state.skipped_steps, "loss": last.get("loss"), "accuracy": last.get("accuracy")}
    final = run_dir / "checkpoints" / "final"
    summary["checkpoint"] = str(final if status == "finished" else latest_checkpoint(run_dir))
    if status == "finished" and info.main:
        native.save(model.encoder, final, **meta)
        if held_out is not None and eval_images:
            count = min(eval_images, len(held_out))
            images = held_out.images[:count] if held_out.images is not None else torch.stack([held_out.read(i) for i in range(count)])
            test = evaluate_mpp(model, images, size, meta["mean"], meta["std"], device)
            metrics.write({"step": state.step, "split": "test", **test, "final": True})
            summary["test"] = test
    return summary
