"""The report of a study: DIR/report.md and DIR/results.json beside the PNG figures the study drew.

For each claim: the paper's words with their table or figure, the paper's numbers where it gives
numbers, vitkit's measured numbers with seed spread, the verdict and its reason.  Then every arm with
the compute it used (parameters, steps, epochs, images, analytic training FLOPs, minutes, device):
no arm is left out.  Both files are written atomically.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from typing import Any

import torch

from vitkit import host as hosts
from vitkit.atomic import atomic_write_text
from vitkit.reproduce import verdict as verdicts
from vitkit.reproduce.spec import Analysis, Claim, Context, Study, Table

OVERRUN = 1.25  # arm minutes beyond this many budgets are said, in the log and the report

VERDICT_RULES = (
    f"Each claim is reduced to one number per seed and tested with its seed spread (reproduce/verdict.py): "
    f"mean +- {verdicts.Z:g} standard errors, the seed standard deviation pooled over the study's arms.  "
    f"'A exceeds B': **{verdicts.REPRODUCED}** when the interval is above 0 and the mean reaches the smallest "
    f"effect of interest, **{verdicts.NOT_REPRODUCED}** when the whole interval is below that effect, else "
    f"**{verdicts.INCONCLUSIVE}** (the spread is larger than the effect).  'A is about B': reproduced when the "
    f"range of the means plus the interval fits the margin, not reproduced when it exceeds it even without the "
    f"interval, else inconclusive.  With one seed the spread is not measured and the reason says so.  Unless a "
    f"claim says otherwise, the smallest effect of interest in accuracy is {verdicts.SMALLEST_EFFECT:g} "
    f"(half a point) and variants 'differ little' within {verdicts.SIMILAR_MARGIN:g} (one point)."
)


def machine(device: str) -> str:
    """The device in words: the GPU's name, or the CPU's model, host class and cores (vitkit.host)."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{device} ({hosts.current(device).cpu})"
    host = hosts.current()
    return f"cpu ({host.cpu}, {host.label}, {hosts.cpus()} cores)"


def command(study: Study, context: Context) -> str:
    request = context.request
    line = (
        f"vitkit reproduce {study.name} --data {request.data} --budget-minutes {request.budget_minutes:g} "
        f"--seeds {request.seeds} --out {request.out}"
    )
    for key in study.options:  # the study's own flags, where set: --pretrain-data URI, --families
        value = getattr(request, key)
        if value:
            line += f" --{key.replace('_', '-')}" + ("" if value is True else f" {value}")
    return line + (f" --threads {request.threads}" if request.threads else "")


def write_report(
    study: Study, context: Context, records: list[dict[str, Any]], analysis: Analysis, *, minutes: float
) -> dict[str, Any]:
    """Write report.md and results.json into the study directory; returns the summary (claims and verdicts)."""
    devices = sorted({r.get("device", "?") for r in records})
    results = {
        "study": study.name,
        "title": study.title,
        "command": command(study, context),
        "data": context.request.data,
        "budget_minutes": context.request.budget_minutes,
        "seeds": context.request.seeds,
        "scale": dataclasses.asdict(context.scale),
        "machine": machine(devices[0] if devices else "cpu"),
        "minutes_this_invocation": round(minutes, 2),
        "arm_minutes": round(sum(r.get("wall_minutes", 0) for r in records), 2),
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "claims": [c.to_dict() for c in analysis.claims],
        "tables": [{"title": t.title, "header": t.header, "rows": t.rows} for t in analysis.tables],
        "figures": [{"file": f, "caption": c} for f, c in analysis.figures],
        "notes": analysis.notes,
        "arms": records,
    }
    out = context.out
    atomic_write_text(out / "results.json", json.dumps(results, indent=1) + "\n")
    atomic_write_text(out / "report.md", markdown(results, analysis))
    return {
        "study": study.name,
        "out": str(out),
        "report": str(out / "report.md"),
        "claims": [{"key": c.key, "claim": c.claim, "verdict": c.verdict.status} for c in analysis.claims],
        "arm_minutes": results["arm_minutes"],
        "minutes": results["minutes_this_invocation"],
    }


