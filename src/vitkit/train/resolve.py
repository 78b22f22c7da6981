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
from dataclasses import dataclass, field
from pathlib import Path

from vitkit.checkpoints import limits, read
from vitkit.data.folder import one_class_hint
from vitkit.data.sources import SourceInfo, check_mirror_views, data_name, describe, parse_uri, separate_val
from vitkit.data.transforms import AugmentConfig
from vitkit.models import preset_config
from vitkit.models.configs import (
    HybridConfig,
    ModelConfig,
    ResNetConfig,
    ViTConfig,
    image_size,
    in_channels,
    with_overrides,
)
from vitkit.runs import find_checkpoint
from vitkit.train.assemble import reading_of
from vitkit.train.config import TrainConfig, apply_overrides, optim_for
from vitkit.train.plan import count_params
from vitkit.train.recipes import PAPER_LR_GRID, auto_recipe_name, finetune_val_fraction, get_recipe, large_model_warning
from vitkit.train.transfer_recipes import AT_CHECKPOINT_RESOLUTION, LENGTH_BOUNDS_BUDGET

PAPER_RESOLUTION = 224  # checkpoints pre-trained below it are small-data models: fine-tuned by finetune-small
REGULARISATION = (  # the recipe's, not the checkpoint's
    "dropout",
    "attention_dropout",
    "drop_path",
    "patch_dropout",
    "patch_dropout_keep",
    "patch_dropout_until",
)

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
    init_from: str | None = None  # fine-tuning: the checkpoint (or run directory) to start from
    labels_per_class: int | None = None  # train on a fixed N images per class (data.labels_per_class)
    lr_sweep: bool = False  # fine-tuning: sweep PAPER_LR_GRID on a held-out split first
    runs_root: str = "runs"  # parent of the default run directory
    world: int = 1  # processes the run will use (torchrun's WORLD_SIZE), for the printed plan
    labelled: bool = True  # the objective learns from labels (classification); masked patch prediction does not


@dataclass
class Resolved:
    config: TrainConfig
    info: SourceInfo
    notes: list[str] = field(default_factory=list)  # printed before training
    warnings: list[str] = field(default_factory=list)
    length_given: bool = True  # the request named a length (--epochs, data.epochs, data.steps)


def resolve(request: Request, *, source_model: ModelConfig | None = None) -> Resolved:
    """The complete config for `request` (see the module docstring).

    `source_model` is the model config of `request.init_from` where that checkpoint does not exist yet (a study
    plans its fine-tuning arms before their pre-training arm has run); otherwise it is read from the checkpoint.
    """
    parse_uri(request.data)  # a clear error for a bad URI before anything else
    columns = dict(
        o.split("=", 1) for o in request.overrides if o.startswith(("data.image_column=", "data.label_column="))
    )
    info = describe(
        request.data,
        image_column=columns.get("data.image_column", ""),
        label_column=columns.get("data.label_column", ""),
        labelled=request.labelled,
    )  # hf: columns, needed to count classes
    chose = request.recipe is None
    source, norm = source_model, None
    if request.init_from and source is None:
        checkpoint = read(find_checkpoint(request.init_from))
        source, norm = checkpoint.model.config, (checkpoint.mean, checkpoint.std)
    name = auto_recipe_name(info) if chose else request.recipe
    if source is not None and chose:  # a small-data checkpoint is fine-tuned as one, on a CPU
        name = "finetune-small" if image_size(source) < PAPER_RESOLUTION else "paper-finetune"
    config = get_recipe(name, info)
    config = _apply_model(config, request, info, source, auto_recipe=chose)
    config = _source_normalisation(_apply_flags(config, request), norm)
    config = apply_overrides(config, request.overrides)
    limits.check_work(config.model, "the model to train", "choose a smaller --img-size or model")  # before any size
    check_mirror_views(request.data, config.eval.flip_views, "eval.flip_views=true")
    config = _sweep_hold_out(config, info)
    config = _budget_length(config, request)
    batch = config.data.batch_size
    user_batch = request.batch_size is not None or any(o.startswith("data.batch_size=") for o in request.overrides)
    if user_batch and batch > info.num_train:  # set by --batch-size or --set data.batch_size
        raise ValueError(
            f"a batch of {batch:,} is larger than the {info.num_train:,} training images of {request.data}: "
            f"one step would be {batch / info.num_train:.2f} epochs; use --batch-size {info.num_train} or less"
        )
    if not user_batch:
        config = _recipe_batch_within(config, _trained_images(config, info), request.world)
    if request.labelled and info.num_classes < 2:
        kind, path = parse_uri(request.data)
        raise ValueError(
            f"{request.data} has {info.num_classes} class(es); a classifier needs at least 2 "
            "(a folder of unlabelled images trains with vitkit pretrain-mpp)"
            + (one_class_hint(Path(path)) if kind == "folder" else "")
        )
    if not config.run.out:
        if request.world > 1:  # each process would stamp its own clock's second: a name they need not agree on
            raise ValueError(f"under torchrun ({request.world} processes) give --out: every process must name one run")
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        out = _claim(Path(request.runs_root) / f"{data_name(request.data)}-{_model_name(request, config)}-{stamp}")
        config = dataclasses.replace(config, run=dataclasses.replace(config.run, out=str(out)))
    return dataclasses.replace(_describe(config, info, name, chose, source), length_given=length_given(request))


