"""`transfer` (Sec. 1, 3.2, 4.2; Tables 2 and 5; Figures 3-4): pre-train, then fine-tune, against the target alone.

The paper's central claim is about transfer: a ViT pre-trained on a large, varied set and fine-tuned on a small
target beats what the target alone trains.  At laptop scale: pre-train on `--pretrain-data` (Tiny-ImageNet's
shards: 40,400 images of 202 classes at 64 px) or start from `--init RUN`, fine-tune on `--data` (CIFAR-10) with
10, 100 or all of its labelled images per class, and compare with training on the target alone
(reproduce/transfer_arms.py builds every arm as the user's command would):
  - at equal fine-tuning budgets: the from-scratch arm gets the fine-tuning arm's U minutes;
  - at equal total budgets: it gets the pre-training's P minutes as well (ViT only);
  - 10-shot linear accuracy of the frozen pre-trained encoder against the same encoder randomly initialised;
  - with --families, the BiT ResNet and the hybrid of similar FLOPs are pre-trained and fine-tuned alike:
    Figures 3-4's question at this scale, which gains more from a small pre-training set.
`--budget-minutes` is divided among the arms' own time budgets (each a whole run's wall clock, start-up and
final evaluation included; the few-shot probes add about a minute each): U = budget / units, P = 4 U.  The
grid per seed is 25 units (ViT, pre-training included), 21 with --init, 45 with --families; so U = 15 minutes
asks for 375, 315 or 675 minutes.  Without --pretrain-data or --init the study pre-trains on the target's own
training images, which tests the mechanics only (the report says so).
"""

from __future__ import annotations

import math

from vitkit.reproduce import paper
from vitkit.reproduce.common import better, means, over_seeds, table_of
from vitkit.reproduce.figures import COLORS, MARKERS, Panel, Series, draw, mean_sd
from vitkit.reproduce.spec import Analysis, Claim, Context, Study, by_arm
from vitkit.reproduce.transfer_arms import (
    PRETRAIN_UNITS,
    SHOTS,
    Grid,
    fewshot_arm,
    finetune_arm,
    given_encoder,
    grid,
    pretrain_arm,
    run_arm,
    scratch_arm,
    tag,
    trained_encoder,
    units_per_seed,
)
from vitkit.reproduce.verdict import SMALLEST_EFFECT, Estimate, difference, exceeds, pooled_sd

FEWSHOT = f"fewshot{SHOTS}"
NAMES = {"top1": "test top-1 on the target", FEWSHOT: f"{SHOTS}-shot linear accuracy on the target"}
FAMILY_NAMES = {"vit": "ViT", "resnet": "BiT ResNet", "hybrid": "hybrid"}


def plan(context: Context) -> list:
    g = grid(context)

    def arms(seed: int) -> list:
        out = []
        for family in g.families:
            pretrain = None if family == "vit" and g.init else pretrain_arm(context, g, family, seed)
            encoder = trained_encoder(context, pretrain) if pretrain else given_encoder(g.init)
            out += [pretrain] if pretrain else []
            out += [fewshot_arm(context, g, encoder, family, seed, pretrained) for pretrained in (True, False)]
            for labels in g.labels:
                out += [
                    finetune_arm(context, g, encoder, family, labels, seed),
                    scratch_arm(context, g, family, labels, seed),
                ]
                if family == "vit":
                    out.append(scratch_arm(context, g, family, labels, seed, total=True))
        return out

    return over_seeds(context, arms)


def _of(records: list, *kinds: str) -> list:
    return [r for r in records if r["labels"]["kind"] in kinds]


def gain_claims(records: list, labels: tuple[int, ...]) -> list[Claim]:
    """Fine-tuned against from scratch, per label count, at equal fine-tuning and at equal total budgets."""
    trained = _of(records, "finetune", "scratch", "scratch-total")
    got = means(trained, "top1")
    claims = []
    for n in labels:
        for kind, budget in (("scratch", "the same fine-tuning budget"), ("scratch-total", "the same total budget")):
            a, b = f"finetune-vit@{tag(n)}", f"{kind}-vit@{tag(n)}"
            what = f"{NAMES['top1']} with {tag(n)} labels per class: fine-tuned - from scratch ({budget})"
            key = "finetune-beats-scratch" + ("-total" if kind == "scratch-total" else "")
            claims.append(
                Claim(
                    f"transfer.{key}.{tag(n)}",
                    f"Pre-training then fine-tuning beats the target alone at {budget}, {tag(n)} labels per class",
                    paper.TRANSFER,
                    NAMES["top1"],
                    better(trained, "top1", a, b, what),
                    {a: got[a], b: got[b], "gain (points)": round(100 * (got[a] - got[b]), 2)},
                )
            )
    return claims


