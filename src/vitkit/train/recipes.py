"""Recipes: functions returning complete TrainConfigs (STYLE.md section 3).

recipe               when                                     what
-------------------  ---------------------------------------  ----------------------------------------------------------
paper-pretrain       Sec. 4.1, App. B.1, Table 3              Adam (0.9, 0.999), wd 0.1, warmup 10k + linear decay,
                                                              clip 1, dropout 0.1, batch 4096 (accumulated),
                                                              pre-logits head
paper-finetune       App. B.1.1, Table 4                      SGD momentum 0.9, cosine, no wd, clip 1, batch 512
                                                              (accumulated), zero-init head, 384 px,
                                                              optional EMA 0.9999, LR sweep
small-8px            auto: sides <= 12 px (digits)            ViT D=64 L=4 on 4x4 patches, pad-crop shift, AdamW
small-28px           auto: sides <= 30 px (MNIST, Fashion)    ViT D=64 L=4 on 4x4 patches (7x7 tokens), content-first
                                                              PatchDropout, Muon, linear decay, pad-crop 1 px + flip
small-32px           auto: sides <= 40 px (CIFAR)             ViT D=192 L=6 on 4x4 patches (8x8 tokens), PatchDropout,
                                                              mimetic init, Muon, linear decay, pad-crop + flip
small-64px           auto: larger images, < 20,000 of them    resize to 64, ViT D=192 L=6 on 8x8 patches,
                                                              inception crop + flip + RandAugment
small-64px-pretrain  auto: larger images, >= 20,000           train/transfer_recipes.py: pre-training for
                                                              `vitkit finetune` (Tiny-ImageNet)
finetune-small       `vitkit finetune` of a small checkpoint  train/transfer_recipes.py: SGD momentum + cosine at
                                                              the checkpoint's resolution

Every recipe has a "-tiny" variant (D=32, L=2, k=2) that runs in seconds on a CPU, used by tests.
The small-data recipes exist because a plain ViT trained from scratch on a small set needs smaller
patches, stronger augmentation and longer schedules than the paper's (Sec. 4.2: ViT lacks the
CNN's inductive biases and "does not generalize well when trained on insufficient amounts of data").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from vitkit.data.sources import SourceInfo
from vitkit.data.transforms import AugmentConfig
from vitkit.models import preset_config
from vitkit.models.configs import ViTConfig, with_overrides
from vitkit.train import transfer_recipes
from vitkit.train.config import EvalConfig, OptimConfig, RunConfig, TrainConfig
from vitkit.train.recipe_parts import data_config, flip, small_muon, small_vit, tiny_vit

PAPER_LR_GRID = (0.001, 0.003, 0.01, 0.03)  # Table 4 fine-tuning learning rates (ImageNet adds 0.06 for ResNets)


# ---------------------------------------------------------------------------------- the paper
def paper_pretrain(info: SourceInfo, model: str = "vit_b16") -> TrainConfig:
    """Pre-training as Sec. 4.1 / App. B.1 / Table 3 (ImageNet-21k column for ViT-B).

    Command:  vitkit train --data folder:/data/imagenet21k --recipe paper-pretrain --model vit_b16
    Expected: the paper's ImageNet-21k ViT-B/16 after 90 epochs (fine-tuned: 84.0% ImageNet top-1,
    Table 5); about 30 TPUv3-core-days (Sec. 4.2) -- not a CPU job.  Batch 4096 is reached on
    small devices by accumulating micro-batches of 128 per process.  Loss: softmax cross-entropy;
    `--set optim.loss=sigmoid` gives big_vision's ImageNet-21k choice (summed per-class sigmoid CE,
    suited to multi-label JFT/i21k), `--set augment.label_smoothing=0.1` the regulariser of Sec. 4.2.
    Weight decay 0.1 is decoupled and scaled by the scheduled lr (see vitkit.train.optim).
    """
    base = preset_config(model, num_classes=info.num_classes, img_size=224, in_chans=info.channels)
    width = base.vit.hidden_size if hasattr(base, "vit") else getattr(base, "hidden_size", 0)
    if width:  # the pre-training head has a tanh pre-logits layer of width D (Sec. 3.1)
        base = with_overrides(base, representation_size=width, dropout=0.1)
    return TrainConfig(
        recipe="paper-pretrain",
        model=base,
        data=data_config(info, batch_size=4096, micro_batch_size=128, epochs=90, workers=8),
        augment=AugmentConfig(crop="inception", flip=flip(info)),
        optim=OptimConfig(
            name="adamw",
            lr=1e-3,
            base_batch_size=4096,
            lr_scaling="linear",
            betas=(0.9, 0.999),
            weight_decay=0.1,
            decay_on="kernels",
            schedule="linear",
            warmup_steps=10_000,
            clip_norm=1.0,
            loss="softmax",
        ),
        eval=EvalConfig(every_epochs=1.0, batch_size=256),
        run=RunConfig(checkpoint_every=1000, log_every=50),
    )


def paper_pretrain_tiny(info: SourceInfo) -> TrainConfig:
    """paper-pretrain's optimiser, schedule shape, clipping, dropout and pre-logits head at toy scale.

    Command:  vitkit train --data digits --recipe paper-pretrain-tiny
    Expected: runs in seconds on a CPU (accumulates 4 micro-batches of 16); accuracy is not the point.
    """
    config = paper_pretrain(info)
    return dataclasses.replace(
        config,
        recipe="paper-pretrain-tiny",
        model=tiny_vit(info, img_size=16, patch_size=4, representation_size=32, dropout=0.1),
        data=dataclasses.replace(config.data, batch_size=64, micro_batch_size=16, epochs=0, steps=20, workers=0),
        optim=dataclasses.replace(config.optim, base_batch_size=64, warmup_steps=5),
        eval=EvalConfig(every_epochs=0, batch_size=256),
        run=RunConfig(checkpoint_every=10, log_every=5),
    )


def finetune_val_fraction(num_train: int) -> float:
    """Held-out share for the LR sweep (App. B.1.1: 10% Pets/Flowers, 2% CIFAR, 1% ImageNet)."""
    if num_train < 20_000:
        return 0.1
    return 0.02 if num_train < 500_000 else 0.01


def paper_finetune(info: SourceInfo, model: str = "vit_b16") -> TrainConfig:
    """Fine-tuning as App. B.1.1 / Table 4: SGD momentum 0.9, cosine, no weight decay, clip 1, batch 512.

    Used by `vitkit finetune CHECKPOINT --data URI`: the head is replaced by a zero-initialised
    D x K layer and the position embeddings are 2D-interpolated to 384 px (Sec. 3.2).  Steps follow
    Table 4 by data set size (500 for Pets/Flowers-sized sets, 10k for CIFAR-sized, 20k beyond).
    `--lr-sweep` scores {0.001, 0.003, 0.01, 0.03} on a held-out split, then trains the best on all of it.
    Command:  vitkit finetune vit_b16_i21k/ --data cifar10:/data/cifar10 --lr-sweep
    Expected: ~98.9% CIFAR-10 top-1 from the i21k ViT-B/16 (Table 5); GPU hours, not a CPU job.
    """
    steps = 500 if info.num_train < 10_000 else (10_000 if info.num_train < 500_000 else 20_000)
    return TrainConfig(
        recipe="paper-finetune",
        model=preset_config(model, num_classes=info.num_classes, img_size=384, in_chans=info.channels),
        data=data_config(info, batch_size=512, micro_batch_size=64, epochs=0, steps=steps, workers=8),
        augment=AugmentConfig(crop="inception", crop_scale=(0.05, 1.0), flip=flip(info)),
        optim=OptimConfig(
            name="sgd",
            lr=0.003,
            momentum=0.9,
            weight_decay=0.0,
            schedule="cosine",
            warmup_steps=min(500, steps // 10),
            clip_norm=1.0,
            ema_decay=0.0,
        ),
        eval=EvalConfig(every_epochs=0, batch_size=128),
        run=RunConfig(checkpoint_every=500, log_every=20),
    )


def paper_finetune_tiny(info: SourceInfo) -> TrainConfig:
    """paper-finetune at toy scale (32 px, 16 steps of 64 accumulated from 32s).

    Command:
        vitkit finetune runs/<pretrain-tiny-run>/checkpoints/step_0000020 --data digits --recipe paper-finetune-tiny
    Expected: seconds on a CPU.
    """
    config = paper_finetune(info)
    return dataclasses.replace(
        config,
        recipe="paper-finetune-tiny",
        model=tiny_vit(info, img_size=32, patch_size=8),
        data=dataclasses.replace(config.data, batch_size=64, micro_batch_size=32, steps=16, workers=0),
        optim=dataclasses.replace(config.optim, lr=0.01, warmup_steps=2),
        run=RunConfig(checkpoint_every=8, log_every=4),
    )


# ------------------------------------------------------------------------------ small data sets
def small_8px(info: SourceInfo) -> TrainConfig:
    """Tiny images (scikit-learn digits, 8x8): ViT D=64 L=4 k=4 on 4x4 patches, GAP, short AdamW run.

    For the embedded default data set: a first run that finishes in well under a minute on a CPU.
    Command:  vitkit train            (the default data set is `digits`)
    Expected: 97.8-98.9% test top-1 over seeds 0-3 on the 359 held-out digits (seed 0: 98.33% in 0.4 min on
    an AVX512-BF16 host, 98.61% in 0.4 min under the AVX2 emulation without native bf16; 2-core CPUs) (rows:
    benchmarks/results/train_budget.jsonl, data "digits").
    """
    model = ViTConfig(
        img_size=8,
        patch_size=4,
        in_chans=info.channels,
        num_classes=info.num_classes,
        hidden_size=64,
        depth=4,
        num_heads=4,
        mlp_dim=128,
        pool="gap",
    )
    return TrainConfig(
        recipe="small-8px",
        model=model,
        data=data_config(info, batch_size=128, epochs=60, workers=0),
        augment=AugmentConfig(crop="pad", pad=1, flip=flip(info), label_smoothing=0.1),
        optim=OptimConfig(
            name="adamw", lr=4e-3, weight_decay=0.05, schedule="cosine", warmup_fraction=0.05, clip_norm=1.0
        ),
        eval=EvalConfig(every_epochs=0, batch_size=512),
        # Tiny matmuls: more threads only spin (10x slower on a loaded CPU); precision "auto" measures bf16
        # against fp32 and keeps fp32 here, where autocast's casts cost more than bf16 saves.
        run=RunConfig(checkpoint_every=200, log_every=20, threads=1),
    )


def small_28px(info: SourceInfo) -> TrainConfig:
    """28x28 sets (MNIST, Fashion-MNIST): ViT D=64 L=4 k=4 MLP 256 on 4x4 patches (49 tokens), PatchDropout, Muon.

    For a CPU time budget, where the best use of 10-15 minutes is a small model seeing many epochs.
    PatchDropout 0.75 for the first 70% of the schedule, keeping the patches whose pixels vary before blank
    background (model.patch_dropout_keep="content": 12 of 49 patches, on MNIST 11.8 of them with stroke
    against 4.5 for a random 12), then every patch.  Muon on the encoder's 16 matrices and AdamW on the rest,
    at one lr 2e-3 and weight decay, decayed linearly, so the all-patch phase still trains at 30% -> 0 of the
    peak.  Exact GELU: torch's eager tanh GELU is ~2.5x slower on the CPU (benchmarks/cpu_kernels.py).
    Pad-crop of 1 px (a quarter of a patch); flips where a mirror keeps the label (Fashion-MNIST, not
    `mnist:`; --set augment.flip=... decides).  A model this small is bound by per-operation overhead, which
    torch.compile removes (1.3-1.5x the images/s; run.compile decides).  Without a budget it runs 30 epochs.
    Command:  vitkit train --data fashion-mnist:../shared/data/fashion-mnist --max-minutes 15
              vitkit train --data mnist:../shared/data/mnist --max-minutes 10
    Expected: test top-1 of those commands (benchmarks/train_budget.py; 2 threads, cold compile included):
      AMX:                  Fashion-MNIST 94.00-94.15% (~73 epochs); MNIST 99.56-99.60% (37-51 epochs)
      AVX512-BF16:          Fashion-MNIST 93.99-94.19% (80-100 epochs, 3 runs)
      ~50 epochs in 15 min: Fashion-MNIST 93.50-93.98% (an AMX host in 10.5 min, standing in for one
                            of two thirds its speed)
      AVX2, no native bf16: Fashion-MNIST 92.30-92.81% (18-24 epochs); MNIST 99.37-99.42% (11-14 epochs); fp32
    Rows: benchmarks/results/train_budget.jsonl; how the recipe got here: docs/experiments/fashion-mnist-recipe.md.
    """
    model = ViTConfig(
        img_size=28,
        patch_size=4,
        in_chans=info.channels,
        num_classes=info.num_classes,
        hidden_size=64,
        depth=4,
        num_heads=4,
        mlp_dim=256,
        pool="gap",
        gelu="exact",
        patch_dropout=0.75,
        patch_dropout_keep="content",
        patch_dropout_until=0.7,
    )
    return TrainConfig(
        recipe="small-28px",
        model=model,
        data=data_config(info, batch_size=128, epochs=30, workers=0),
        augment=AugmentConfig(crop="pad", pad=1, flip=flip(info), label_smoothing=0.1),
        optim=OptimConfig(
            name="muon", lr=2e-3, weight_decay=0.05, schedule="linear", warmup_fraction=0.03, clip_norm=1.0
        ),
        eval=EvalConfig(
            every_epochs=0, batch_size=1000
        ),  # every training image trains; --set eval.every_epochs=5 holds out a val part
        run=RunConfig(checkpoint_every=500, log_every=50),
    )


def small_32px(info: SourceInfo) -> TrainConfig:
    """32x32 colour sets (CIFAR-10/100): ViT D=192 L=6 k=3 on 4x4 patches (64 tokens), PatchDropout, mimetic init, Muon.

    For a CPU time budget, as small-28px.  PatchDropout 0.75 (16 of 64 tokens) for the first 80% of the
    schedule, then every patch; mimetic initialisation of the attention (Trockman & Kolter 2023;
    models/mimetic.py); stochastic depth 0.1, a 4-px pad-crop and flips, no RandAugment (it slowed learning
    within 30 minutes); Muon on the encoder's 24 matrices at lr 2e-3 and AdamW on the rest at 4e-3
    (optim.muon_lr_scale=1/2), decayed linearly.  Without a budget the recipe runs 100 epochs.
    Command:  vitkit train --data folder:../shared/data/cifar10-jpg --max-minutes 30
    Expected: test top-1 on its fixed 10,000-image hold-out (benchmarks/train_budget.py cifar10; 2 threads,
    cold compile included):
      AMX:                           79.99-81.42% (76-86 epochs)
      AVX512-BF16 (AMD EPYC, Zen 4): 79.82-80.36% (41-43 epochs)
      AVX2, no native bf16:          72.56%, 72.57% (10.6-10.9 epochs; two runs, fp32)
    Rows: benchmarks/results/train_budget.jsonl; how the recipe got here: docs/experiments/cifar10-recipe.md.
    """
    model = small_vit(info, 32, 4, patch_dropout=0.75, patch_dropout_until=0.8, init="mimetic")
    return TrainConfig(
        recipe="small-32px",
        model=model,
        data=data_config(info, batch_size=256, epochs=100, workers=2),
        augment=AugmentConfig(crop="pad", pad=4, flip=flip(info), label_smoothing=0.1),
        optim=small_muon(),  # matrices at 2e-3, AdamW's at 4e-3
        # every training image trains; --set eval.every_epochs=5 holds out a val part
        eval=EvalConfig(every_epochs=0, batch_size=500),
        run=RunConfig(checkpoint_every=1000, log_every=50),
    )


def small_64px(info: SourceInfo) -> TrainConfig:
    """Larger images (folders such as caltech101-10): resized to 64 px, ViT D=192 L=6 on 8x8 patches.

    Command:  vitkit train --data folder:../shared/data/caltech101-10 --max-minutes 5
    Expected: 52.55-54.08% test top-1 on its 392-image val/ (3 runs, 25-27 epochs; AVX2, no native bf16,
    2 threads, fp32): well below a CNN's accuracy from scratch (Sec. 4.2) -- fine-tune a pre-trained
    checkpoint for real accuracy (docs/fine-tune-your-images.md).
    """
    model = small_vit(info, 64, 8)
    epochs = 100 if info.num_train < 20_000 else 30
    return TrainConfig(
        recipe="small-64px",
        model=model,
        data=data_config(info, batch_size=128, epochs=epochs, workers=2),
        augment=AugmentConfig(
            crop="inception", crop_scale=(0.25, 1.0), flip=flip(info), randaugment=(2, 9), label_smoothing=0.1
        ),
        optim=OptimConfig(
            name="adamw", lr=1e-3, weight_decay=0.05, schedule="cosine", warmup_fraction=0.05, clip_norm=1.0
        ),
        eval=EvalConfig(every_epochs=5, batch_size=256),
        run=RunConfig(checkpoint_every=500, log_every=20),
    )


def _tiny(
    recipe: Callable[[SourceInfo], TrainConfig], name: str, img_size: int, patch_size: int
) -> Callable[[SourceInfo], TrainConfig]:
    def tiny(info: SourceInfo) -> TrainConfig:
        config = recipe(info)
        return dataclasses.replace(
            config,
            recipe=name,
            model=tiny_vit(info, img_size=img_size, patch_size=patch_size, pool="gap"),
            data=dataclasses.replace(config.data, batch_size=32, epochs=0, steps=10, workers=0),
            augment=dataclasses.replace(config.augment, randaugment=None),
            eval=EvalConfig(every_epochs=0, batch_size=256),
            run=RunConfig(checkpoint_every=5, log_every=5),
        )

    tiny.__doc__ = (
        f"{recipe.__name__} at toy scale (D=32, L=2, k=2, 10 steps of 32).\n\n"
        f"    Command:  vitkit train --data digits --recipe {name}\n    Expected: a few seconds on a CPU.\n"
    )
    return tiny


RECIPES: dict[str, Callable[[SourceInfo], TrainConfig]] = {
    "paper-pretrain": paper_pretrain,
    "paper-pretrain-tiny": paper_pretrain_tiny,
    "paper-finetune": paper_finetune,
    "paper-finetune-tiny": paper_finetune_tiny,
    "small-8px": small_8px,
    "small-8px-tiny": _tiny(small_8px, "small-8px-tiny", 8, 2),
    "small-28px": small_28px,
    "small-28px-tiny": _tiny(small_28px, "small-28px-tiny", 28, 7),
    "small-32px": small_32px,
    "small-32px-tiny": _tiny(small_32px, "small-32px-tiny", 32, 8),
    "small-64px": small_64px,
    "small-64px-tiny": _tiny(small_64px, "small-64px-tiny", 32, 8),
    "small-64px-pretrain": transfer_recipes.small_64px_pretrain,
    "small-64px-pretrain-tiny": transfer_recipes.small_64px_pretrain_tiny,
    "finetune-small": transfer_recipes.finetune_small,
    "finetune-small-tiny": transfer_recipes.finetune_small_tiny,
}


def auto_recipe_name(info: SourceInfo) -> str:
    """The small-data recipe for a source's typical image side (DESIGN.md "Contracts")."""
    if info.image_size <= 12:
        return "small-8px"
    if info.image_size <= 30:
        return "small-28px"
    if info.image_size <= 40:
        return "small-32px"
    return "small-64px-pretrain" if transfer_recipes.pretrains_at_64px(info) else "small-64px"


def get_recipe(name: str, info: SourceInfo) -> TrainConfig:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; choose from {', '.join(RECIPES)}")
    return RECIPES[name](info)


def large_model_warning(params: int, num_train: int, from_scratch: bool) -> str | None:
    """Sec. 4.2 / Fig. 3: big ViTs trained from scratch on small sets underperform; say so."""
    if not from_scratch or num_train <= 0:
        return None
    # ViT-L/B trained on ImageNet-1k alone (1.3M images) already trail smaller models (Fig. 3); a
    # preset-sized model (> 5M) with far more parameters than images (> 1000x) is a red flag too.
    if (params > 20_000_000 and num_train < 1_000_000) or (params > 5_000_000 and params > 1000 * num_train):
        return (
            f"training a {params / 1e6:.1f}M-parameter ViT from scratch on {num_train:,} images: the paper "
            "(Sec. 4.2, Fig. 3) needs ImageNet-21k/JFT-scale data for large ViTs to beat smaller ones; "
            "expect overfitting. Consider a smaller --model or `vitkit finetune` from a pre-trained checkpoint."
        )
    return None
