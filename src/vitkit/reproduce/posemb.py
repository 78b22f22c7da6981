"""`posemb` (App. D.4, Table 8): how the position is encoded, and where.

Arms: the study's base ViT with no position embedding, learned 1D, learned 2D (X and Y halves of D/2)
and relative attention biases; 1D and 2D also added at every layer (one set per layer) and shared at
every layer -- the eight cells of Table 8, trained alike for one unit each.  Metric: few-shot linear
accuracy of the frozen representation, 5 images per class (Table 8's ImageNet 5-shot), and the test
top-1 of the trained classifier beside it.
Claims: no position embedding is clearly worse than the default (learned 1D at the stem: 0.61382 vs
0.64206 in the paper); the seven ways of encoding position differ little (0.63964 .. 0.64292).
"""

from __future__ import annotations

import dataclasses

from vitkit.reproduce import paper
from vitkit.reproduce.arms import fewshot_draws
from vitkit.reproduce.common import arm, better, means, over_seeds, similar, table_of
from vitkit.reproduce.figures import Panel, Series, draw, mean_sd
from vitkit.reproduce.spec import METRIC_NAMES, Analysis, Claim, Context, Study, by_arm
from vitkit.reproduce.verdict import SIMILAR_MARGIN, SMALLEST_EFFECT

CELLS = list(paper.TABLE_8)  # (posemb, where) in Table 8's order
DEFAULT, NONE = "learned_1d@input", "none@input"
WHERE = {"input": "stem", "per_layer": "every layer", "shared_per_layer": "every layer, shared"}


def name(kind: str, where: str) -> str:
    return f"{kind}@{where}"


def plan(context: Context) -> list:
    base = context.base.model

    def arms(seed: int) -> list:
        return [
            arm(
                context,
                name(kind, where),
                seed,
                dataclasses.replace(base, posemb=kind, posemb_where=where),
                {"posemb": kind, "where": where},
            )
            for kind, where in CELLS
        ]

    return over_seeds(context, arms)


def analyse(context: Context, records: list) -> Analysis:
    variants = [name(k, w) for k, w in CELLS if k != "none"]
    claims = []
    for metric in ("fewshot5", "top1"):
        first = better(records, metric, DEFAULT, NONE, f"{METRIC_NAMES[metric]}: learned 1D at the stem - none")
        second = similar(records, metric, variants, f"{METRIC_NAMES[metric]} of the 7 position embeddings")
        claims.append((metric, first, second))
    (_, none_5, similar_5), (_, none_top1, similar_top1) = claims
    five = means(records, "fewshot5")
    spread = max(five[v] for v in variants) - min(five[v] for v in variants)
    gap = five[DEFAULT] - five[NONE]
    out = [
        Claim(
            "posemb.none-worse",
            "No position embedding is clearly worse than learned 1D",
            paper.POSEMB_GAP,
            METRIC_NAMES["fewshot5"],
            none_5,
            {
                "none": five[NONE],
                "learned 1D": five[DEFAULT],
                "same test on test top-1": none_top1.status,
                "smallest effect": SMALLEST_EFFECT,
            },
        ),
        Claim(
            "posemb.variants-similar",
            "The ways of encoding position differ little",
            paper.POSEMB_GAP,
            METRIC_NAMES["fewshot5"],
            similar_5,
            {
                **{v: five[v] for v in variants},
                "same test on test top-1": similar_top1.status,
                "margin": SIMILAR_MARGIN,
                "range of the variants / gap to none (context, not the test)": round(spread / gap, 3) if gap else None,
                "the same in Table 8": round(paper_spread_over_gap(), 3),
            },
        ),
    ]
    paper_column = {name(k, w): [f"{100 * v:.3f}"] for (k, w), v in paper.TABLE_8.items()}
    table = table_of(
        records,
        ("fewshot5", "top1"),
        METRIC_NAMES,
        "Table 8 beside vitkit",
        paper_column,
        ["paper: ImageNet 5-shot (%)"],
    )
    figure(context, records)
    notes = [
        f"each arm: the base ViT ({describe(context)}) with one position embedding; PatchDropout off "
        "(it needs embeddings added once at the input)",
        "Table 8 measured ViT-B/16 after JFT-300M pre-training on ImageNet 5-shot; here the frozen features of "
        f"each arm are probed with 5 images per class of the same data set ({fewshot_draws(context.scale.name)} "
        "draws), scored on its test split",
    ]
    return Analysis(out, [table], [("posemb.png", "Table 8 drawn as bars: the paper (left) and vitkit (right)")], notes)


def paper_spread_over_gap() -> float:
    """Table 8's range of the seven position embeddings over its gap from none to learned 1D at the stem."""
    with_position = [v for (k, _), v in paper.TABLE_8.items() if k != "none"]
    return (max(with_position) - min(with_position)) / (
        paper.TABLE_8[("learned_1d", "input")] - paper.TABLE_8[("none", "input")]
    )


def describe(context: Context) -> str:
    m = context.base.model
    return (
        f"D={m.hidden_size}, L={m.depth}, k={m.num_heads}, MLP {m.mlp_dim}, {m.patch_size}x{m.patch_size} patches, "
        f"{m.img_size} px, pool {m.pool}"
    )


def figure(context: Context, records: list) -> None:
    values = by_arm(records, "fewshot5")
    paper_series, ours = [], []
    for where in WHERE:
        kinds = [k for k, w in CELLS if w == where]
        paper_series.append(Series(WHERE[where], kinds, [paper.TABLE_8[(k, where)] for k in kinds]))
        stats = [mean_sd(values[name(k, where)]) for k in kinds]
        ours.append(Series(WHERE[where], kinds, [s[0] for s in stats], [s[1] for s in stats]))
    draw(
        context.out / "posemb.png",
        [
            Panel(
                "Paper, Table 8: ViT-B/16, ImageNet 5-shot",
                "position embedding",
                "5-shot linear accuracy",
                paper_series,
                kind="bar",
            ),
            Panel(
                f"vitkit: {context.request.data.split(':')[0]}, 5-shot",
                "position embedding",
                "5-shot linear accuracy",
                ours,
                kind="bar",
            ),
        ],
    )


STUDY = Study(
    name="posemb", title="Position embeddings (App. D.4, Table 8)", units=len(CELLS), plan=plan, analyse=analyse
)
