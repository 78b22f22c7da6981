"""`compute` (Sec. 4.4, Figure 5): accuracy against training compute for ViTs, ResNets and hybrids.

Arms: ViTs of three sizes (the base; half its width, depth and MLP; twice its width and MLP with two
more layers) and the base with larger patches; the BiT ResNets closest in forward FLOPs to the base and
the large ViT; hybrids of the small and base ViT -- each trained with the compute of 1 and of 3 unit arms
of the base ViT (steps in inverse proportion to the model's forward FLOPs: matched budgets).
The x axis is each arm's analytic training compute (models/flops.py: 3 x forward FLOPs x images seen),
the y axis its test top-1, as Figure 5 plots transfer accuracy against pre-training exaFLOPs.

Claims, on each family's frontier (the points no cheaper point of the family beats; accuracy
interpolated linearly in log compute, never extrapolated):
  - ViT needs 2-4x less compute than ResNets: for each ResNet frontier point, the compute the ViT
    frontier needs for the same accuracy; log2 of the ratio, averaged, against log2(2) (a ResNet beaten by
    the cheapest ViT gives a lower bound, one better than every ViT an upper bound, both conservative);
  - hybrids lead at small budgets: the cheapest hybrid point against the ViT frontier at its compute;
  - the hybrids' lead vanishes for larger models: that lead minus the lead of the costliest hybrid point.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from itertools import pairwise

from vitkit.models.configs import ViTConfig
from vitkit.models.flops import model_flops
from vitkit.reproduce import paper
from vitkit.reproduce.common import arm, over_seeds
from vitkit.reproduce.figures import COLORS, MARKERS, Panel, Series, draw, mean_sd
from vitkit.reproduce.scale import RESNET_LADDER, family, hybrid_for, matched_resnet, resnet_for
from vitkit.reproduce.spec import Analysis, Claim, Context, Study, Table
from vitkit.reproduce.verdict import INCONCLUSIVE, SMALLEST_EFFECT, Verdict, estimate, exceeds, seed_sd

LEVELS = (1.0, 3.0)  # units of time per model
Point = tuple[float, float]  # (training FLOPs, accuracy)


def scaled(vit: ViTConfig, factor: float, extra_layers: int = 0) -> ViTConfig:
    width = max(vit.num_heads, int(vit.hidden_size * factor) // vit.num_heads * vit.num_heads)
    return dataclasses.replace(
        vit,
        hidden_size=width,
        mlp_dim=max(1, int(vit.mlp_dim * factor)),
        depth=max(1, round(vit.depth * min(factor, 1.0)) + extra_layers),
    )


def larger_patch(vit: ViTConfig) -> ViTConfig:
    """The base with the next patch size that tiles the image (fewer, larger tokens)."""
    patch = next(p for p in range(vit.patch_size + 1, vit.img_size + 1) if vit.img_size % p == 0)
    return dataclasses.replace(vit, patch_size=patch)


def models(context: Context) -> dict:
    base = context.base.model
    small, large = scaled(base, 0.5), scaled(base, 2.0, extra_layers=2)
    resnet_m, resnet_l = matched_resnet(base), matched_resnet(large)
    if resnet_l.layers == resnet_m.layers:  # tiny models: take the next rung of the ladder
        resnet_l = resnet_for(
            base, RESNET_LADDER[min(RESNET_LADDER.index(resnet_m.layers) + 1, len(RESNET_LADDER) - 1)]
        )
    every = {
        "vit-S": small,
        "vit-M": base,
        "vit-L": large,
        f"vit-M/{larger_patch(base).patch_size}": larger_patch(base),
        "resnet-M": resnet_m,
        "resnet-L": resnet_l,
        "hybrid-S": hybrid_for(small),
        "hybrid-M": hybrid_for(base),
    }
    if context.scale.name == "tiny":  # tests: two points per family
        return {k: v for k, v in every.items() if k in ("vit-S", "vit-M", "resnet-M", "hybrid-S")}
    return every


def plan(context: Context) -> list:
    table = models(context)
    base = model_flops(context.base.model)

    def arms(seed: int) -> list:  # equal training FLOPs per level: steps x forward FLOPs the same for every model
        return [
            arm(
                context,
                f"{label}x{level:g}",
                seed,
                model,
                {"model": label, "family": family(model), "level": level},
                units=level * base / model_flops(model),
                measure=(),
            )
            for label, model in table.items()
            for level in LEVELS
        ]

    return over_seeds(context, arms)


# ------------------------------------------------------------------------------------ frontiers
def frontier(points: Sequence[Point]) -> list[Point]:
    """The points that beat every cheaper point, by increasing compute."""
    out: list[Point] = []
    for flops, accuracy in sorted(points):
        if not out or accuracy > out[-1][1]:
            out.append((flops, accuracy))
    return out


def accuracy_at(front: Sequence[Point], flops: float) -> float:
    """The frontier's accuracy at `flops`, linear in log compute; the end values outside its range."""
    if flops <= front[0][0]:
        return front[0][1]
    for (x0, y0), (x1, y1) in pairwise(front):
        if flops <= x1:
            return y0 + (y1 - y0) * math.log(flops / x0) / math.log(x1 / x0)
    return front[-1][1]


