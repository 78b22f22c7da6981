"""The paper's self-supervision experiment (Sec. 4.6, App. B.1.2), small: does MPP pre-training help?

Arms, all with the same small ViT and seed:
  1. MPP: masked-patch-prediction pre-training on the training images *without labels*
     (`vitkit.ssl.pretrain`), then supervised fine-tuning on a labelled subset.
  2. Scratch: the same fine-tuning (same recipe, steps, augmentation) from random initialisation.
Few-shot linear accuracy (closed-form ridge of `vitkit.eval.fewshot`, k = 1, 5, 10, 25, 3 draws) of
the frozen MPP encoder vs the frozen random encoder, on the [class] token y (Eq. 4, what `vitkit
fewshot` reads) and on the mean of the patch tokens (MPP trains the patch outputs, not y).

The paper: ViT-B/16 on JFT, 1M steps; fine-tuned on ImageNet 79.9% vs 77.9% from scratch (+2%).
Here: a few CPU minutes per arm, so expect only the direction, not the size, to transfer.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/mpp_transfer.py \
        --data fashion-mnist:../shared/data/fashion-mnist --out /tmp/mpp_bench

Prints a table and, last, one JSON object.  Re-running with the same --out resumes/reuses the MPP run.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitkit.checkpoints import read
from vitkit.data.fewshot import k_per_class
from vitkit.data.sources import load_split
from vitkit.data.transforms import AugmentConfig, eval_transform, train_transform
from vitkit.eval.fewshot import FewShotConfig, evaluate_fewshot
from vitkit.models import build_model
from vitkit.ssl.masked_patch import MPPConfig
from vitkit.ssl.pretrain import PretrainConfig, learning_rate, model_config, pretrain


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="fashion-mnist:../shared/data/fashion-mnist")
    p.add_argument("--out", default="/tmp/mpp_transfer")
    p.add_argument("--img-size", type=int, default=None, help="default: the data's native size (folders: 64)")
    p.add_argument("--patch-size", type=int, default=None, help="default: 7 for 28 px, else img/8")
    p.add_argument("--width", type=int, default=96, help="D")
    p.add_argument("--depth", type=int, default=4, help="L")
    p.add_argument("--heads", type=int, default=3, help="k")
    p.add_argument("--target", default="mean_color", choices=["mean_color", "downsampled", "pixels"])
    p.add_argument("--pretrain-epochs", type=float, default=2.0)
    p.add_argument("--pretrain-lr", type=float, default=1e-3, help="Adam lr (paper: 2e-4 at batch 4096 for 1M steps)")
    p.add_argument("--pretrain-batch", type=int, default=128)
    p.add_argument("--labels-per-class", type=int, default=100, help="labelled images per class for fine-tuning")
    p.add_argument("--finetune-epochs", type=int, default=60)
    p.add_argument("--finetune-batch", type=int, default=128)
    p.add_argument("--finetune-lr", type=float, default=1e-3)
    p.add_argument("--finetune-optim", default="adamw", choices=["adamw", "sgd"])
    p.add_argument("--max-minutes", type=float, default=8.0, help="time cap of the MPP arm's pre-training")
    p.add_argument("--max-test", type=int, default=10000, help="test images used for every accuracy")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def finetune(encoder: nn.Module, train_x: Tensor, train_y: Tensor, test_x: Tensor, test_y: Tensor,
             num_classes: int, args: argparse.Namespace, mean, std) -> dict:
    """Supervised fine-tuning (Sec. 3.2: new zero-initialised head), warmup + cosine, clip 1; test top-1."""
    torch.manual_seed(args.seed)
    model = copy.deepcopy(encoder)
    model.reset_head(num_classes)
    size = model.config.img_size
    per_epoch = max(1, len(train_x) // args.finetune_batch)
    total = per_epoch * args.finetune_epochs
    warmup = max(1, total // 20)
    if args.finetune_optim == "sgd":  # the paper's fine-tuning optimiser (App. B.1.1)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.finetune_lr, momentum=0.9)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.finetune_lr, weight_decay=0.05)
    augment = AugmentConfig(crop="pad", pad=2, flip=True)
    generator = torch.Generator().manual_seed(args.seed)
    start = time.monotonic()
    model.train()
    for step in range(total):
        epoch, offset = divmod(step, per_epoch)
        if offset == 0:
            order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed * 7919 + epoch))
        index = order[offset * args.finetune_batch : (offset + 1) * args.finetune_batch]
        x, target = train_transform(train_x[index], train_y[index], num_classes, size, mean, std,
                                    channels=train_x.shape[1], config=augment, generator=generator)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, total, warmup, args.finetune_lr)
        loss = torch.sum(-target * F.log_softmax(model(x), dim=-1), dim=-1).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    seconds = time.monotonic() - start
    return {"top1": accuracy(model, test_x, test_y, size, mean, std), "steps": total, "final_loss": loss.item(),
            "seconds": round(seconds, 1)}


@torch.no_grad()
def accuracy(model: nn.Module, x: Tensor, y: Tensor, size: int, mean, std, batch: int = 500) -> float:
    model.eval()
    correct = 0
    for s in range(0, len(x), batch):
        logits = model(eval_transform(x[s : s + batch], size, mean, std, x.shape[1]))
        correct += int((logits.argmax(-1) == y[s : s + batch]).sum())
    return correct / len(x)


@torch.no_grad()
def features(model: nn.Module, x: Tensor, size: int, mean, std, batch: int = 500) -> dict[str, Tensor]:
    """y = LN(z_L^0) (Eq. 4, the [class] token) and GAP = mean of the patch tokens of LN(z_L)."""
    model.eval()
    ys, gaps = [], []
    for s in range(0, len(x), batch):
        named = model.forward_intermediates(eval_transform(x[s : s + batch], size, mean, std, x.shape[1]), attention_layers=())
        ys.append(named["y"])
        gaps.append(named["encoder_norm"][:, model.num_prefix_tokens :].mean(1))
    return {"cls": torch.cat(ys), "gap": torch.cat(gaps)}


def fewshot(model: nn.Module, train_x, train_y, test_x, test_y, num_classes, size, mean, std) -> dict:
    config = FewShotConfig(shots=(1, 5, 10, 25), seeds=3)
    pool = torch.cat([k_per_class(train_y, k, s) for k in config.shots for s in range(config.seeds)]).unique()
    pool_feats, test_feats = features(model, train_x[pool], size, mean, std), features(model, test_x, size, mean, std)
    out = {}
    for name in ("cls", "gap"):
        full = torch.zeros(len(train_x), pool_feats[name].shape[1])
        full[pool] = pool_feats[name]
        result = evaluate_fewshot(full, train_y, test_feats[name], test_y, num_classes, config)
        out[name] = {k: round(v["mean"], 4) for k, v in result.shots.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    log = logging.getLogger("mpp_transfer")
    folder = args.data.startswith("folder:")
    train = load_split(args.data, "train", image_size=args.img_size or (64 if folder else None))
    test = load_split(args.data, "test", image_size=args.img_size or (64 if folder else None))
    channels, side = train.images.shape[1], train.images.shape[-1]
    size = args.img_size or side
    patch = args.patch_size or (7 if size == 28 else size // 8)
    mean = std = (0.5,) * channels  # the official [-1, 1] scaling
    test_x, test_y = test.images[: args.max_test], test.labels[: args.max_test]
    mpp = MPPConfig(target=args.target, mean=mean, std=std)
    overrides = {"hidden_size": args.width, "depth": args.depth, "num_heads": args.heads, "mlp_dim": 4 * args.width}
    config = PretrainConfig(data=args.data, model="vit_ti16", img_size=size, patch_size=patch, model_overrides=overrides,
                            mpp=mpp, epochs=args.pretrain_epochs, batch_size=args.pretrain_batch, lr=args.pretrain_lr,
                            max_minutes=args.max_minutes, seed=args.seed, log_every=50, checkpoint_every=200)
    t0 = time.monotonic()
    summary = pretrain(config, Path(args.out) / "mpp", images=train.images, held_out=test.images[:2000])
    pretrain_seconds = time.monotonic() - t0
    if not summary["finished"]:
        log.warning("MPP stopped at step %d of %d by --max-minutes (re-run to resume)", summary["step"], summary["total_steps"])
    mpp_encoder = read(summary["checkpoint"]).model
    torch.manual_seed(args.seed)
    scratch_encoder = build_model(model_config(config, side, channels))  # same config, same seed, untrained

    labelled = k_per_class(train.labels, args.labels_per_class, args.seed)
    ft_x, ft_y = train.images[labelled], train.labels[labelled]
    k = train.num_classes
    results = {"data": args.data, "img_size": size, "patch_size": patch, "model": overrides, "target": args.target,
               "pretrain": {**{key: summary.get(key) for key in ("step", "total_steps", "finished", "loss", "test_loss", "test_accuracy")},
                            "seconds": round(pretrain_seconds, 1), "images": len(train.images), "lr": args.pretrain_lr,
                            "batch": args.pretrain_batch},
               "finetune": {"labelled": len(labelled), "epochs": args.finetune_epochs, "optim": args.finetune_optim,
                            "lr": args.finetune_lr, "test_images": len(test_x)}}
    for name, encoder in (("mpp", mpp_encoder), ("scratch", scratch_encoder)):
        log.info("fine-tuning from %s on %d labelled images", name, len(labelled))
        results[f"finetune_{name}"] = finetune(encoder, ft_x, ft_y, test_x, test_y, k, args, mean, std)
        log.info("%s: %s", name, results[f"finetune_{name}"])
        results[f"fewshot_{name}"] = fewshot(encoder, train.images, train.labels, test_x, test_y, k, size, mean, std)
        log.info("%s few-shot: %s", name, results[f"fewshot_{name}"])
    print(f"MPP pre-training: {summary['step']} steps x {args.pretrain_batch} images ({pretrain_seconds / 60:.1f} min), "
          f"held-out MPP loss {summary.get('test_loss')}, accuracy {summary.get('test_accuracy')}")
    print(f"{'arm':<10}{'fine-tune top-1':>17}{'  few-shot (cls) k=1/5/10/25':>32}{'  few-shot (gap) k=1/5/10/25':>32}")
    for name in ("mpp", "scratch"):
        cls, gap = results[f"fewshot_{name}"]["cls"], results[f"fewshot_{name}"]["gap"]
        print(f"{name:<10}{results[f'finetune_{name}']['top1']:>17.4f}  {'/'.join(f'{v:.3f}' for v in cls.values()):>30}"
              f"  {'/'.join(f'{v:.3f}' for v in gap.values()):>30}")
    delta = results["finetune_mpp"]["top1"] - results["finetune_scratch"]["top1"]
    print(f"fine-tune gain from MPP: {100 * delta:+.2f} points (paper, ViT-B/16 JFT -> ImageNet: +2)")
    results["gain_points"] = round(100 * delta, 2)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