def low_data_claim(records: list, labels: tuple[int, ...]) -> Claim:
    """The gain over from-scratch (equal fine-tuning budget) is larger with the fewest labels than with all."""
    trained = _of(records, "finetune", "scratch")
    values = by_arm(trained, "top1")
    sd = pooled_sd(values.values())
    few, every = tag(labels[0]), tag(labels[-1])
    at_few = difference(values[f"finetune-vit@{few}"], values[f"scratch-vit@{few}"], sd)
    at_all = difference(values[f"finetune-vit@{every}"], values[f"scratch-vit@{every}"], sd)
    effect = Estimate(at_few.mean - at_all.mean, math.hypot(at_few.se, at_all.se), min(at_few.n, at_all.n))
    what = f"gain of fine-tuning over from scratch with {few} labels per class minus with {every}"
    return Claim(
        "transfer.gain-largest-with-fewest-labels",
        "The gain from pre-training is largest with the fewest labels",
        paper.LOW_DATA,
        NAMES["top1"],
        exceeds(effect, SMALLEST_EFFECT, what, sd),
        {f"gain@{few}": round(at_few.mean, 4), f"gain@{every}": round(at_all.mean, 4)},
    )


def family_claims(records: list, families: tuple[str, ...]) -> list[Claim]:
    """Figures 3-4 and Sec. 4.4 at this scale: after a small pre-training set, the CNN and the hybrid transfer
    better than ViT (the paper sees ViT overtake only with ImageNet-21k or JFT-300M)."""
    tuned, probed = _of(records, "finetune"), _of(records, "fewshot-pretrained")
    claims = []
    if "resnet" in families:
        claims.append(
            Claim(
                "transfer.resnet-transfers-better",
                "After a small pre-training set the BiT ResNet fine-tunes better than ViT (Figure 3)",
                paper.DATA_SIZE,
                NAMES["top1"],
                better(
                    tuned,
                    "top1",
                    "finetune-resnet@all",
                    "finetune-vit@all",
                    "fine-tuned test top-1 with all labels: ResNet - ViT",
                ),
                {k: v for k, v in means(tuned, "top1").items() if k.endswith("@all")},
            )
        )
        claims.append(
            Claim(
                "transfer.resnet-fewshot-better",
                f"After a small pre-training set the BiT ResNet's {SHOTS}-shot accuracy beats ViT's (Figure 4)",
                paper.FEWSHOT,
                NAMES[FEWSHOT],
                better(
                    probed,
                    FEWSHOT,
                    "fewshot-pretrained-resnet",
                    "fewshot-pretrained-vit",
                    f"{SHOTS}-shot linear accuracy: ResNet - ViT",
                ),
                means(probed, FEWSHOT),
            )
        )
    if "hybrid" in families:
        claims.append(
            Claim(
                "transfer.hybrid-transfers-better",
                "The hybrid fine-tunes better than ViT at this small compute (Sec. 4.4)",
                paper.HYBRID_SMALL,
                NAMES["top1"],
                better(
                    tuned,
                    "top1",
                    "finetune-hybrid@all",
                    "finetune-vit@all",
                    "fine-tuned test top-1 with all labels: hybrid - ViT",
                ),
                {k: v for k, v in means(tuned, "top1").items() if k.endswith("@all")},
            )
        )
    return claims