def flops_for(front: Sequence[Point], accuracy: float) -> tuple[float, str]:
    """The compute at which the frontier reaches `accuracy`: ("matched", "lower bound" or "upper bound")."""
    if accuracy <= front[0][1]:
        return front[0][0], "ratio is a lower bound"  # the cheapest point already beats it
    for (x0, y0), (x1, y1) in pairwise(front):
        if accuracy <= y1:
            return math.exp(math.log(x0) + math.log(x1 / x0) * (accuracy - y0) / (y1 - y0)), "matched"
    return front[-1][0], "ratio is an upper bound"  # never reached within the frontier


def compute_ratios(vit: Sequence[Point], resnet: Sequence[Point]) -> list[tuple[float, str]]:
    """For each ResNet frontier point: (ResNet compute / ViT compute at the same accuracy, kind); "ratio is an
    upper bound" marks an accuracy no ViT point reached (the ratio there is unknown, possibly below 1)."""
    front = frontier(vit)
    out = []
    for flops, accuracy in frontier(resnet):
        needed, kind = flops_for(front, accuracy)
        out.append((flops / needed, kind))
    return out


def hybrid_leads(vit: Sequence[Point], hybrid: Sequence[Point]) -> tuple[float, float]:
    """(lead of the cheapest hybrid point, lead of the costliest) over the ViT frontier at the same compute."""
    front, points = frontier(vit), sorted(hybrid)
    return (points[0][1] - accuracy_at(front, points[0][0]), points[-1][1] - accuracy_at(front, points[-1][0]))


# -------------------------------------------------------------------------------------- analysis
def points(records: list, seed: int, kind: str) -> list[Point]:
    return [
        (r["train_flops"], r["test"]["top1"]) for r in records if r["seed"] == seed and r["labels"]["family"] == kind
    ]


def ratio_claim(ratio_stats: list[float], ratio_details: list[list[str]]) -> Claim:
    """ "ViT needs 2-4x less compute": log2(ratio / 2) per seed must exceed 0."""
    if ratio_stats:
        sd = seed_sd(ratio_stats)
        verdict = exceeds(estimate(ratio_stats, sd), 0.0, "log2(compute ratio / 2)", sd)
        mean_ratio = round(2 ** (1 + sum(ratio_stats) / len(ratio_stats)), 3)
    else:
        verdict = Verdict(
            INCONCLUSIVE,
            "no ViT reached the accuracy of any ResNet frontier point, so no compute "
            "ratio at equal accuracy can be measured",
        )
        mean_ratio = None
    return Claim(
        "compute.vit-less-compute",
        "ViT needs 2-4x less compute than ResNets for the same accuracy",
        paper.COMPUTE,
        "test top-1 against analytic training FLOPs",
        verdict,
        {"compute ratio (geometric mean)": mean_ratio, "per ResNet frontier point, by seed": ratio_details},
    )


