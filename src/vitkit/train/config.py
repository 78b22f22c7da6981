"""TrainConfig: one frozen dataclass per concern, nested at most two levels (STYLE.md section 3).

    TrainConfig.model    the network (a vitkit ModelConfig: ViTConfig, HybridConfig or ResNetConfig)
    TrainConfig.data     where images come from and how many are seen (batch, epochs, accumulation)
    TrainConfig.augment  vitkit.data.transforms.AugmentConfig (crop, flip, RandAugment, Mixup, smoothing)
    TrainConfig.optim    optimiser, learning-rate schedule, clipping, weight decay, EMA, loss
    TrainConfig.eval     when and how to evaluate
    TrainConfig.run      seed, time budget, checkpoints, precision, compile, parallelism

`apply_overrides` turns `--set a.b=v` strings into a new config, type-checked against each field.
`to_dict` / `from_dict` are exact inverses; the dict goes to `config.json` in the run directory.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from vitkit.data.transforms import AugmentConfig
from vitkit.models.configs import HybridConfig, ModelConfig, ViTConfig, config_from_dict, config_to_dict
from vitkit.overrides import apply_fields, split_item
from vitkit.ssl.masked_patch import MPPConfig

Precision = Literal["auto", "fp32", "bf16"]
Parallel = Literal["ddp", "fsdp"]
Compile = Literal["auto", "on", "off"]
MAX_EPOCHS = 1e6  # beyond any run; 1e300 planned a 300-digit step count
MAX_STEPS = 10**9  # beyond any run; 1e20 planned a warm-up that never ended
MAX_MINUTES = 1e6  # about two years; 1e308 overflowed the plan
MAX_WORKERS = 256  # DataLoader processes; 100,000 passed and would have forked as many
MAX_SEED = 2**32 - 1  # numpy's SeedSequence and the data order (data/stream.order_seed) take any seed to here


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """The data set and how it is batched.  Image side length is the model's `img_size`."""

    uri: str = "digits"  # vitkit.data source URI (DESIGN.md "Data sources")
    batch_size: int = 128  # effective global batch: images per optimiser step over all processes
    micro_batch_size: int = 0  # images per forward pass per process; 0 = batch_size / world (no accumulation)
    # passes over the training split (ignored when steps > 0); 0 and 0 steps under a fitted time budget: as many as fit
    epochs: float = 10.0
    steps: int = 0  # optimiser steps; 0 = derived from epochs
    val_fraction: float = 0.0  # held-out part of train for model selection / the LR sweep (App. B.1.1)
    # train on a fixed class-stratified part of the training split (data-size studies, Sec. 4.3)
    train_fraction: float = 1.0
    labels_per_class: int = 0  # train on a fixed N images of each class (10 inside 100); 0 = all (--labels-per-class)
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)  # x = (pixel/255 - mean)/std; 0.5/0.5 = the official [-1, 1]
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    workers: int = 2  # DataLoader workers for file-based sets (in-memory sets need none)
    strict: bool = False  # a corrupt file stops the run instead of being skipped and counted
    max_in_memory_mb: int = 2048  # a decoded folder larger than this is read from files by DataLoader workers
    image_column: str = ""  # hf: sources: the image column when its type does not single it out
    label_column: str = ""  # hf: sources: the label column when its type does not single it out

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.micro_batch_size < 0:
            raise ValueError(
                f"batch_size must be >= 1 and micro_batch_size >= 0, got {self.batch_size}/{self.micro_batch_size}"
            )
        if self.micro_batch_size and self.batch_size % self.micro_batch_size:
            raise ValueError(
                f"batch_size {self.batch_size} is not a multiple of micro_batch_size {self.micro_batch_size}"
            )
        if self.epochs < 0 or self.steps < 0:
            raise ValueError(f"epochs and steps must be >= 0 (0 = not set), got {self.epochs} / {self.steps}")
        if self.steps > MAX_STEPS:
            raise ValueError(f"need data.steps <= {MAX_STEPS:.0e}, got {self.steps:.3g}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
        if not 0.0 < self.train_fraction <= 1.0:
            raise ValueError(f"train_fraction must be in (0, 1], got {self.train_fraction}")
        if self.labels_per_class < 0 or (self.labels_per_class and self.train_fraction < 1.0):
            raise ValueError(
                f"labels_per_class must be >= 0 and is not combined with train_fraction < 1, got "
                f"{self.labels_per_class} / {self.train_fraction}"
            )
        if not all(v > 0 for v in self.std):
            raise ValueError(f"data.std must be > 0 (pixels are divided by it), got {self.std}")
        if self.epochs > MAX_EPOCHS or not 0 <= self.workers <= MAX_WORKERS or self.max_in_memory_mb < 0:
            raise ValueError(
                f"need epochs <= {MAX_EPOCHS:g}, 0 <= workers <= {MAX_WORKERS} and max_in_memory_mb >= 0; got "
                f"{self.epochs:g}, "
                f"{self.workers}, {self.max_in_memory_mb}"
            )

    @property
    def has_length(self) -> bool:
        """Whether the run has a length of its own (epochs or steps); without one a time budget decides it."""
        return self.epochs > 0 or self.steps > 0


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """Optimiser, schedule and loss (Sec. 4.1 "Training & Fine-tuning", App. B.1, Tables 3-4)."""

    # pre-training: Adam; fine-tuning: SGD with momentum; muon: train/optim.py
    name: Literal["adamw", "sgd", "muon"] = "adamw"
    lr: float = 1e-3  # peak learning rate after warmup, for `base_batch_size` images per step
    base_batch_size: int = 0  # batch the lr was tuned for; 0 = data.batch_size (no rescaling)
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"  # lr *= (batch/base) or its sqrt when they differ
    muon_lr_scale: float = 1.0  # name="muon": the encoder matrices' lr is lr x this (AdamW's part keeps lr)
    betas: tuple[float, float] = (0.9, 0.999)  # Adam beta1, beta2 (Sec. 4.1)
    eps: float = 1e-8  # Adam epsilon
    momentum: float = 0.9  # SGD momentum (App. B.1.1)
    weight_decay: float = 0.0  # decoupled, multiplied by the scheduled lr (flax.optim.Adam / torch AdamW)
    decay_on: Literal["all", "kernels"] = "kernels"  # "kernels": no decay on biases, norms, pos-embed, [class]
    schedule: Literal["cosine", "linear", "constant"] = "cosine"  # decay after the linear warmup
    warmup_steps: int = 0  # linear warmup from 0 (Table 3: 10k steps)
    warmup_fraction: float = 0.0  # alternative: warmup as a fraction of all steps (used when warmup_steps == 0)
    warmup_max_steps: int = 0  # cap on the fraction's warmup, 0 = none (App. B.1.2 MPP: 10k)
    end_lr_fraction: float = 0.0  # lr at the last step as a fraction of the peak
    clip_norm: float = 1.0  # global gradient norm clip (Tables 3-4); 0 = off
    ema_decay: float = 0.0  # Polyak averaging of the weights (Sec. 4.1: 0.9999); 0 = off
    loss: Literal["softmax", "sigmoid"] = "softmax"  # cross-entropy; "sigmoid" as big_vision's i21k pre-training
    lr_sweep: tuple[float, ...] = ()  # fine-tuning grid (Table 4); non-empty = sweep on a held-out split first

    def __post_init__(self) -> None:
        if self.muon_lr_scale <= 0:  # other optimisers ignore it: `--set optim.name=adamw` works on a Muon recipe
            raise ValueError(f"muon_lr_scale must be > 0, got {self.muon_lr_scale}")
        if self.lr <= 0 or self.weight_decay < 0 or self.clip_norm < 0:
            raise ValueError(
                f"need lr > 0, weight_decay >= 0, clip_norm >= 0 (got {self.lr}, {self.weight_decay}, {self.clip_norm})"
            )
        if not 0.0 <= self.ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")
        if not 0.0 <= self.warmup_fraction < 1.0 or self.warmup_steps < 0 or self.warmup_max_steps < 0:
            raise ValueError(
                "need optim.warmup_fraction in [0, 1), warmup_steps and warmup_max_steps >= 0; got "
                f"{self.warmup_fraction:g}, {self.warmup_steps}, {self.warmup_max_steps}"
            )
        if any(lr <= 0 for lr in self.lr_sweep):
            raise ValueError(f"every lr_sweep value must be > 0, got {self.lr_sweep}")
        if not 0.0 <= self.end_lr_fraction <= 1.0 or self.base_batch_size < 0 or self.eps <= 0:
            raise ValueError(
                f"need end_lr_fraction in [0, 1], base_batch_size >= 0 and eps > 0; got {self.end_lr_fraction}, "
                f"{self.base_batch_size}, {self.eps}"
            )
        if not all(0.0 <= beta < 1.0 for beta in self.betas) or not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"betas and momentum must be in [0, 1), got {self.betas} / {self.momentum}")


