"""`attention` (Sec. 4.5, Figure 7 right; App. D.7, Figure 11): how far each head looks, layer by layer.

Arms: the base ViT and the hybrid (the same ViT on one ResNet stage), each trained for two units.  On 128
test images (D.7's count), the mean attention distance of every head and layer: the attention-weighted
pixel distance between a query patch and the patches it attends to (inspect/attention.py).  Distances
are read as a fraction of the distance uniform attention would give on the same grid ("uniform"),
so that "attends to most of the image" has a number.
Claims (each on the fraction of uniform):
  - the distance grows with depth: mean over heads at the last layer minus at the first;
  - some heads attend globally already in the first layer: its largest head distance minus GLOBAL;
  - other heads are local in the first layer: LOCAL minus its smallest head distance;
  - that local attention is less pronounced in the hybrid: the hybrid's smallest first-layer head
    distance minus the ViT's.
"""

from __future__ import annotations

from vitkit.reproduce import paper
from vitkit.reproduce.common import arm, over_seeds
from vitkit.reproduce.figures import Panel, Series, draw
from vitkit.reproduce.scale import hybrid_for
from vitkit.reproduce.spec import Analysis, Claim, Context, Study, Table
from vitkit.reproduce.verdict import INCONCLUSIVE, Verdict, estimate, exceeds, seed_sd

GLOBAL = 0.75  # a head attending at >= 75% of the uniform-attention distance looks at "most of the image"
LOCAL = 0.5  # a head at <= 50% of it is local
STEP = 0.05  # the smallest change of interest, as a fraction of the uniform distance
METRIC = "mean attention distance / uniform-attention distance"


def plan(context: Context) -> list:
    vit = context.base.model

    def arms(seed: int) -> list:
        return [
            arm(context, kind, seed, model, {"model": kind}, units=2.0, measure=("attention",))
            for kind, model in (("vit", vit), ("hybrid", hybrid_for(vit)))
        ]

    return over_seeds(context, arms)


def relative(record: dict) -> list[list[float]]:
    """(L, k) distances as fractions of the uniform-attention distance."""
    a = record["attention"]
    return [[d / a["uniform"] for d in layer] for layer in a["per_layer_head"]]


def statistics(records: list) -> dict[str, list[float]]:
    """Per seed: the numbers the claims test."""
    out: dict[str, list[float]] = {"growth": [], "global": [], "local": [], "hybrid": []}
    seeds = sorted({r["seed"] for r in records})
    for seed in seeds:
        vit = relative(next(r for r in records if r["seed"] == seed and r["arm"] == "vit"))
        hybrid = relative(next(r for r in records if r["seed"] == seed and r["arm"] == "hybrid"))
        out["growth"].append(sum(vit[-1]) / len(vit[-1]) - sum(vit[0]) / len(vit[0]))
        out["global"].append(max(vit[0]) - GLOBAL)
        out["local"].append(LOCAL - min(vit[0]))
        out["hybrid"].append(min(hybrid[0]) - min(vit[0]))
    return out