def markdown(results: dict[str, Any], analysis: Analysis) -> str:
    lines = [f"# {results['title']}", "", f"`{results['command']}`", ""]
    scale = results["scale"]
    unit = unit_text(scale)
    lines += [
        f"- data: `{results['data']}`; scale **{scale['name']}** ({unit}); {results['seeds']} seed(s)",
        f"- machine: {results['machine']}; {len(results['arms'])} arms, {results['arm_minutes']:.1f} arm-minutes "
        f"in all (budget {results['budget_minutes']:g} min; a killed process counts the training its checkpoints kept)",
    ]
    if scale["name"] != "tiny" and results["arm_minutes"] > OVERRUN * results["budget_minutes"]:  # tiny: fixed steps
        lines.append(
            f"- **over the budget**: the arms took {results['arm_minutes']:.1f} min of "
            f"{results['budget_minutes']:g}; their start-up and evaluations cost more on this machine than the plan "
            "allowed"
        )
    lines.append("")
    lines += [f"- {note}" for note in analysis.notes] + ([""] if analysis.notes else [])
    lines += ["## Verdicts", "", "| claim | paper | verdict |", "| --- | --- | --- |"]
    lines += [f"| {c.claim} | {c.paper.where} | **{c.verdict.status}** |" for c in analysis.claims]
    lines.append("")
    for claim in analysis.claims:
        lines += claim_section(claim)
    for table in analysis.tables:
        lines += table_lines(table)
    for name, caption in analysis.figures:
        lines += [f"![{caption}]({name})", "", f"*{caption}*", ""]
    lines += table_lines(arms_table(results["arms"]))
    lines += ["## How the verdicts are made", "", VERDICT_RULES, ""]
    return "\n".join(lines)


def unit_text(scale: dict[str, Any]) -> str:
    """What one unit arm is: steps fitted when the study started, the -tiny recipe's steps, or (a study whose
    arms are time budgets, such as transfer) minutes, which the study's notes give."""
    if scale["unit_steps"]:
        return (
            f"a unit arm is {scale['unit_steps']} steps, {scale['unit_minutes']:.2f} min at the "
            f"{scale['images_per_s']:g} images/s the base model trained at when the study started"
        )
    if scale["name"] == "tiny":
        return "a unit arm is the -tiny recipe's steps"
    return "arms are time budgets in minutes, given below"


def claim_section(claim: Claim) -> list[str]:
    paper = claim.paper
    lines = [f"## {claim.claim}", "", f"> {paper.quote}", ">", f"> — {paper.where}; quoted from {paper.source}", ""]
    if paper.note:
        lines += [f"The paper measured: {paper.note}.", ""]
    if paper.numbers:
        shown = ", ".join(f"{k} {v:g}" for k, v in paper.numbers.items())
        lines += [f"The paper's numbers: {shown}.", ""]
    lines += [f"Measured here ({claim.metric}): " + ", ".join(f"{k} {fmt(v)}" for k, v in claim.measured.items()), ""]
    lines += [f"**Verdict: {claim.verdict.status}** — {claim.verdict.reason}.", ""]
    return lines


def table_lines(table: Table) -> list[str]:
    lines = [
        f"### {table.title}",
        "",
        "| " + " | ".join(table.header) + " |",
        "|" + "|".join(" --- " for _ in table.header) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table.rows]
    return lines + [""]


def arms_table(records: list[dict[str, Any]]) -> Table:
    """Every arm with the compute it used (the report never drops one)."""
    rows = []
    for r in records:
        shots = (r.get("fewshot") or {}).get("5")
        rows.append(
            [
                r["arm"],
                str(r["seed"]),
                f"{r.get('params', 0):,}",
                f"{r.get('step', 0)}",
                f"{r.get('epochs', 0):.2f}",
                f"{r.get('images_seen', 0):,}",
                f"{r.get('train_flops', 0):.3g}",
                f"{r.get('train_minutes', 0):.2f}",
                f"{r.get('wall_minutes', 0):.2f}",
                r.get("device", "?"),
                pct(r["test"]["top1"]) if r.get("test") else "-",
                pct(shots["mean"]) if shots else "-",
            ]
        )
    return Table(
        "Arms: the compute each used",
        [
            "arm",
            "seed",
            "params",
            "steps",
            "epochs",
            "images seen",
            "train FLOPs",
            "train min",
            "arm min",
            "device",
            "test top-1",
            "5-shot",
        ],
        rows,
    )


def pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {fmt(x)}" for k, x in v.items()) + "}"
    return str(v)
