"""Masked-patch-prediction pre-training (App. B.1.2): the run, its schedule and its checkpoints.

Paper settings: Adam, base learning rate 2e-4, 10k warmup steps, cosine decay, batch 4096, 1M steps
on JFT ("diminishing returns after 100k steps").  Small runs scale the batch and the warmup down
(`PretrainConfig.warmup_steps`).  The weight decay is not given for MPP; 0.1, the paper's value for
supervised pre-training (App. B.1), is the default, decoupled as in AdamW.  Gradients are clipped
at global norm 1 (App. B.1).

A run directory (DESIGN.md): `config.json`, `metrics.jsonl`, `checkpoints/last/` (written every
`checkpoint_every` steps and when the time budget is spent) and `checkpoints/final/`.  Each is a
native vitkit checkpoint of the *encoder only* (no [mask] embedding, no MPP head) that `vitkit
finetune` and `vitkit fewshot` read directly; `last/` also holds `train_state.pt` (MPP head,
[mask] embedding, optimiser, step, random generators) so re-running with the same directory resumes
where it stopped.  The data order is a pure function of (seed, epoch), so a resumed run sees the
same batches as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.checkpoints import native
from vitkit.models import build_model, preset_config
from vitkit.models.configs import ModelConfig, config_to_dict, image_size, with_overrides
from vitkit.ssl.masked_patch import MaskedPatchPrediction, MPPConfig

log = logging.getLogger(__name__)

STATE_FILE = "train_state.pt"


@dataclass(frozen=True, kw_only=True)
class PretrainConfig:
    """One MPP pre-training run."""

    data: str = "digits"  # data source URI (DESIGN.md); only the training images are used, never the labels
    model: str = "auto"  # a preset name, or "auto": a small ViT suited to the data's resolution (`auto_model`)
    img_size: int | None = None  # input resolution; None = the data's native size (auto) or the preset's
    patch_size: int | None = None  # P override; None = the preset's (auto: ~4x4 ... 8x8 patches per side)
    model_overrides: dict[str, Any] = field(default_factory=dict)  # further ViTConfig fields, e.g. {"depth": 6}
    mpp: MPPConfig = field(default_factory=MPPConfig)  # corruption and targets (App. B.1.2)
    epochs: float = 10.0  # passes over the training images (paper: ~14 epochs of JFT)
    batch_size: int = 256  # global batch (paper: 4096), split over processes
    lr: float = 2e-4  # Adam base learning rate (App. B.1.2)
    warmup_steps: int | None = None  # linear warmup (paper 10k of 1M); None = min(10_000, 5% of the run)
    weight_decay: float = 0.1  # decoupled (AdamW); on weight matrices only
    betas: tuple[float, float] = (0.9, 0.999)  # Adam (App. B.1)
    grad_clip: float = 1.0  # global gradient norm (App. B.1); 0 = off
    flip: bool = True  # random horizontal flips of the pre-training images
    max_minutes: float | None = None  # stop cleanly (checkpoint saved) when this budget is spent; re-run resumes
    seed: int = 0  # model init, data order and corruption
    log_every: int = 20  # steps between metrics.jsonl records
    checkpoint_every: int = 500  # steps between `checkpoints/last` writes
    eval_images: int = 1024  # held-out images (test split) for the final MPP loss / accuracy; 0 = none
    device: str = "auto"  # "auto" = CUDA when available, else CPU

    def __post_init__(self) -> None:
        if self.epochs <= 0 or self.batch_size < 1 or self.lr <= 0:
            raise ValueError("epochs, batch_size and lr must be positive")
        if self.max_minutes is not None and self.max_minutes <= 0:
            raise ValueError(f"max_minutes must be positive, got {self.max_minutes}")
        if self.log_every < 1 or self.checkpoint_every < 1:
            raise ValueError("log_every and checkpoint_every must be >= 1")


def auto_model(image_side: int, channels: int) -> ModelConfig:
    """A small ViT for small images: D=192 "Ti" width, 6 layers, patches giving a 4x4 ... 8x8 grid."""
    patch = next((p for p in (4, 7, 8, 16, 32) if image_side % p == 0 and image_side // p <= 8), None)
    if patch is None:
        raise ValueError(f"no automatic patch size for {image_side}-pixel images; pass --img-size and --patch-size")
    return preset_config(
        "vit_ti16", num_classes=0, img_size=image_side, patch_size=patch, in_chans=channels, depth=6
    )


def model_config(config: PretrainConfig, image_side: int, channels: int) -> ModelConfig:
    """The encoder's config: no classification head (fine-tuning adds one), the data's channels."""
    side = config.img_size or image_side
    if config.model == "auto":
        resolved = auto_model(side, channels)
        fields = {"patch_size": config.patch_size, **config.model_overrides}
        return with_overrides(resolved, **fields)
    return preset_config(
        config.model, num_classes=0, img_size=config.img_size, in_chans=channels, patch_size=config.patch_size,
        representation_size=None, **config.model_overrides,
    )


def learning_rate(step: int, total: int, warmup: int, base: float) -> float:
    """Linear warmup to `base` over `warmup` steps, then cosine decay to 0 at `total` (App. B.1.2)."""
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def make_optimizer(model: nn.Module, config: PretrainConfig) -> torch.optim.Optimizer:
    """AdamW; decay on matrices (ndim >= 2) only, never on biases, LayerNorms, tokens or position embeddings."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        plain = param.ndim >= 2 and not any(k in name for k in ("pos_embed", "cls_token", "mask_token", "rel_pos"))
        (decay if plain else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas)