def analyse(context: Context, records: list) -> Analysis:
    g = grid(context)
    probes = _of(records, "fewshot-pretrained", "fewshot-random")
    fewshot = better(
        probes,
        FEWSHOT,
        "fewshot-pretrained-vit",
        "fewshot-random-vit",
        f"{SHOTS}-shot linear accuracy: pre-trained - random encoder",
    )
    claims = [
        *gain_claims(records, g.labels),
        low_data_claim(records, g.labels),
        Claim(
            "transfer.fewshot-beats-random",
            f"The pre-trained encoder's {SHOTS}-shot linear accuracy beats a random one's",
            paper.FEWSHOT,
            NAMES[FEWSHOT],
            fewshot,
            means(probes, FEWSHOT),
        ),
        *family_claims(records, g.families),
    ]
    trained = _of(records, "pretrain", "finetune", "scratch", "scratch-total")
    extra = {
        r["arm"]: [
            r["labels"]["kind"],
            f"{r['num_train']:,}",
            r["config"]["recipe"],
            f"{r['config']['run']['max_minutes']:g}",
            f"{r['epochs']:.1f}",
        ]
        for r in trained
    }
    tables = [
        table_of(
            trained,
            ("top1",),
            NAMES,
            "Trained arms (pre-training: its own hold-out; others: the target)",
            extra,
            ["kind", "training images", "recipe", "budget (min)", "epochs"],
        ),
        table_of(probes, (FEWSHOT,), NAMES, f"{SHOTS}-shot linear accuracy of the frozen encoders"),
    ]
    figure(context, records, g)
    caption = (
        "Table 5: the paper's fine-tuned accuracy by pre-training set; vitkit's fine-tuned and "
        "from-scratch accuracy per label count"
    )
    return Analysis(claims, tables, [("transfer.png", caption)], notes(context, g))


def notes(context: Context, g: Grid) -> list[str]:
    source = f"the given checkpoint {g.init}" if g.init else g.pretrain_data
    if g.tiny:
        budgets = "tiny scale: the -tiny recipes, 10 steps per unit"
    else:
        units = units_per_seed(len(g.labels), len(g.families), bool(g.init))
        budgets = (
            f"budgets: fine-tuning U = {g.unit_minutes:.2f} min, pre-training P = {PRETRAIN_UNITS:g} U, from "
            f"scratch U (equal fine-tuning budget) or U + P (equal total budget); {units:g} units per seed"
        )
    out = [
        f"pre-training: {source}; target: {context.request.data}",
        budgets,
        "every arm is the plain command a user types (the recipe vitkit chooses, run by the clock): fine-tuning "
        "runs finetune-small at the checkpoint's resolution, from scratch the target's own recipe",
    ]
    if not g.init and g.pretrain_data == context.request.data:
        out.append("**pre-trained on the target's own training images: this run tests the mechanics, not transfer**")
    return out


def figure(context: Context, records: list, g: Grid) -> None:
    values = by_arm(_of(records, "finetune", "scratch", "scratch-total"), "top1")
    every = context.info.num_train // max(context.info.num_classes, 1)  # "all": the mean images per class
    xs = [n or every for n in g.labels]
    series = []
    for kind, label in (
        ("finetune", "fine-tuned"),
        ("scratch", "scratch, same budget"),
        ("scratch-total", "scratch, + pre-training's minutes"),
    ):
        for family in g.families:
            names = [f"{kind}-{family}@{tag(n)}" for n in g.labels]
            if all(name in values for name in names):
                stats = [mean_sd(values[name]) for name in names]
                marker = "x" if kind == "scratch-total" else MARKERS[family]  # colour: the family; dashes: scratch
                series.append(
                    Series(
                        f"{FAMILY_NAMES[family]} {label}",
                        xs,
                        [m for m, _ in stats],
                        [sd for _, sd in stats],
                        marker=marker,
                        dashed=kind != "finetune",
                        color=COLORS[family],
                    )
                )
    table5 = paper.TABLE_5_B16_CIFAR10
    draw(
        context.out / "transfer.png",
        [
            Panel(
                "Paper, Table 5: ViT-B/16 on CIFAR-10",
                "pre-training set",
                "top-1 (%)",
                [Series("paper", list(table5), list(table5.values()))],
                kind="bar",
                ylim=(95, 100),
            ),
            Panel(
                f"vitkit: {context.request.data.split(':')[0]}",
                "labelled images per class (log)",
                "test top-1",
                series,
                xlog=True,
            ),
        ],
    )


STUDY = Study(
    name="transfer",
    title="Pre-training then fine-tuning against the target alone (Sec. 3.2, 4.2; Tables 2, 5; Figures 3-4)",
    units=units_per_seed(3, 1, False),
    plan=plan,
    analyse=analyse,
    run_arm=run_arm,
    options=("pretrain_data", "init", "families"),
)