def optim_for(optim: OptimConfig, model: ModelConfig) -> OptimConfig:
    """A recipe's optimiser for `model`: Muon trains a Transformer encoder's matrices and AdamW the rest, so a
    model without an encoder (a BiT ResNet) trains every parameter with Muon's AdamW part (the same lr, decay and
    schedule).  Recipes and studies that swap in such a model go through here; an explicit `--set optim.name=muon`
    does not, and the optimiser refuses it, saying why."""
    if optim.name != "muon" or isinstance(model, (ViTConfig, HybridConfig)):
        return optim
    return dataclasses.replace(optim, name="adamw")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Evaluation during and after training."""

    every_epochs: float = 1.0  # evaluate the val (or test) split this often; 0 = only at the end
    batch_size: int = 512  # images per evaluation forward pass
    final_split: Literal["test", "val"] = "test"  # the split of the last line of metrics.jsonl
    flip_views: bool = False  # classify each image and its mirror image, average the logits (test-time augmentation)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"eval.batch_size must be >= 1, got {self.batch_size}")
        if not self.every_epochs >= 0:  # NaN too
            raise ValueError(f"eval.every_epochs must be >= 0 (0: at the end only), got {self.every_epochs:g}")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """How the run executes: reproducibility, budget, checkpoints and hardware."""

    out: str = ""  # run directory; "" = runs/<data>-<model>-<timestamp> (chosen by train/resolve.py)
    seed: int = 0  # seeds init, data order, augmentation and dropout
    max_minutes: float = 0.0  # stop cleanly when spent, then evaluate and save; 0 = no budget
    # with max_minutes: fit = the schedule runs by the clock and ends annealed when the budget (whole run) is spent
    # (train/budget.py); cut = stop this invocation when spent
    budget_schedule: Literal["fit", "cut"] = "fit"
    checkpoint_every: int = 500  # optimiser steps between checkpoints (also at the end and on SIGTERM/SIGINT)
    # training minutes between checkpoints besides checkpoint_every, read at log steps (train/stop.py); 0 = off
    checkpoint_minutes: float = 5.0
    log_every: int = 20  # optimiser steps between train records in metrics.jsonl
    nan_patience: int = 5  # consecutive non-finite losses (each skipped) before the run stops
    # deferred: skip on the device (fused optimiser), read at log steps; auto = deferred on CUDA but for FSDP/Muon
    nan_check: Literal["auto", "sync", "deferred"] = "auto"
    # "auto" = bf16 autocast where the device has native bf16 and it measures faster for the model (vitkit.device),
    # else fp32
    precision: Precision = "auto"
    # torch.compile the model: "auto" = where the run saves more time than compiling costs (train/compiled.py)
    compile: Compile = "auto"
    parallel: Parallel = "ddp"  # with several processes: replicate (DDP) or shard (FSDP2, CUDA only)
    device: str = "auto"  # "auto" = cuda when available (this process's local rank), else cpu
    threads: int = 0  # torch intra-op CPU threads for this run; 0 = torch's default (small models: 1 is fastest)
    progress: bool = True  # tqdm bar on stderr (also needs a TTY)
    tensorboard: bool = True  # write TensorBoard events when the package is installed
    init_from: str = ""  # checkpoint to start from (fine-tuning): head surgery + resolution change

    def __post_init__(self) -> None:
        if isinstance(self.compile, bool):  # config.json of runs written when run.compile was a bool
            object.__setattr__(self, "compile", "on" if self.compile else "off")
        if self.compile not in ("auto", "on", "off"):
            raise ValueError(f"run.compile must be auto, on or off, got {self.compile!r}")
        if self.checkpoint_every < 1 or self.log_every < 1 or self.nan_patience < 1:
            raise ValueError(
                "run.checkpoint_every, log_every and nan_patience must be >= 1; got "
                f"{self.checkpoint_every}, {self.log_every}, {self.nan_patience}"
            )
        if not self.checkpoint_minutes >= 0:  # NaN too
            raise ValueError(f"run.checkpoint_minutes must be >= 0 (0: off), got {self.checkpoint_minutes:g}")
        if self.threads < 0 or not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"need run.threads >= 0 and 0 <= seed < 2**32; got {self.threads} / {self.seed}")
        if self.max_minutes < 0:
            raise ValueError(f"--max-minutes (run.max_minutes) must be >= 0 (0: no budget), got {self.max_minutes:g}")
        if self.max_minutes > MAX_MINUTES:
            raise ValueError(f"--max-minutes (run.max_minutes) must be <= {MAX_MINUTES:g}, got {self.max_minutes:g}")

    @property
    def fitted(self) -> bool:
        return budget_fitted(self.max_minutes, self.budget_schedule)


def budget_fitted(max_minutes: float, budget_schedule: str) -> bool:
    """A time budget the schedule is fitted to (it ends annealed, perhaps before its length)."""
    return max_minutes > 0 and budget_schedule == "fit"


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """A complete run: what recipes return and what `config.json` records."""

    recipe: str = "custom"  # name of the recipe this config came from (informational)
    model: ModelConfig = field(default_factory=lambda: ViTConfig(img_size=32, patch_size=4, num_classes=10))
    data: DataConfig = field(default_factory=DataConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)
    mpp: MPPConfig | None = None  # masked patch prediction (App. B.1.2) as the objective; None = classification

    def __post_init__(self) -> None:
        if not self.data.has_length and not self.run.fitted:
            raise ValueError(
                "set data.epochs > 0 or data.steps > 0, or a fitted time budget (run.max_minutes > 0) "
                "to decide the run's length"
            )
        if self.run.parallel == "fsdp" and self.run.device == "cpu":
            raise ValueError("run.parallel='fsdp' needs CUDA; use 'ddp' on CPU")
        if self.run.parallel == "fsdp" and self.mpp is not None:
            raise ValueError(  # its gathered state would hold the MPP wrapper's keys, not the encoder's
                "masked patch prediction (vitkit pretrain-mpp) is not supported with run.parallel='fsdp'; use 'ddp'"
            )
        if self.run.parallel == "fsdp" and self.optim.ema_decay > 0:
            raise ValueError("optim.ema_decay (Polyak averaging) is not supported with run.parallel='fsdp'")
        if self.optim.name == "muon" and (self.run.parallel == "fsdp" or self.run.nan_check == "deferred"):
            raise ValueError(
                "optim.name='muon' orthogonalises whole matrices and has no fused kernel: it needs "
                "run.parallel other than 'fsdp' and run.nan_check other than 'deferred'"
            )


GROUPS = ("model", "data", "augment", "optim", "eval", "run", "mpp")

_RESOLUTIONS = "progressive resolution was removed (it lost to training at the model's resolution); use --img-size"
_LATER = (
    "stepped PatchDropout was removed (it lost to one rate); model.patch_dropout applies until "
    "model.patch_dropout_until, then every patch"
)
_TIERS = (
    "the run-length regularisation rule was removed; set model.drop_path and augment.pad (the recipe's "
    "fixed setting) directly"
)
# Fields that lost their experiments and were removed: name -> (the value that did nothing, what to do instead).
REMOVED: dict[str, tuple[Any, str]] = {
    "data.resolutions": ((), _RESOLUTIONS),
    "data.resolution_until": ((), _RESOLUTIONS),
    "data.patch_dropout_later": ((), _LATER),
    "data.patch_dropout_later_until": ((), _LATER),
    "optim.ema_warmup": (False, "the EMA warm-up was removed (it lost); optim.ema_decay averages from the first step"),
    "optim.light_below_epochs": (0.0, _TIERS),
    "optim.heavy_from_epochs": (0.0, _TIERS),
}
# Fields that moved: old key -> new key (PatchDropout's settings are one group, model.patch_dropout*).
MOVED = {"data.patch_dropout_until": "model.patch_dropout_until"}


def to_dict(config: TrainConfig) -> dict[str, Any]:
    """JSON-ready dict (the model through its family-tagged form)."""
    out: dict[str, Any] = {"recipe": config.recipe, "model": config_to_dict(config.model)}
    for name in GROUPS[1:]:
        if getattr(config, name) is not None:  # mpp: only for a masked-patch-prediction run
            out[name] = dataclasses.asdict(getattr(config, name))
    return out


def from_dict(data: dict[str, Any]) -> TrainConfig:
    """Inverse of `to_dict`; unknown keys raise a ValueError naming them."""
    groups = {
        "data": DataConfig,
        "augment": AugmentConfig,
        "optim": OptimConfig,
        "eval": EvalConfig,
        "run": RunConfig,
        "mpp": MPPConfig,
    }
    unknown = sorted(set(data) - set(GROUPS) - {"recipe"})
    if unknown:
        raise ValueError(f"unknown train config key(s) {unknown}")
    data = _moved(data)
    parts: dict[str, Any] = {"recipe": data.get("recipe", "custom"), "model": config_from_dict(data["model"])}
    for name, cls in groups.items():
        if name == "mpp" and data.get("mpp") is None:
            continue
        group = data.get(name, {})
        if not isinstance(group, dict):
            raise ValueError(f"the config's {name} is a {type(group).__name__}, not a group of fields")
        values = _without_removed(name, dict(group))
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        bad = sorted(set(values) - names)
        if bad:
            raise ValueError(f"unknown field(s) {bad} in {name} (valid: {sorted(names)})")
        try:
            parts[name] = cls(**{k: _from_json(v, hints[k], f"{name}.{k}") for k, v in values.items()})
        except (TypeError, AttributeError, OverflowError) as error:  # a value of the wrong type: "128" for an int
            raise ValueError(f"the config's {name} holds a value of the wrong type ({error})") from None
    return TrainConfig(**parts)


def _moved(data: dict[str, Any]) -> dict[str, Any]:
    """A stored config with its moved fields at their new keys (runs written before the move hold the old ones)."""
    data = {key: dict(value) if isinstance(value, dict) else value for key, value in data.items()}
    for old, new in MOVED.items():
        group, name = old.split(".")
        if name in data.get(group, {}):
            value = data[group].pop(name)
            target = data["model"].get("vit", data["model"]) if isinstance(data.get("model"), dict) else None
            if target is not None and value != 1.0:  # a ViT's (or a hybrid's ViT's) field; 1.0 is its default
                target[new.split(".")[1]] = value
    return data


def _without_removed(group: str, values: dict[str, Any]) -> dict[str, Any]:
    """A stored group without the removed fields, which a run written before their removal may hold: where
    such a field is at its neutral value it is dropped; otherwise the run cannot be reproduced, and says why."""
    for key in [k for k in values if f"{group}.{k}" in REMOVED]:
        neutral, why = REMOVED[f"{group}.{key}"]
        value = values.pop(key)
        if (tuple(value) if isinstance(value, list) else value) != neutral:
            raise ValueError(f"{group}.{key}={value!r}: {why}")
    return values


def _from_json(value: Any, hint: Any, key: str) -> Any:
    """JSON lists back to tuples where the field is a tuple; NaN and infinities (which JSON readers take) refused,
    as `--set` refuses them."""
    for number in value if isinstance(value, list) else [value]:
        if isinstance(number, float) and not math.isfinite(number):
            raise ValueError(f"{key} is {number}, not a finite number")
    if isinstance(value, list) and _is_tuple(hint):
        return tuple(value)
    return value


def _is_tuple(hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_is_tuple(arg) for arg in typing.get_args(hint))
    return origin is tuple or hint is tuple


def apply_overrides(config: TrainConfig, overrides: list[str] | tuple[str, ...]) -> TrainConfig:
    """Apply `group.field=value` strings, each parsed and checked against the field's type.

    All fields change together, so that fields checked against each other (such as data.batch_size and
    data.micro_batch_size, or optim.name and run.parallel) can be set by separate strings in any order.
    Unknown groups or fields, removed fields and values of the wrong type raise a ValueError naming them.
    """
    changes: dict[str, dict[str, str]] = {}
    for item in overrides:
        key, text = split_item(item)
        group, _, name = key.partition(".")
        if group == "recipe" and not name:
            config = dataclasses.replace(config, recipe=text)
            continue
        if key in REMOVED:
            raise ValueError(f"--set {key}: {REMOVED[key][1]}")
        if key in MOVED:
            raise ValueError(f"--set {key}: moved to {MOVED[key]}")
        if group not in GROUPS or not name or "." in name:
            raise ValueError(f"--set {key!r}: unknown key; use one of {', '.join(g + '.<field>' for g in GROUPS)}")
        if group == "mpp" and config.mpp is None:
            raise ValueError(f"--set {key}: mpp.* fields configure masked patch prediction (vitkit pretrain-mpp)")
        changes.setdefault(group, {})[name] = text
    groups = {group: apply_fields(getattr(config, group), items, group) for group, items in changes.items()}
    return dataclasses.replace(config, **groups) if groups else config  # one check across the groups