def save_encoder(model: MaskedPatchPrediction, directory: Path, config: PretrainConfig, step: int) -> Path:
    """A native vitkit checkpoint of the encoder alone: the [mask] embedding and MPP head are dropped."""
    provenance = {"objective": "masked_patch_prediction", "step": step, "data": config.data, "mpp": dataclasses.asdict(config.mpp)}
    return native.save(
        model.encoder, directory, class_names=None, mean=config.mpp.mean, std=config.mpp.std, provenance=provenance
    )


@dataclass
class _Data:
    """Training images (uint8, in memory) and the fixed held-out images."""

    train: Tensor  # (N, C, H, W) uint8
    held_out: Tensor | None  # (M, C, H, W) uint8


def _load_data(config: PretrainConfig) -> _Data:
    from vitkit.data.sources import load_split

    train = load_split(config.data, "train", image_size=config.img_size, seed=config.seed)
    if train.images is None:
        raise ValueError(f"{config.data}: MPP pre-training needs an in-memory image set (got a file-based one)")
    held = None
    if config.eval_images:
        test = load_split(config.data, "test", image_size=config.img_size, seed=config.seed)
        held = test.images[: config.eval_images] if test.images is not None else None
    return _Data(train=train.images, held_out=held)


def _prepare(images: Tensor, size: int, config: PretrainConfig, generator: torch.Generator | None) -> Tensor:
    """uint8 (B, C, H, W) -> normalised float at `size`, flipped at random when a generator is given."""
    x = images.float() / 255.0
    if x.shape[-1] != size or x.shape[-2] != size:
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    if generator is not None and config.flip:
        flip = torch.rand(x.shape[0], generator=generator, device=generator.device) < 0.5
        x = torch.where(flip.to(x.device).view(-1, 1, 1, 1), x.flip(-1), x)
    chans = x.shape[1]
    mean = x.new_tensor(config.mpp.mean[:chans]).view(1, chans, 1, 1)
    std = x.new_tensor(config.mpp.std[:chans]).view(1, chans, 1, 1)
    return (x - mean) / std


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _world() -> tuple[int, int]:
    """(rank, world size) of an initialised torch.distributed group, else (0, 1)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _append_metrics(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as handle:  # an append of one line; a killed run loses at most that line
        handle.write(json.dumps(record) + "\n")


def _write_last(run: Path, model: MaskedPatchPrediction, optimizer: torch.optim.Optimizer, step: int, config: PretrainConfig, generators: dict[str, torch.Generator]) -> None:
    """Write `checkpoints/last` as a whole: build it beside, then swap directories."""
    folder = run / "checkpoints"
    tmp, last, old = folder / ".last.tmp", folder / "last", folder / ".last.old"
    shutil.rmtree(tmp, ignore_errors=True)
    save_encoder(model, tmp, config, step)
    state = {
        "step": step,
        "mpp": {k: v for k, v in model.state_dict().items() if not k.startswith("encoder.")},
        "optimizer": optimizer.state_dict(),
        "generators": {k: g.get_state() for k, g in generators.items()},
    }
    native.atomic_write(tmp / STATE_FILE, lambda path: torch.save(state, path))
    shutil.rmtree(old, ignore_errors=True)
    if last.exists():
        last.rename(old)
    tmp.rename(last)
    shutil.rmtree(old, ignore_errors=True)


def _resume(run: Path, model: MaskedPatchPrediction, optimizer: torch.optim.Optimizer, generators: dict[str, torch.Generator]) -> int:
    """Load `checkpoints/last` (or the previous one, if a swap was interrupted); returns the step, 0 if none."""
    folder = run / "checkpoints"
    last = next((p for p in (folder / "last", folder / ".last.old") if (p / STATE_FILE).is_file()), None)
    if last is None:
        return 0
    encoder = native.load(last).model
    native.load_state_dict_strict(model.encoder, encoder.state_dict(), source=str(last))
    try:
        state = torch.load(last / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as err:  # a damaged file must name itself, not surface a pickle traceback
        raise ValueError(f"cannot read {last / STATE_FILE}: {err}") from None
    missing = model.load_state_dict({**{f"encoder.{k}": v for k, v in model.encoder.state_dict().items()}, **state["mpp"]}, strict=False)
    if missing.missing_keys or missing.unexpected_keys:
        raise ValueError(f"{last / STATE_FILE} does not fit this MPP model: {missing}")
    optimizer.load_state_dict(state["optimizer"])
    for name, generator in generators.items():
        generator.set_state(state["generators"][name])
    log.info("resuming from %s at step %d", last, state["step"])
    return int(state["step"])


def _check_run_config(run: Path, resolved: dict[str, Any]) -> None:
    """Refuse to resume a run directory written with another configuration (time budget aside)."""
    path = run / "config.json"
    if path.is_file():
        old = json.loads(path.read_text())
        ignore = ("max_minutes", "device", "log_every", "checkpoint_every")
        differ = [k for k in resolved["pretrain"] if k not in ignore and old.get("pretrain", {}).get(k) != resolved["pretrain"][k]]
        if differ or old.get("model") != resolved["model"]:
            raise ValueError(f"{run} holds a run with another configuration (differs in {differ or ['model']}); use a new --out")
    native.atomic_write_text(path, json.dumps(resolved, indent=2) + "\n")


def pretrain(config: PretrainConfig, out: str | Path, images: Tensor | None = None, held_out: Tensor | None = None) -> dict[str, Any]:
    """Run (or resume) MPP pre-training into the run directory `out`; returns a summary dict.

    `images` (uint8 (N, C, H, W)) replaces loading `config.data`; `held_out` likewise for the final
    evaluation.  The summary holds "step", "epochs", "finished", "loss", "accuracy", "checkpoint".
    """
    return run_pretraining(config, out, images, held_out)[1]


def run_pretraining(config: PretrainConfig, out: str | Path, images: Tensor | None = None, held_out: Tensor | None = None) -> tuple[MaskedPatchPrediction, dict[str, Any]]:
    """`pretrain`, also returning this process's MaskedPatchPrediction module (encoder + [mask] + head)."""
    run = Path(out)
    data = _load_data(config) if images is None else _Data(train=images, held_out=held_out)
    rank, world = _world()
    device = _device(config.device)
    torch.manual_seed(config.seed)
    encoder = build_model(model_config(config, data.train.shape[-1], data.train.shape[1]))
    model = MaskedPatchPrediction(encoder, config.mpp).to(device)
    size = image_size(encoder.config)
    if config.batch_size % world:
        raise ValueError(f"batch size {config.batch_size} is not divisible by {world} processes")
    per_epoch = len(data.train) // config.batch_size
    if per_epoch < 1:
        raise ValueError(f"batch size {config.batch_size} is larger than the {len(data.train)} training images")
    total = math.ceil(config.epochs * per_epoch)
    warmup = config.warmup_steps if config.warmup_steps is not None else min(10_000, max(1, round(0.05 * total)))
    resolved = {
        "pretrain": json.loads(json.dumps(dataclasses.asdict(config))),
        "model": config_to_dict(encoder.config),
        "total_steps": total,
        "warmup_steps": warmup,
        "world_size": world,
    }
    if rank == 0:
        (run / "checkpoints").mkdir(parents=True, exist_ok=True)
        _check_run_config(run, resolved)
    optimizer = make_optimizer(model, config)
    # Separate streams for flips and corruption, one per process, saved with the checkpoint.
    generators = {name: torch.Generator(device=device).manual_seed(config.seed * 1000 + offset + 17 * rank) for offset, name in enumerate(("flip", "corrupt"))}
    step = _resume(run, model, optimizer, generators)
    net = model
    if world > 1:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    log.info("MPP pre-training %s on %d images: %d steps (%d per epoch), warmup %d, batch %d, target %s",
             config.model, len(data.train), total, per_epoch, warmup, config.batch_size, config.mpp.target)
    start, finished, last_record = time.monotonic(), False, {}
    metrics = run / "metrics.jsonl"
    model.train()
    while step < total:
        epoch, offset = divmod(step, per_epoch)
        order = torch.randperm(len(data.train), generator=torch.Generator().manual_seed(config.seed * 100_003 + epoch))
        index = order[offset * config.batch_size : (offset + 1) * config.batch_size][rank::world]
        batch = _prepare(data.train[index].to(device), size, config, generators["flip"])
        lr = learning_rate(step, total, warmup, config.lr)
        stats = train_step(net, optimizer, batch, generators["corrupt"], lr, config.grad_clip, step)
        step += 1
        if rank == 0 and (step % config.log_every == 0 or step == total):
            last_record = {"step": step, "epoch": round(step / per_epoch, 4), "split": "train", **stats, "lr": lr,
                           "seconds": round(time.monotonic() - start, 2)}
            _append_metrics(metrics, last_record)
            log.info("step %d/%d  loss %.4f  accuracy %s  lr %.2e", step, total, last_record["loss"], last_record["accuracy"], lr)
        out_of_time = _agree(config.max_minutes is not None and time.monotonic() - start > 60 * config.max_minutes, device)
        if rank == 0 and (step % config.checkpoint_every == 0 or out_of_time or step == total):
            _write_last(run, model, optimizer, step, config, generators)
        if out_of_time:
            log.info("time budget of %.1f min spent at step %d; re-run with the same --out to resume", config.max_minutes, step)
            break
    finished = step >= total
    summary: dict[str, Any] = {"step": step, "total_steps": total, "epochs": round(step / per_epoch, 4), "finished": finished,
                               "loss": last_record.get("loss"), "accuracy": last_record.get("accuracy"),
                               "checkpoint": str(run / "checkpoints" / ("final" if finished else "last"))}
    if rank == 0 and finished:
        save_encoder(model, run / "checkpoints" / "final", config, step)
        if data.held_out is not None and len(data.held_out):
            held = evaluate_mpp(model, data.held_out, size, config, device)
            record = {"step": step, "epoch": summary["epochs"], "split": "test", **held}
            _append_metrics(metrics, record)
            summary.update({"test_loss": held["loss"], "test_accuracy": held.get("top1")})
    return model, summary


