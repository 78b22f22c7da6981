"""The paper's central path at laptop scale: pre-train on a large, varied set, then fine-tune (Sec. 3.2, 4.2).

    small-64px-pretrain   chosen by `vitkit train` for images above 40 px, >= 20,000 of them (Tiny-ImageNet):
                          ViT D=192 L=6 k=3 on 8x8 patches at 64 px, tanh pre-logits head, PatchDropout, Muon
    finetune-small        chosen by `vitkit finetune` for a checkpoint pre-trained below 224 px: its model at its
                          resolution, a new zero-init head, PatchDropout 0.5, SGD with momentum and cosine decay
                          at batch 128

Each has a -tiny variant that runs in seconds on a CPU (tests).  `vitkit reproduce transfer` measures what the
path gains over training on the target alone (reproduce/transfer.py).
"""

from __future__ import annotations

import dataclasses

from vitkit.data.sources import SourceInfo
from vitkit.data.transforms import AugmentConfig
from vitkit.train.config import EvalConfig, OptimConfig, RunConfig, TrainConfig
from vitkit.train.recipe_parts import data_config, flip, small_muon, small_vit, tiny_vit

PRETRAIN_MIN_IMAGES = 20_000  # "tens of thousands of images": below this a 64-px source trains small-64px
FINETUNE_LR = 0.01  # SGD at batch 128: the middle of the paper's grid {0.001, 0.003, 0.01, 0.03} (Table 4)
FINETUNE_MAX_EPOCHS = 100.0  # finetune-small under --max-minutes: as many epochs as fit, at most these
# Recipes that fine-tune at the checkpoint's own resolution (--img-size asks for another): train/resolve.py.
AT_CHECKPOINT_RESOLUTION = frozenset({"finetune-small", "finetune-small-tiny"})
# Recipes whose length also bounds a --max-minutes run (train/resolve.py): more epochs than that overfit.  The
# value is the bound under a budget, None for the recipe's own epochs.  finetune-small: a fast host's 15 minutes
# hold ~850 epochs of 100 labels a class; the AVX2 runs' 63-145 epochs did better (transfer.jsonl).
LENGTH_BOUNDS_BUDGET: dict[str, float | None] = {"small-64px-pretrain": None, "finetune-small": FINETUNE_MAX_EPOCHS}


def small_64px_pretrain(info: SourceInfo) -> TrainConfig:
    """Pre-training on tens of thousands of 64-px images (Tiny-ImageNet): ViT D=192 L=6 k=3 on 8x8 patches.

    The first step of the paper's path at laptop scale: a plain ViT of the paper's family whose checkpoint
    `vitkit finetune` and `vitkit fewshot` start from.  The model is small-32px's (D=192, L=6, k=3, MLP 384,
    GAP) at 64 px on 8x8 patches: the same 64 tokens, so about the same speed, with the paper's pre-training
    head, a tanh pre-logits layer of width D (Sec. 3.1, App. B.1; fine-tuning drops it).  Its speed on a CPU
    comes as small-32px's: PatchDropout 0.75 (16 of 64 tokens) for the first 80% of the schedule, then every
    patch; mimetic attention init; Muon on the encoder's matrices at lr 2e-3 and AdamW on the rest at 4e-3,
    decayed linearly.  Regularised for ~200 images a class: stochastic depth 0.1, a pad-crop of 8 px (an
    eighth of the side, as small-32px's 4 of 32) and flips, label smoothing 0.1.  Chosen automatically for
    images above 40 px with at least 20,000 training images.  It runs 60 epochs, under --max-minutes too: the
    run ends at its 60th epoch or at the budget, whichever comes first, annealed either way.
    Command:  vitkit train --data wds:../shared/data/tiny-imagenet --max-minutes 60
    Expected: test top-1 on the shards' fixed 10,100-image hold-out (202 classes, 40,400 training images);
    35.02% and 35.10% (22.1 and 23.4 epochs: the budget ends it) on an AVX2 host without native bf16 (AMD
    EPYC, Zen 3; two runs); 35.23%, 34.79% and 35.35% (seeds 0-2, mean 35.12%; 60 epochs in 33 minutes
    alone) on an AVX512-BF16 host (AMD EPYC, Zen 5), where the hour would hold 140 epochs and gave 32.27%,
    overfitting (train loss 1.2 against a test loss of 3.3).  Target >= 35% with
    native bf16, >= 25% without (benchmarks/transfer.py pretrain; rows: benchmarks/results/transfer.jsonl).
    """
    model = small_vit(info, 64, 8, representation_size=192, patch_dropout=0.75, patch_dropout_until=0.8, init="mimetic")
    return TrainConfig(
        recipe="small-64px-pretrain",
        model=model,
        data=data_config(info, batch_size=256, epochs=60, workers=2),
        augment=AugmentConfig(crop="pad", pad=8, flip=flip(info), label_smoothing=0.1),
        optim=small_muon(),
        eval=EvalConfig(every_epochs=0, batch_size=500),  # every training image trains
        run=RunConfig(checkpoint_every=1000, log_every=50),
    )