def _claim(out: Path) -> Path:
    """`out`, or `out-2`, `out-3` ...: the first made here, by this process (mkdir is atomic), so that two runs
    started in the same second take two names."""
    out.parent.mkdir(parents=True, exist_ok=True)
    for number in range(1, 1000):
        path = out if number == 1 else out.with_name(f"{out.name}-{number}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{out}: a thousand runs of that name this second; give --out")


def _apply_model(
    config: TrainConfig, request: Request, info: SourceInfo, source: ModelConfig | None, auto_recipe: bool = False
) -> TrainConfig:
    model = config.model
    if source is not None:
        model = _finetune_model(source, config, info, auto_recipe)
    if request.model:
        model = preset_config(request.model, num_classes=info.num_classes, in_chans=info.channels)
        size = request.img_size if request.img_size is not None else image_size(config.model)
        stride = _stride(model)
        if size % stride:  # e.g. a /16 preset on 8 px digits: upsample to the next multiple
            size = (size // stride + 1) * stride
        model = with_overrides(model, img_size=size)
        if not isinstance(model, ResNetConfig):  # keep the recipe's regularisation and pre-logits head
            vit = model.vit if isinstance(model, HybridConfig) else model
            recipe_vit = config.model.vit if isinstance(config.model, HybridConfig) else config.model
            rep = vit.hidden_size if getattr(recipe_vit, "representation_size", None) else None
            model = with_overrides(model, dropout=_dropout(config.model), representation_size=rep)
    if request.img_size is not None:  # 0 too: the model's check refuses it
        model = with_overrides(model, img_size=request.img_size)
    augment = _rescaled_pad(config, image_size(model)) if source is not None else config.augment
    return dataclasses.replace(config, model=model, augment=augment, optim=optim_for(config.optim, model))


def _rescaled_pad(config: TrainConfig, side: int) -> AugmentConfig:
    """The recipe's pad-crop at the fine-tuning resolution: the pad is a fraction of the side (an eighth in
    finetune-small), so a 64-px checkpoint pads 8 px and a 32-px one 4."""
    augment, recipe_side = config.augment, image_size(config.model)
    if augment.crop != "pad" or not augment.pad or side == recipe_side:
        return augment
    return dataclasses.replace(augment, pad=max(1, round(augment.pad * side / recipe_side)))


def _dropout(model) -> float:
    vit = model.vit if isinstance(model, HybridConfig) else model
    return getattr(vit, "dropout", 0.0)


def _stride(model) -> int:
    if isinstance(model, HybridConfig):
        return model.stride * model.vit.patch_size
    return getattr(model, "patch_size", 32)


def _finetune_model(source: ModelConfig, config: TrainConfig, info: SourceInfo, auto_recipe: bool = False):
    """The checkpoint's architecture with a K-way head, no pre-logits (Sec. 3.2), the recipe's regularisation
    (dropout, stochastic depth, PatchDropout: pre-training settings do not carry over) and resolution.

    finetune-small, and any recipe chosen automatically for a checkpoint pre-trained below 224 px, keeps the
    checkpoint's own resolution: the paper's 384 px is a step up from 224 px, and would blow a model with tiny
    patches up to thousands of tokens.
    """
    vit = source.vit if isinstance(source, HybridConfig) else source
    target = with_overrides(source, num_classes=info.num_classes)
    recipe_vit = config.model.vit if isinstance(config.model, HybridConfig) else config.model
    if isinstance(vit, ViTConfig):  # with_overrides skips None values: drop the pre-logits layer directly
        recipe_regularisation = isinstance(recipe_vit, ViTConfig)
        regularisation = {k: getattr(recipe_vit, k) for k in REGULARISATION} if recipe_regularisation else {}
        plain = dataclasses.replace(vit, representation_size=None, num_classes=info.num_classes, **regularisation)
        target = dataclasses.replace(source, vit=plain) if isinstance(source, HybridConfig) else plain
    size = image_size(config.model)
    keep = config.recipe in AT_CHECKPOINT_RESOLUTION or (auto_recipe and image_size(source) < PAPER_RESOLUTION)
    if size % _stride(target) or keep:
        size = image_size(source)
    return with_overrides(target, img_size=size)


def _sweep_hold_out(config: TrainConfig, info: SourceInfo) -> TrainConfig:
    """A learning-rate sweep's held-out share, where none is set: App. B.1.1's by the labelled images' count
    (with data.labels_per_class, the N x K images the hold-out is taken from)."""
    data = config.data
    if not config.optim.lr_sweep or data.val_fraction > 0 or separate_val(data.uri, reading_of(config)):  # its own
        return config
    labelled = info.num_train
    if data.labels_per_class:
        labelled = min(labelled, data.labels_per_class * info.num_classes)
    return dataclasses.replace(config, data=dataclasses.replace(data, val_fraction=finetune_val_fraction(labelled)))


def length_given(request: Request) -> bool:
    """Whether the request names the run's length: --epochs, data.epochs or data.steps."""
    return request.epochs is not None or any(o.startswith(("data.epochs=", "data.steps=")) for o in request.overrides)


def _budget_length(config: TrainConfig, request: Request) -> TrainConfig:
    """With a fitted --max-minutes and no length of the user's (--epochs, data.epochs, data.steps), the budget
    alone decides the run's length (train/budget.py): the recipe's epochs are dropped, except for a recipe of
    LENGTH_BOUNDS_BUDGET, whose bound (its own epochs, or the one named there) ends the run where it comes
    before the budget."""
    run = config.run
    if length_given(request) or config.data.steps > 0 or not run.fitted:
        return config
    if config.recipe in LENGTH_BOUNDS_BUDGET:
        bound = LENGTH_BOUNDS_BUDGET[config.recipe]
        epochs = config.data.epochs if bound is None else bound
    else:
        epochs = 0.0
    return dataclasses.replace(config, data=dataclasses.replace(config.data, epochs=epochs, steps=0))


def _source_normalisation(config: TrainConfig, norm: tuple[tuple[float, ...], tuple[float, ...]] | None) -> TrainConfig:
    """A fine-tune feeds its images normalised as the checkpoint was trained (a timm or HF model's ImageNet
    mean and std; the official [-1, 1]), where it records them for as many channels: 0.5 had always been used.
    `--set data.mean=` / `data.std=` still win."""
    if norm is None or len(norm[0]) != in_channels(config.model):
        return config
    mean, std = (tuple(float(v) for v in values) for values in norm)
    return dataclasses.replace(config, data=dataclasses.replace(config.data, mean=mean, std=std))


def _trained_images(config: TrainConfig, info: SourceInfo) -> int:
    """About how many images the run trains on: the source's training split, at most `labels_per_class` a class
    and `train_fraction` of it, less the validation hold-out."""
    count = info.num_train
    if config.data.labels_per_class:
        count = min(count, config.data.labels_per_class * info.num_classes)
    count = int(count * config.data.train_fraction)
    return max(1, int(count * (1 - config.data.val_fraction)))


def _recipe_batch_within(config: TrainConfig, num_train: int, world: int) -> TrainConfig:
    """A recipe's own batch above a small training set (`num_train` images trained on) shrinks to the most of it
    that whole micro-batches of every process hold, so that one step is never several epochs (--epochs 1 is one
    pass).  A batch the user set is theirs (refused above the source's training split)."""
    data = config.data
    if data.batch_size <= num_train:
        return config
    unit = world * (data.micro_batch_size or 1)
    batch, micro = num_train // unit * unit, data.micro_batch_size
    if batch == 0:  # fewer images than one micro-batch a process: one pass each, no accumulation
        batch, micro = max(world, num_train // world * world), 0
    return dataclasses.replace(config, data=dataclasses.replace(data, batch_size=batch, micro_batch_size=micro))


def _apply_flags(config: TrainConfig, request: Request) -> TrainConfig:
    data, optim, run = config.data, config.optim, config.run
    if request.epochs is not None:
        data = dataclasses.replace(data, epochs=request.epochs, steps=0)
    if request.batch_size is not None:
        micro = (
            data.micro_batch_size if data.micro_batch_size and request.batch_size % data.micro_batch_size == 0 else 0
        )
        data = dataclasses.replace(data, batch_size=request.batch_size, micro_batch_size=min(micro, request.batch_size))
    if request.strict:
        data = dataclasses.replace(data, strict=True)
    if request.labels_per_class is not None:
        if request.labels_per_class < 1:
            raise ValueError(f"--labels-per-class must be >= 1, got {request.labels_per_class} (leave it out for all)")
        data = dataclasses.replace(data, labels_per_class=request.labels_per_class)
    if in_channels(config.model) != len(data.mean):
        norm = (0.5,) * in_channels(config.model)
        data = dataclasses.replace(data, mean=norm, std=norm)
    if request.lr is not None:
        optim = dataclasses.replace(optim, lr=request.lr, base_batch_size=0)
    if request.lr_sweep:
        optim = dataclasses.replace(optim, lr_sweep=PAPER_LR_GRID)
    updates = {
        "max_minutes": request.max_minutes,
        "seed": request.seed,
        "out": request.out,
        "init_from": request.init_from,
    }
    run = dataclasses.replace(run, **{k: v for k, v in updates.items() if v is not None})
    if request.compile:
        run = dataclasses.replace(run, compile="on")
    if request.quiet:
        run = dataclasses.replace(run, progress=False)
    return dataclasses.replace(config, data=data, optim=optim, run=run)


def _model_name(request: Request, config: TrainConfig) -> str:
    if request.model:
        return request.model
    if request.init_from:
        return "finetune"
    model = config.model
    if isinstance(model, ViTConfig):
        return f"vit-d{model.hidden_size}-l{model.depth}-p{model.patch_size}"
    return type(model).__name__.lower()


def _describe(config: TrainConfig, info: SourceInfo, name: str, chose: bool, source: ModelConfig | None) -> Resolved:
    """The lines printed before the run's plan: the recipe and why, warnings about the model's size."""
    how = f"chosen for {info.image_size}px images, {info.num_train:,} training images" if chose else "as requested"
    if chose and config.data.labels_per_class > 0:  # the recipe is the source's; the run trains on fewer
        how += f", of which --labels-per-class trains on {config.data.labels_per_class:,} a class"
    if chose and source is not None:
        how = (
            f"chosen for a checkpoint pre-trained at {image_size(source)} px; fine-tuned at "
            f"{image_size(config.model)} px"
        )
    notes = [f"recipe: {name} ({how})"]
    warnings = []
    warning = large_model_warning(count_params(config.model), info.num_train, from_scratch=not config.run.init_from)
    if warning:
        warnings.append(warning)
    if source is not None and in_channels(source) == 1 and info.channels > 1:  # the plan's "1 channel" alone
        warnings.append(
            f"the checkpoint reads 1 channel (grayscale): the {info.channels}-channel images of {info.uri} are "
            "converted to grayscale, their colour unseen"
        )
    return Resolved(config=config, info=info, notes=notes, warnings=warnings)


__all__ = ["Request", "Resolved", "resolve"]