def train_step(net: nn.Module, optimizer: torch.optim.Optimizer, batch: Tensor, generator: torch.Generator, lr: float,
               grad_clip: float, step: int) -> dict[str, float | None]:
    """One optimiser step on a normalised batch; returns {"loss", "accuracy"} (accuracy None for "pixels").

    bf16 autocast on CUDA (DESIGN.md), fp32 on CPU; a non-finite loss raises before any update.
    """
    for group in optimizer.param_groups:
        group["lr"] = lr
    device = batch.device
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        out = net(batch, generator)
    loss = out["loss"]
    if not torch.isfinite(loss):
        raise ValueError(f"non-finite MPP loss {loss.item()} at step {step}; the last checkpoint is kept")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip:
        nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]], grad_clip)
    optimizer.step()
    return {"loss": loss.item(), "accuracy": _finite_or_none(out["accuracy"])}


def _agree(flag: bool, device: torch.device) -> bool:
    """True on every process when it is true on any (so all ranks stop at the same step)."""
    if _world()[1] == 1:
        return flag
    value = torch.tensor([float(flag)], device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value.item())


@torch.no_grad()
def evaluate_mpp(model: MaskedPatchPrediction, images: Tensor, size: int, config: PretrainConfig, device: torch.device, batch_size: int = 256) -> dict[str, float]:
    """MPP loss and prediction accuracy (top-1 / top-5 over corrupted patches) on held-out images, fixed corruption seed."""
    was_training = model.training
    model.eval()
    generator = torch.Generator(device=device).manual_seed(12345)
    loss_sum, top1, top5, count = 0.0, 0.0, 0.0, 0
    for start in range(0, len(images), batch_size):
        batch = _prepare(images[start : start + batch_size].to(device), size, config, None)
        out = model(batch, generator)
        weight = int(out["mask"].sum())
        loss_sum += float(out["loss"]) * weight
        if config.mpp.target != "pixels":
            logits = out["predictions"][out["mask"]].reshape(-1, model.num_colors)
            labels = out["targets"][out["mask"]].reshape(-1, 1)
            best = logits.topk(min(5, model.num_colors), dim=-1).indices
            top1 += float((best[:, :1] == labels).any(-1).float().mean()) * weight
            top5 += float((best == labels).any(-1).float().mean()) * weight
        count += weight
    model.train(was_training)
    result = {"loss": loss_sum / count}
    if config.mpp.target != "pixels":
        result.update({"top1": top1 / count, "top5": top5 / count})
    return result


def _finite_or_none(value: Tensor) -> float | None:
    """A float for metrics.jsonl; None (JSON null) for the NaN accuracy of the "pixels" target."""
    number = float(value)
    return number if math.isfinite(number) else None