def analyse(context: Context, records: list) -> Analysis:
    seeds = sorted({r["seed"] for r in records})
    ratio_stats, ratio_details, small_leads, shrink = [], [], [], []
    for seed in seeds:
        vit, resnet, hybrid = (points(records, seed, k) for k in ("vit", "resnet", "hybrid"))
        ratios = compute_ratios(vit, resnet)
        ratio_details.append([f"{r:.2f}x ({kind})" for r, kind in ratios])
        usable = [r for r, kind in ratios if kind != "ratio is an upper bound"]  # matched, or conservative bounds
        if usable:
            ratio_stats.append(sum(math.log2(r) for r in usable) / len(usable) - 1.0)  # log2(ratio / 2)
        first, last = hybrid_leads(vit, hybrid)
        small_leads.append(first)
        shrink.append(first - last)
    claims = [
        ratio_claim(ratio_stats, ratio_details),
        Claim(
            "compute.hybrid-small-budgets",
            "Hybrids beat ViT at small compute budgets",
            paper.COMPUTE,
            "test top-1 against analytic training FLOPs",
            exceeds(
                estimate(small_leads, seed_sd(small_leads)),
                SMALLEST_EFFECT,
                "cheapest hybrid - ViT frontier at its compute",
                seed_sd(small_leads),
            ),
            {"lead by seed": [round(v, 4) for v in small_leads]},
        ),
        Claim(
            "compute.hybrid-gap-vanishes",
            "The hybrids' lead vanishes for larger models",
            paper.COMPUTE,
            "test top-1 against analytic training FLOPs",
            exceeds(
                estimate(shrink, seed_sd(shrink)),
                SMALLEST_EFFECT,
                "lead of the cheapest hybrid point - lead of the costliest",
                seed_sd(shrink),
            ),
            {},
        ),
    ]
    figure(context, records)
    notes = [
        "every model trains with the compute of 1 and of 3 unit arms of the base ViT (steps in inverse "
        "proportion to its forward FLOPs); compute = 3 x analytic forward FLOPs x images seen; Figure 5 plots "
        "transfer accuracy after pre-training on JFT-300M, here the test top-1 of the trained classifier"
    ]
    return Analysis(claims, [table(records)], [("compute.png", "Figure 5: test top-1 against training compute")], notes)


def table(records: list) -> Table:
    rows = {}
    for r in records:
        rows.setdefault(r["arm"], {"r": r, "flops": [], "acc": []})
        rows[r["arm"]]["flops"].append(r["train_flops"])
        rows[r["arm"]]["acc"].append(r["test"]["top1"])
    out = []
    for arm_name, row in rows.items():
        r, (acc, sd) = row["r"], mean_sd(row["acc"])
        out.append(
            [
                arm_name,
                r["labels"]["family"],
                f"{r['params']:,}",
                f"{r['forward_flops'] / 1e6:.2f}",
                f"{sum(row['flops']) / len(row['flops']):.3g}",
                f"{100 * acc:.2f} +- {100 * sd:.2f}" if len(row["acc"]) > 1 else f"{100 * acc:.2f}",  # one seed
            ]
        )
    return Table(
        "Compute and accuracy per arm",
        ["arm", "family", "params", "MFLOPs/image", "train FLOPs", "test top-1 (%)"],
        out,
    )


def figure(context: Context, records: list) -> None:
    series = []
    for kind, label in (("vit", "ViT"), ("resnet", "BiT ResNet"), ("hybrid", "hybrid")):
        arms: dict[str, list] = {}
        for r in records:
            if r["labels"]["family"] == kind:
                arms.setdefault(r["arm"], []).append((r["train_flops"], r["test"]["top1"]))
        mean_points = sorted((sum(p[0] for p in v) / len(v), *mean_sd([p[1] for p in v])) for v in arms.values())
        front = frontier([(x, m) for x, m, _ in mean_points])
        series.append(
            Series(
                label,
                [p[0] for p in mean_points],
                [p[1] for p in mean_points],
                [p[2] for p in mean_points],
                marker=MARKERS[kind],
                line=False,
                color=COLORS[kind],
            )
        )
        series.append(Series("", [x for x, _ in front], [y for _, y in front], marker="", color=COLORS[kind]))
    draw(
        context.out / "compute.png",
        [
            Panel(
                f"like Figure 5: {context.request.data.split(':')[0]}; lines: frontiers",
                "training compute (FLOPs, log)",
                "test top-1",
                series,
                xlog=True,
            )
        ],
        width=6.0,
        height=4.2,
    )


STUDY = Study(
    name="compute",
    title="Accuracy against training compute (Sec. 4.4, Figure 5)",
    units=8 * sum(LEVELS),
    plan=plan,
    analyse=analyse,
)
