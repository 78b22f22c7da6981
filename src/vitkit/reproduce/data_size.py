"""`data-size` (Sec. 4.3, Figures 3-4): ViT against a BiT ResNet (and a hybrid) on growing subsets.

Arms: the base ViT, the BiT ResNet-v2 closest to it in forward FLOPs ("comparable computational cost")
and the hybrid (the ViT on one ResNet stage), each trained on fixed, nested, class-stratified parts of
the training split (data.train_fraction: 5%, 10%, 30%, 100%; 25% and 100% at the tiny scale).  Every
arm trains for the same number of steps with the same hyper-parameters, as the paper trains every subset
alike (so small subsets see more epochs: that is where a model without a CNN's inductive bias may overfit).
Metrics: 5-shot linear accuracy of the frozen representation (Figure 4's metric; shots drawn from the
whole training split) and the test top-1 of the classifier trained on the subset (standing in for
Figure 3's fine-tuned accuracy).
Claims: the ResNet leads on the smallest subset; ViT catches up as data grows (its deficit shrinks
from the smallest subset to the full set).
"""

from __future__ import annotations

import dataclasses
import math

from vitkit.reproduce import paper
from vitkit.reproduce.common import arm, better, means, over_seeds, table_of
from vitkit.reproduce.figures import COLORS, MARKERS, Panel, Series, draw, mean_sd
from vitkit.reproduce.scale import hybrid_for, matched_resnet
from vitkit.reproduce.spec import METRIC_NAMES, Analysis, Claim, Context, Study, by_arm
from vitkit.reproduce.verdict import SMALLEST_EFFECT, Estimate, difference, exceeds, pooled_sd

FRACTIONS = (0.05, 0.1, 0.3, 1.0)
TINY_FRACTIONS = (0.25, 1.0)
FAMILIES = ("vit", "resnet", "hybrid")
FIGURES = {"fewshot5": "Figure 4", "top1": "Figure 3"}


def fractions(context: Context) -> tuple[float, ...]:
    return TINY_FRACTIONS if context.scale.name == "tiny" else FRACTIONS


def models(context: Context) -> dict:
    vit = context.base.model
    return {"vit": vit, "resnet": matched_resnet(vit), "hybrid": hybrid_for(vit)}


def name(kind: str, fraction: float) -> str:
    return f"{kind}@{fraction:g}"


def plan(context: Context) -> list:
    def arms(seed: int) -> list:
        return [
            arm(context, name(kind, f), seed, model, {"model": kind, "fraction": f}, data={"train_fraction": f})
            for f in fractions(context)
            for kind, model in models(context).items()
        ]

    return over_seeds(context, arms)


def catch_up(records: list, metric: str, small: float, full: float) -> tuple[Estimate, float | None]:
    """(ViT - ResNet) on the full set minus (ViT - ResNet) on the smallest subset."""
    values = by_arm(records, metric)
    sd = pooled_sd(values.values())
    at_full = difference(values[name("vit", full)], values[name("resnet", full)], sd)
    at_small = difference(values[name("vit", small)], values[name("resnet", small)], sd)
    return Estimate(at_full.mean - at_small.mean, math.hypot(at_full.se, at_small.se), min(at_full.n, at_small.n)), sd


def claims_on(records: list, metric: str, figure_name: str, small: float, full: float) -> list[Claim]:
    """The two claims of Sec. 4.3 on one metric: the ResNet leads on the smallest subset, ViT catches up."""
    quote = dataclasses.replace(paper.DATA_SIZE, where=f"{paper.DATA_SIZE.where.split(',')[0]}, {figure_name}")
    got = means(records, metric)
    lead = better(
        records,
        metric,
        name("resnet", small),
        name("vit", small),
        f"{METRIC_NAMES[metric]} on {small:.0%} of the data: ResNet - ViT",
    )
    effect, sd = catch_up(records, metric, small, full)
    rise = exceeds(
        effect, SMALLEST_EFFECT, f"{METRIC_NAMES[metric]}: (ViT - ResNet) at {full:.0%} minus at {small:.0%}", sd
    )
    numbers = {name(k, f): got[name(k, f)] for f in (small, full) for k in ("vit", "resnet")}
    return [
        Claim(
            f"data-size.resnet-leads-small.{metric}",
            f"The ResNet leads on the smallest subset ({figure_name})",
            quote,
            METRIC_NAMES[metric],
            lead,
            numbers,
        ),
        Claim(
            f"data-size.vit-catches-up.{metric}",
            f"ViT catches up as the data grows ({figure_name})",
            quote,
            METRIC_NAMES[metric],
            rise,
            numbers,
        ),
    ]


def analyse(context: Context, records: list) -> Analysis:
    small, full = fractions(context)[0], fractions(context)[-1]
    claims = [
        c for metric, figure_name in FIGURES.items() for c in claims_on(records, metric, figure_name, small, full)
    ]
    model_of = {
        r["arm"]: [
            r["labels"]["model"],
            f"{r['labels']['fraction']:.0%}",
            f"{r['params']:,}",
            f"{r['forward_flops'] / 1e6:.1f}",
            f"{r['epochs']:.1f}",
        ]
        for r in records
    }
    table = table_of(
        records,
        ("fewshot5", "top1"),
        METRIC_NAMES,
        "Accuracy per model and subset",
        model_of,
        ["model", "subset", "params", "MFLOPs/image", "epochs"],
    )
    figure(context, records)
    m = models(context)
    notes = [
        f"models: ViT {m['vit'].hidden_size}-wide, {m['vit'].depth} layers, {m['vit'].patch_size}px patches; "
        f"BiT ResNet-v2 with {m['resnet'].layers} units per stage (closest in forward FLOPs); hybrid: the ViT "
        f"on {m['hybrid'].resnet_layers} ResNet units",
        "every arm trains for the same steps (one unit arm) with the same hyper-parameters; no early stopping "
        "(the paper reports the best validation accuracy during training)",
    ]
    caption = "Figures 3-4: accuracy against the share of the training data used, per model"
    return Analysis(claims, [table], [("data_size.png", caption)], notes)


def figure(context: Context, records: list) -> None:
    panels = []
    images = {r["labels"]["fraction"]: r["num_train"] for r in records}  # the training images of each subset
    for metric, figure_name in FIGURES.items():
        values = by_arm(records, metric)
        series = []
        for kind in FAMILIES:
            stats = [mean_sd(values[name(kind, f)]) for f in fractions(context)]
            series.append(
                Series(
                    {"vit": "ViT", "resnet": "BiT ResNet", "hybrid": "hybrid"}[kind],
                    [images[f] for f in fractions(context)],
                    [s[0] for s in stats],
                    [s[1] for s in stats],
                    marker=MARKERS[kind],
                    dashed=kind == "hybrid",
                    color=COLORS[kind],
                )
            )
        panels.append(
            Panel(f"like {figure_name}: {METRIC_NAMES[metric]}", "training images (log)", "accuracy", series, xlog=True)
        )
    draw(context.out / "data_size.png", panels)


STUDY = Study(
    name="data-size",
    title="ViT against ResNets as the data grows (Sec. 4.3, Figures 3-4)",
    units=len(FRACTIONS) * len(FAMILIES),
    plan=plan,
    analyse=analyse,
)
