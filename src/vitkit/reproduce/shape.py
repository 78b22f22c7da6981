"""`shape` (App. D.2, Figure 8): scaling one dimension of the Transformer at a time from a base model.

Arms: the base ViT; depth halved and doubled; width D halved and doubled (k heads kept); MLP width halved
and doubled; patches one step smaller and one step larger (the next sizes that tile the image).  The
paper trains every shape alike on the same data; here every arm trains for
the same number of steps, so that every arm sees the same images (its time grows with its FLOPs).
Metric: 5-shot linear accuracy (Figure 8's ImageNet 5-shot), test top-1 beside it.
Claims: doubling the depth gains more than doubling the width or the MLP; smaller patches help with
(nearly) no added parameters.
"""

from __future__ import annotations

import dataclasses

from vitkit.models.configs import ViTConfig
from vitkit.reproduce import paper
from vitkit.reproduce.common import arm, better, means, over_seeds, table_of
from vitkit.reproduce.figures import Panel, Series, draw, mean_sd
from vitkit.reproduce.spec import METRIC_NAMES, Analysis, Claim, Context, Study, by_arm
from vitkit.reproduce.verdict import SMALLEST_EFFECT, difference, exceeds, pooled_sd

UNITS = 15.0  # one seed's arms take about this many unit arms of time (their FLOPs against the base's, summed)
DIMENSIONS = ("depth", "width", "mlp", "patch")


def patch_steps(vit: ViTConfig) -> tuple[int, int]:
    """The patch sizes one step below and above the base's that tile the image."""
    sizes = [p for p in range(1, vit.img_size + 1) if vit.img_size % p == 0]
    at = sizes.index(vit.patch_size)
    return sizes[max(at - 1, 0)], sizes[min(at + 1, len(sizes) - 1)]


def shapes(vit: ViTConfig) -> dict[str, tuple[str, float, ViTConfig]]:
    """name -> (dimension, factor against the base, config)."""
    small, large = patch_steps(vit)
    half = max(vit.num_heads, vit.hidden_size // 2 // vit.num_heads * vit.num_heads)  # k heads kept
    return {
        "base": ("base", 1.0, vit),
        "depth x0.5": ("depth", 0.5, dataclasses.replace(vit, depth=max(1, vit.depth // 2))),
        "depth x2": ("depth", 2.0, dataclasses.replace(vit, depth=2 * vit.depth)),
        "width x0.5": ("width", 0.5, dataclasses.replace(vit, hidden_size=half)),
        "width x2": ("width", 2.0, dataclasses.replace(vit, hidden_size=2 * vit.hidden_size)),
        "mlp x0.5": ("mlp", 0.5, dataclasses.replace(vit, mlp_dim=max(1, vit.mlp_dim // 2))),
        "mlp x2": ("mlp", 2.0, dataclasses.replace(vit, mlp_dim=2 * vit.mlp_dim)),
        f"patch {small}": ("patch", small / vit.patch_size, dataclasses.replace(vit, patch_size=small)),
        f"patch {large}": ("patch", large / vit.patch_size, dataclasses.replace(vit, patch_size=large)),
    }


def plan(context: Context) -> list:
    table = shapes(context.base.model)

    def arms(seed: int) -> list:
        return [
            arm(context, name, seed, config, {"dimension": dim, "factor": factor})
            for name, (dim, factor, config) in table.items()
        ]

    return over_seeds(context, arms)


def analyse(context: Context, records: list) -> Analysis:
    table = shapes(context.base.model)
    small = next(n for n, (d, f, _) in table.items() if d == "patch" and f < 1)
    metric = "fewshot5"
    values = by_arm(records, metric)
    sd = pooled_sd(values.values())
    wider = max(("width x2", "mlp x2"), key=lambda n: sum(values[n]) / len(values[n]))
    depth = exceeds(
        difference(values["depth x2"], values[wider], sd),
        SMALLEST_EFFECT,
        f"{METRIC_NAMES[metric]}: depth x2 - {wider} (the better of width x2 and mlp x2)",
        sd,
    )
    patch = better(records, metric, small, "base", f"{METRIC_NAMES[metric]}: {small} - base")
    got = means(records, metric)
    claims = [
        Claim(
            "shape.depth-most",
            "Scaling depth helps more than scaling width or MLP",
            paper.SHAPE,
            METRIC_NAMES[metric],
            depth,
            {n: got[n] for n in ("base", "depth x2", "width x2", "mlp x2")},
        ),
        Claim(
            "shape.smaller-patches",
            "Smaller patches help without adding parameters",
            paper.SHAPE,
            METRIC_NAMES[metric],
            patch,
            {n: got[n] for n in ("base", small)},
        ),
    ]
    extra = {
        r["arm"]: [f"{r['params']:,}", f"{r['forward_flops'] / 1e6:.2f}", f"{r['images_seen']:,}"] for r in records
    }
    summary = table_of(
        records, ("fewshot5", "top1"), METRIC_NAMES, "Shapes", extra, ["params", "MFLOPs/image", "images seen"]
    )
    figure(context, records, table)
    notes = [
        "every arm trains for the same steps (equal images seen; its time grows with its FLOPs); Figure 8 "
        "scales ViT with 8 layers, D=1024, MLP 2048, patch 32 on JFT-300M and reads ImageNet 5-shot"
    ]
    return Analysis(
        claims,
        [summary],
        [("shape.png", "Figure 8: 5-shot accuracy against the scaling factor of one dimension")],
        notes,
    )


def figure(context: Context, records: list, table: dict) -> None:
    values = by_arm(records, "fewshot5")
    base = mean_sd(values["base"])
    series = []
    for dim in DIMENSIONS:
        names = sorted([n for n, (d, _, _) in table.items() if d == dim] + ["base"], key=lambda n: table[n][1])
        stats = [mean_sd(values[n]) if n != "base" else base for n in names]
        series.append(Series(dim, [table[n][1] for n in names], [s[0] for s in stats], [s[1] for s in stats]))
    draw(
        context.out / "shape.png",
        [Panel("like Figure 8", "factor against the base (log)", "5-shot linear accuracy", series, xlog=True)],
    )


STUDY = Study(
    name="shape", title="Scaling the Transformer's shape (App. D.2, Figure 8)", units=UNITS, plan=plan, analyse=analyse
)
