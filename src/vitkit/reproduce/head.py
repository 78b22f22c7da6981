"""`head` (App. D.3, Figure 9): the [class] token or global average pooling, at two learning rates.

Arms: the base ViT read out through the [class] token with a tanh MLP head (representation_size = D,
as D.3 describes) or through GAP with a linear classifier, each trained at the study's learning rate
and at 8/3 of it (Figure 9's ratio: 8e-4 and 3e-4).  Each head's learning rate is chosen on the
validation hold-out; the claims read the test split.
Claims: both heads work similarly well at their own best learning rate; they need different learning
rates (GAP gains more than the token from the lower rate, as in Figure 9).
"""

from __future__ import annotations

import dataclasses
import math

from vitkit.reproduce import paper
from vitkit.reproduce.common import arm, means, over_seeds, similar, table_of
from vitkit.reproduce.figures import Panel, Series, draw, mean_sd
from vitkit.reproduce.spec import METRIC_NAMES, Analysis, Claim, Context, Study, by_arm
from vitkit.reproduce.verdict import SIMILAR_MARGIN, SMALLEST_EFFECT, Estimate, Verdict, difference, exceeds, pooled_sd

LR_RATIO = 8 / 3  # Figure 9: 8e-4 (the token's) against 3e-4 (GAP's)
HEADS = ("token", "gap")


def rates(context: Context) -> dict[str, float]:
    low = context.base.optim.lr
    return {"low": low, "high": round(low * LR_RATIO, 8)}


def name(head: str, level: str) -> str:
    return f"{head}@lr-{level}"


def plan(context: Context) -> list:
    base = context.base.model

    def arms(seed: int) -> list:
        out = []
        for head in HEADS:
            model = dataclasses.replace(
                base, pool=head, representation_size=base.hidden_size if head == "token" else None
            )
            for level, lr in rates(context).items():
                out.append(
                    arm(
                        context,
                        name(head, level),
                        seed,
                        model,
                        {"head": head, "lr": lr},
                        measure=("fewshot", "val"),
                        optim={"lr": lr},
                    )
                )
        return out

    return over_seeds(context, arms)


def best_rate(records: list, head: str) -> str:
    """The learning rate level with the best mean validation top-1 for `head`."""
    val = by_arm(records, "val")
    return max(("low", "high"), key=lambda level: sum(val[name(head, level)]) / len(val[name(head, level)]))


def interaction(records: list, metric: str) -> tuple[Estimate, float | None]:
    """(GAP low - GAP high) - (token low - token high): how much more GAP gains from the lower rate."""
    values = by_arm(records, metric)
    sd = pooled_sd(values.values())
    gap = difference(values[name("gap", "low")], values[name("gap", "high")], sd)
    token = difference(values[name("token", "low")], values[name("token", "high")], sd)
    return Estimate(gap.mean - token.mean, math.hypot(gap.se, token.se), min(gap.n, token.n)), sd


def analyse(context: Context, records: list) -> Analysis:
    chosen = {head: name(head, best_rate(records, head)) for head in HEADS}
    verdicts: dict[str, tuple[Verdict, Verdict]] = {}
    for metric in ("fewshot5", "top1"):
        both = similar(
            records, metric, list(chosen.values()), f"{METRIC_NAMES[metric]} of {' and '.join(chosen.values())}"
        )
        effect, sd = interaction(records, metric)
        verdicts[metric] = (
            both,
            exceeds(
                effect, SMALLEST_EFFECT, f"{METRIC_NAMES[metric]}: (GAP low - GAP high) - (token low - token high)", sd
            ),
        )
    five = means(records, "fewshot5")
    claims = [
        Claim(
            "head.both-work",
            "Class token and GAP work similarly well, each at its best learning rate",
            paper.HEAD_LR,
            METRIC_NAMES["fewshot5"],
            verdicts["fewshot5"][0],
            {
                **{arm_name: five[arm_name] for arm_name in chosen.values()},
                "chosen on": "validation top-1",
                "same test on test top-1": verdicts["top1"][0].status,
                "margin": SIMILAR_MARGIN,
            },
        ),
        Claim(
            "head.different-lr",
            "GAP needs a lower learning rate than the class token",
            paper.HEAD_LR,
            METRIC_NAMES["fewshot5"],
            verdicts["fewshot5"][1],
            {**five, "learning rates": rates(context), "same test on test top-1": verdicts["top1"][1].status},
        ),
    ]
    table = table_of(
        records,
        ("val", "fewshot5", "top1"),
        METRIC_NAMES,
        "Heads and learning rates",
        {n: [f"{r['labels']['lr']:g}"] for r in records for n in [r["arm"]]},
        ["lr"],
    )
    figure(context, records)
    notes = [
        f"token arms: [class] token + tanh pre-logits layer of width D (D.3); GAP arms: mean of the patch "
        f"tokens + linear classifier; learning rates {rates(context)} (ratio {LR_RATIO:.3g} as Figure 9's "
        "8e-4 / 3e-4); each head's rate chosen on the validation hold-out: " + ", ".join(chosen.values())
    ]
    return Analysis(claims, [table], [("head.png", "Figure 9 as accuracy against learning rate, per head")], notes)


def figure(context: Context, records: list) -> None:
    panels = []
    lr = rates(context)
    for metric in ("fewshot5", "top1"):
        values = by_arm(records, metric)
        series = []
        for head in HEADS:
            stats = [mean_sd(values[name(head, level)]) for level in ("low", "high")]
            series.append(
                Series(
                    "CLS token" if head == "token" else "GAP",
                    [lr["low"], lr["high"]],
                    [s[0] for s in stats],
                    [s[1] for s in stats],
                    marker="o" if head == "token" else "s",
                )
            )
        panels.append(
            Panel(
                f"vitkit: {METRIC_NAMES[metric]}",
                "learning rate",
                "accuracy",
                series,
                xlog=True,
                xticks=[lr["low"], lr["high"]],
            )
        )
    draw(context.out / "head.png", panels)


STUDY = Study(
    name="head",
    title="Class token against global average pooling (App. D.3, Figure 9)",
    units=4,
    plan=plan,
    analyse=analyse,
)
