"""From what a user asks (`vitkit train --data URI --model ...`) to one complete TrainConfig.

The CLI turns flags into a `Request`; `resolve` picks the recipe (named, or chosen from
`describe(uri)`), applies the first-class flags and then the dotted `--set` overrides, and returns
the config with the lines worth printing before the run (recipe, model, parameters, global batch,
learning-rate rule, warnings).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from vitkit.checkpoints import read
from vitkit.data.sources import SourceInfo, describe, parse_uri
from vitkit.models import preset_config
from vitkit.models.configs import HybridConfig, ResNetConfig, ViTConfig, image_size, in_channels, with_overrides
from vitkit.train.config import TrainConfig, apply_overrides
from vitkit.train.plan import count_params
from vitkit.train.recipes import (PAPER_LR_GRID, auto_recipe_name, finetune_val_fraction, get_recipe,
                                  large_model_warning)

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Request:
    """The user's wishes; None / empty = the recipe's choice."""

    data: str = "digits"  # source URI
    recipe: str | None = None  # recipe name; None = chosen from the data set's size and resolution
    model: str | None = None  # preset name (vitkit models lists them)
    epochs: float | None = None
    batch_size: int | None = None  # effective global batch
    lr: float | None = None
    img_size: int | None = None
    max_minutes: float | None = None
    seed: int | None = None
    out: str | None = None
    overrides: tuple[str, ...] = ()  # "group.field=value"
    strict: bool = False
    compile: bool = False
    quiet: bool = False  # no progress bar (--json)
    init_from: str | None = None  # fine-tuning: the checkpoint to start from
    lr_sweep: bool = False  # fine-tuning: sweep PAPER_LR_GRID on a held-out split first
    runs_root: str = "runs"  # parent of the default run directory
    world: int = 1  # processes the run will use (torchrun's WORLD_SIZE), for the printed plan


@dataclass
class Resolved:
    config: TrainConfig
    info: SourceInfo
    notes: list[str] = field(default_factory=list)  # printed before training
    warnings: list[str] = field(default_factory=list)


def resolve(request: Request) -> Resolved:
    """The complete config for `request` (see the module docstring)."""
    parse_uri(request.data)  # a clear error for a bad URI before anything else
    columns = dict(o.split("=", 1) for o in request.overrides if o.startswith(("data.image_column=", "data.label_column=")))
    info = describe(request.data, image_column=columns.get("data.image_column", ""),
                    label_column=columns.get("data.label_column", ""))  # hf: columns, needed to count classes
    chose = request.recipe is None
    name = auto_recipe_name(info) if chose else request.recipe
    if request.init_from and chose:
        name = "paper-finetune"
    config = get_recipe(name, info)
    config = _apply_model(config, request, info, auto_recipe=chose)
    config = _apply_flags(config, request, info)
    config = apply_overrides(config, request.overrides)
    config = _budget_length(config, request)
    if not config.run.out:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = Path(request.runs_root) / f"{_data_name(request.data)}-{_model_name(request, config)}-{stamp}"
        config = dataclasses.replace(config, run=dataclasses.replace(config.run, out=str(out)))
    return _describe(config, info, name, chose, request)


def _apply_model(config: TrainConfig, request: Request, info: SourceInfo, auto_recipe: bool = False) -> TrainConfig:
    model = config.model
    if request.init_from:
        model = _finetune_model(request.init_from, config, info, auto_recipe)
    if request.model:
        model = preset_config(request.model, num_classes=info.num_classes, in_chans=info.channels)
        size = request.img_size or image_size(config.model)
        stride = _stride(model)
        if size % stride:  # e.g. a /16 preset on 8 px digits: upsample to the next multiple
            size = (size // stride + 1) * stride
        model = with_overrides(model, img_size=size)
        if not isinstance(model, ResNetConfig):  # keep the recipe's regularisation and pre-logits head
            vit = model.vit if isinstance(model, HybridConfig) else model
            recipe_vit = config.model.vit if isinstance(config.model, HybridConfig) else config.model
            rep = vit.hidden_size if getattr(recipe_vit, "representation_size", None) else None
            model = with_overrides(model, dropout=_dropout(config.model), representation_size=rep)
    if request.img_size:
        model = with_overrides(model, img_size=request.img_size)
    return dataclasses.replace(config, model=model)


def _dropout(model) -> float:
    vit = model.vit if isinstance(model, HybridConfig) else model
    return getattr(vit, "dropout", 0.0)


def _stride(model) -> int:
    if isinstance(model, HybridConfig):
        return model.stride * model.vit.patch_size
    return getattr(model, "patch_size", 32)


def _finetune_model(path: str, config: TrainConfig, info: SourceInfo, auto_recipe: bool = False):
    """The checkpoint's architecture with a K-way head, no pre-logits (Sec. 3.2) and the recipe's resolution.

    With the recipe chosen automatically, a checkpoint pre-trained below 224 px (a small-data model)
    keeps its own resolution: the paper's 384 px is a step up from 224 px, and would blow a model with
    tiny patches up to thousands of tokens.
    """
    source = read(path).model.config
    vit = source.vit if isinstance(source, HybridConfig) else source
    target = with_overrides(source, num_classes=info.num_classes)
    if isinstance(vit, ViTConfig):  # with_overrides skips None values: drop the pre-logits layer directly
        plain = dataclasses.replace(vit, representation_size=None, num_classes=info.num_classes)
        target = dataclasses.replace(source, vit=plain) if isinstance(source, HybridConfig) else plain
    size = image_size(config.model)
    if size % _stride(target) or (auto_recipe and image_size(source) < 224):
        size = image_size(source)
    return with_overrides(target, img_size=size)


def _budget_length(config: TrainConfig, request: Request) -> TrainConfig:
    """With a fitted --max-minutes and no length of the user's (--epochs, data.epochs, data.steps), the budget
    alone decides the run's length (train/budget.py): the recipe's epochs are dropped."""
    given = request.epochs is not None or any(o.startswith(("data.epochs=", "data.steps=")) for o in request.overrides)
    run = config.run
    if given or config.data.steps > 0 or run.max_minutes <= 0 or run.budget_schedule != "fit":
        return config
    return dataclasses.replace(config, data=dataclasses.replace(config.data, epochs=0.0, steps=0))


def _apply_flags(config: TrainConfig, request: Request, info: SourceInfo) -> TrainConfig:
    data, optim, run = config.data, config.optim, config.run
    if request.epochs is not None:
        data = dataclasses.replace(data, epochs=request.epochs, steps=0)
    if request.batch_size is not None:
        micro = data.micro_batch_size if data.micro_batch_size and request.batch_size % data.micro_batch_size == 0 else 0
        data = dataclasses.replace(data, batch_size=request.batch_size, micro_batch_size=min(micro, request.batch_size))
    if request.strict:
        data = dataclasses.replace(data, strict=True)
    if in_channels(config.model) != len(data.mean):
        norm = (0.5,) * in_channels(config.model)
        data = dataclasses.replace(data, mean=norm, std=norm)
    if request.lr is not None:
        optim = dataclasses.replace(optim, lr=request.lr, base_batch_size=0)
    if request.lr_sweep:
        optim = dataclasses.replace(optim, lr_sweep=PAPER_LR_GRID)
        data = dataclasses.replace(data, val_fraction=data.val_fraction or finetune_val_fraction(info.num_train))
    updates = {"max_minutes": request.max_minutes, "seed": request.seed, "out": request.out,
               "init_from": request.init_from}
    run = dataclasses.replace(run, **{k: v for k, v in updates.items() if v is not None})
    if request.compile:
        run = dataclasses.replace(run, compile="on")
    if request.quiet:
        run = dataclasses.replace(run, progress=False)
    return dataclasses.replace(config, data=data, optim=optim, run=run)


def _data_name(uri: str) -> str:
    kind, path = parse_uri(uri)
    tail = Path(path).stem if path else ""
    name = kind if not tail or tail == kind else f"{kind}-{tail}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _model_name(request: Request, config: TrainConfig) -> str:
    if request.model:
        return request.model
    if request.init_from:
        return "finetune"
    model = config.model
    if isinstance(model, ViTConfig):
        return f"vit-d{model.hidden_size}-l{model.depth}-p{model.patch_size}"
    return type(model).__name__.lower()


def _describe(config: TrainConfig, info: SourceInfo, name: str, chose: bool, request: Request) -> Resolved:
    """The lines printed before the run's plan: the recipe and why, warnings about the model's size."""
    how = f"chosen for {info.image_size}px images, {info.num_train:,} training images" if chose else "as requested"
    notes = [f"recipe: {name} ({how})"]
    warnings = []
    warning = large_model_warning(count_params(config.model), info.num_train, from_scratch=not config.run.init_from)
    if warning:
        warnings.append(warning)
    return Resolved(config=config, info=info, notes=notes, warnings=warnings)


__all__ = ["Request", "Resolved", "resolve"]