def small_64px_pretrain_tiny(info: SourceInfo) -> TrainConfig:
    """small-64px-pretrain at toy scale (D=32, L=2, k=2 at 16 px on 4x4 patches, pre-logits head; 10 steps of 32).

    Command:  vitkit train --data digits --recipe small-64px-pretrain-tiny
    Expected: a few seconds on a CPU.
    """
    config = small_64px_pretrain(info)
    return dataclasses.replace(
        config,
        recipe="small-64px-pretrain-tiny",
        model=tiny_vit(info, img_size=16, patch_size=4, pool="gap", representation_size=32, patch_dropout=0.5),
        data=dataclasses.replace(config.data, batch_size=32, epochs=0, steps=10, workers=0),
        augment=dataclasses.replace(config.augment, pad=2),
        eval=EvalConfig(every_epochs=0, batch_size=256),
        run=RunConfig(checkpoint_every=5, log_every=5),
    )


def finetune_small(info: SourceInfo) -> TrainConfig:
    """Fine-tuning a small checkpoint on a CPU: App. B.1.1's SGD with momentum, at a CPU's batch and minutes.

    Chosen by `vitkit finetune CHECKPOINT` for a checkpoint pre-trained below 224 px.  The model is the
    checkpoint's (train/resolve.py): a new zero-initialised D x K head, the pre-logits layer dropped (Sec. 3.2),
    at the checkpoint's resolution (`--img-size` asks for a larger one; the position embeddings are
    interpolated in 2D), the images resized to it (CIFAR's 32 px up to a 64-px checkpoint's 64).  Training is
    the paper's fine-tuning: SGD with momentum 0.9, no weight decay, gradient clipping at norm 1, a linear
    warm-up over 5% of the steps, then cosine decay to 0; at batch 128 rather than 512, for more steps in a
    CPU's minutes; lr 0.01, the middle of the paper's grid, or the best of {0.001, 0.003, 0.01, 0.03} on a
    held-out part of train with --lr-sweep.  PatchDropout 0.5 (half the tokens) for the first 80% of the
    schedule, then every patch: on a CPU the budget holds ~1.5x the epochs, and the one run each measured
    gained 1.7 points over none (benchmarks/results/transfer.jsonl).  Stochastic depth 0.1 as in pre-training;
    a pad-crop of an eighth of the side and flips; no label smoothing.  `--set optim.ema_decay=0.999` evaluates
    a Polyak average of the weights (Sec. 4.1: 0.9999 over the paper's 10,000+ steps; a CPU run has ~1-2,000).
    Without a budget it runs 10 epochs; under --max-minutes as many as fit, at most FINETUNE_MAX_EPOCHS (100).
    Command:  vitkit finetune RUN --data folder:../shared/data/cifar10-jpg --max-minutes 15
    Expected: CIFAR-10 top-1 on the folder's fixed 10,000-image hold-out from the small-64px-pretrain
    Tiny-ImageNet checkpoint; target: at least what small-32px reaches from scratch in 30 minutes (81% on a
    native-bf16 host, >= 70% without), and >= 15 points over from-scratch in the same 15 minutes at
    --labels-per-class 100.  Measured on an AVX2 host without native bf16 (benchmarks/transfer.py finetune;
    rows: benchmarks/results/transfer.jsonl): 66.32-67.05% (2.6-2.9 epochs at 64 px; 3 runs); without PatchDropout
    64.86% (1.76 epochs).  On an AVX512-BF16 host: 75.78%, 76.19% and 76.40% from the three 60-epoch
    checkpoints (seeds 0-2; 18.8-21.8 epochs); at 100 labels a class 56.77%, 56.68% and 56.55% (seeds 0-2;
    100 epochs) against 41.57%, 42.28% and 41.04% from scratch (mean gain +15.04 points).
    """
    model = small_vit(info, 64, 8, patch_dropout=0.5, patch_dropout_until=0.8)
    return TrainConfig(
        recipe="finetune-small",
        model=model,  # the checkpoint's architecture replaces this model (resolve.py)
        data=data_config(info, batch_size=128, epochs=10, workers=2),
        augment=AugmentConfig(crop="pad", pad=8, flip=flip(info)),  # pad: an eighth of the side, rescaled with it
        optim=OptimConfig(
            name="sgd",
            lr=FINETUNE_LR,
            momentum=0.9,
            weight_decay=0.0,
            schedule="cosine",
            warmup_fraction=0.05,
            clip_norm=1.0,
            ema_decay=0.0,
        ),
        eval=EvalConfig(every_epochs=0, batch_size=500),
        run=RunConfig(checkpoint_every=500, log_every=20),
    )


def finetune_small_tiny(info: SourceInfo) -> TrainConfig:
    """finetune-small at toy scale (10 steps of 32).

    Command:  vitkit finetune runs/<small-64px-pretrain-tiny run> --data digits --recipe finetune-small-tiny
    Expected: a few seconds on a CPU.
    """
    config = finetune_small(info)
    return dataclasses.replace(
        config,
        recipe="finetune-small-tiny",
        model=tiny_vit(info, img_size=16, patch_size=4, pool="gap"),
        data=dataclasses.replace(config.data, batch_size=32, epochs=0, steps=10, workers=0),
        augment=dataclasses.replace(config.augment, pad=2),
        eval=EvalConfig(every_epochs=0, batch_size=256),
        run=RunConfig(checkpoint_every=5, log_every=5),
    )


def pretrains_at_64px(info: SourceInfo) -> bool:
    """Whether `vitkit train` picks small-64px-pretrain for a source: images above 40 px, >= 20,000 of them."""
    return info.image_size > 40 and info.num_train >= PRETRAIN_MIN_IMAGES