def analyse(context: Context, records: list) -> Analysis:
    stats = statistics(records)

    def verdict(key: str, smallest: float, what: str):
        sd = seed_sd(stats[key])
        return exceeds(estimate(stats[key], sd), smallest, what, sd)

    shown = {k: [round(v, 4) for v in values] for k, values in stats.items()}
    claims = [
        Claim(
            "attention.grows-with-depth",
            "Attention distance grows with depth",
            paper.ATTENTION,
            METRIC,
            verdict("growth", STEP, "last layer - first layer (mean over heads)"),
            {"by seed": shown["growth"]},
        ),
        Claim(
            "attention.global-heads-low",
            "Some heads attend to most of the image already in the first layer",
            paper.ATTENTION,
            METRIC,
            _needs_local(stats, verdict("global", 0.0, f"largest first-layer head - {GLOBAL}"), GLOBAL_UNSAID),
            {"by seed": shown["global"], "global means at least": GLOBAL},
        ),
        Claim(
            "attention.local-heads-low",
            "Other heads attend locally in the first layer",
            paper.ATTENTION,
            METRIC,
            verdict("local", 0.0, f"{LOCAL} - smallest first-layer head"),
            {"by seed": shown["local"], "local means at most": LOCAL},
        ),
        Claim(
            "attention.hybrid-less-local",
            "Local attention is less pronounced in the hybrid",
            paper.ATTENTION,
            METRIC,
            _needs_local(stats, verdict("hybrid", STEP, "hybrid's smallest first-layer head - ViT's"), HYBRID_UNSAID),
            {"by seed": shown["hybrid"]},
        ),
    ]
    figure(context, records)
    notes = [
        f"distances on {records[0]['attention']['images']} test images at {records[0]['attention']['img_size']} px; "
        f"uniform attention on this grid gives {records[0]['attention']['uniform']:.2f} px (ViT)",
        "Figure 7 (right) shows ViT-L/16 at 224 px (16 heads, 24 layers); here the base ViT of the study",
    ]
    notes += _unspecialised(stats)
    return Analysis(
        claims,
        [table(records)],
        [("attention.png", "Figure 7 (right): mean attention distance per head and layer (dotted: uniform attention)")],
        notes,
    )


# Why a claim says nothing where no first-layer head of the ViT is local (`_needs_local`).
GLOBAL_UNSAID = "uniform attention would pass it"
HYBRID_UNSAID = "the ViT has no local attention for the hybrid's to be less pronounced than"


def _needs_local(stats: dict[str, list[float]], measured: Verdict, unsaid: str) -> Verdict:
    """A verdict that compares against the ViT's local heads, inconclusive where it has none (`unsaid`: why)."""
    if not _unspecialised(stats):
        return measured
    return Verdict(INCONCLUSIVE, f"{measured.reason}; but no first-layer head is local, so {unsaid}")


def _unspecialised(stats: dict[str, list[float]]) -> list[str]:
    """A note where no first-layer head of the ViT is local: uniform attention alone passes the global test, and
    the hybrid has nothing to be less local than."""
    closest = min(LOCAL - gap for gap in stats["local"])  # the ViT's most local first-layer head, over seeds
    if closest <= LOCAL:
        return []
    return [
        f"no first-layer head of the ViT is local (the most local is at {closest:.2f} of uniform attention): "
        "its heads have not specialised in this budget, so the global-heads verdict says no more than "
        "uniform attention would, and the hybrid's heads have no local ones to compare with; a longer "
        "--budget-minutes trains them further"
    ]


def table(records: list) -> Table:
    rows = []
    for r in records:
        for index, layer in enumerate(r["attention"]["per_layer_head"], 1):
            rows.append(
                [
                    r["arm"],
                    str(r["seed"]),
                    str(index),
                    ", ".join(f"{d:.2f}" for d in layer),
                    f"{sum(layer) / len(layer):.2f}",
                ]
            )
    return Table("Mean attention distance (pixels) per layer and head", ["arm", "seed", "layer", "heads", "mean"], rows)


def figure(context: Context, records: list) -> None:
    panels = []
    for kind, title in (("vit", "ViT"), ("hybrid", "hybrid")):
        series = []
        for r in (r for r in records if r["arm"] == kind):
            per = r["attention"]["per_layer_head"]
            xs = [i + 1 for i, layer in enumerate(per) for _ in layer]
            series.append(Series(f"seed {r['seed']}", xs, [d for layer in per for d in layer]))
        uniform = next(r for r in records if r["arm"] == kind)["attention"]["uniform"]
        top = max([uniform, *(y for one in series for y in one.ys)])  # no head above the axis (it cut the most global)
        panels.append(
            Panel(
                f"{title}: one dot per head",
                "network depth (layer)",
                "mean attention distance (pixels)",
                series,
                kind="scatter",
                ylim=(0, 1.1 * top),
                hline=(uniform, "uniform attention"),
            )
        )
    draw(context.out / "attention.png", panels)


STUDY = Study(
    name="attention",
    title="Attention distance by head and depth (Sec. 4.5, Figure 7 right)",
    units=4.0,
    plan=plan,
    analyse=analyse,
)
