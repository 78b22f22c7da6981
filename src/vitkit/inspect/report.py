"""`vitkit inspect`: the paper's inspection figures for one checkpoint, as PNG files plus the numbers
behind them in `inspect.json` (Sec. 4.5, App. D.7).

    filters.png              Figure 7 left    PCA of the patch-embedding filters
    position_similarity.png  Figure 7 center  cosine similarity between position embeddings
    attention_distance.png   Figure 7 right   mean attention distance per head and layer
    attention_rollout.png    Figure 6         attention rollout overlaid on input images

A figure that does not apply to the model (e.g. position similarity without absolute position
embeddings, every figure for a ResNet) is skipped and the reason is recorded under "notes".  Where the
folder holds an earlier inspect.json, the figures of that run this one does not draw are removed, so that
the folder's figures are those its inspect.json describes; figures in a folder without one are replaced only
with --force.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vitkit.atomic import atomic_write_text
from vitkit.data.inmemory import drawn_sample
from vitkit.data.sources import check_named_split, decode_image, load_split
from vitkit.device import pick_device
from vitkit.eval.features import channels, prepare, resolution
from vitkit.inspect import plots
from vitkit.inspect.attention import attention_rollout, mean_attention_distance, patch_distances, rollout_map
from vitkit.inspect.embeddings import filter_pca, position_similarity
from vitkit.models.vit import PatchEmbed
from vitkit.runs import data_reading, find_checkpoint, open_checkpoint

log = logging.getLogger(__name__)
SECTIONS = ("filters", "position_similarity", "attention_distance", "attention_rollout")  # of a report


@dataclass(frozen=True, kw_only=True)
class InspectConfig:
    """What `inspect_model` draws."""

    num_components: int = 28  # filter principal components shown (Figure 7 left shows 28)
    num_overlays: int = 8  # images shown with their attention rollout (Figure 6)
    batch_size: int = 8  # images per forward pass (attention maps of every layer are kept per batch)
    img_size: int | None = None  # input resolution; None = the checkpoint's
    device: str = "auto"  # "auto" = CUDA when available
    draw: bool = True  # write the PNG figures (False: numbers in inspect.json only)

    def __post_init__(self) -> None:
        if self.num_components < 1 or self.num_overlays < 1 or self.batch_size < 1:
            raise ValueError("num_components, num_overlays and batch_size must be positive")


def _notes_for_non_vit(model: torch.nn.Module) -> dict[str, str] | None:
    if hasattr(model, "blocks") and hasattr(model, "forward_intermediates"):
        return None
    reason = (
        f"{type(model).__name__} is not a Vision Transformer: it has no patch embedding, position embeddings "
        "or attention"
    )
    return {name: reason for name in SECTIONS}


def _figure(name: str, drawn: bool) -> dict[str, str]:
    """A section's "figure" entry: the PNG file it wrote, none where figures are not drawn."""
    return {"figure": name} if drawn else {}


def _label(title: str, section: dict[str, Any]) -> str:
    """The start of a summary line: the paper's figure and the file drawn for it."""
    return f"{title:<15} {section['figure']}:" if "figure" in section else f"{title}:"


def _filters(model: torch.nn.Module, out: Path, config: InspectConfig) -> tuple[dict[str, Any], str | None]:
    if not isinstance(model.patch_embed, PatchEmbed):
        return (
            {},
            "the hybrid's patch embedding is a 1x1 projection of ResNet features, not pixel filters (Figure 7 left)",
        )
    weight = model.patch_embed.proj.weight  # (D, C, P, P)
    pca = filter_pca(weight, config.num_components)
    if config.draw:
        plots.plot_filters(pca.components, pca.explained_variance_ratio, out / "filters.png")
    numbers = {
        **_figure("filters.png", config.draw),
        "num_filters": weight.shape[0],
        "filter_shape": list(weight.shape[1:]),
        "explained_variance_ratio": pca.explained_variance_ratio.tolist(),
    }
    if weight.shape[1] != 3:
        numbers["shown"] = "first input channel as grayscale (the model does not take RGB)"
    return numbers, None


def _position_similarity(
    model: torch.nn.Module, grid: tuple[int, int], out: Path, draw: bool
) -> tuple[dict[str, Any], str | None]:
    kind = model.encoder_config.posemb
    table = model.position_embeddings(grid)
    if table is None:
        return {}, f"posemb={kind!r} has no absolute position embeddings; Figure 7 center does not apply"
    patches = table[0, model.num_prefix_tokens :]  # first set; (N, D) patch rows without the [class] row
    similarity = position_similarity(patches, grid)
    if draw:
        plots.plot_position_similarity(similarity, out / "position_similarity.png")
    gh, gw = grid
    rows = torch.arange(gh)[:, None].expand(gh, gw).reshape(-1)
    cols = torch.arange(gw)[None, :].expand(gh, gw).reshape(-1)
    flat = similarity.reshape(gh * gw, gh * gw)
    same_row = (rows[:, None] == rows[None]) & (cols[:, None] != cols[None])
    same_col = (cols[:, None] == cols[None]) & (rows[:, None] != rows[None])
    other = (rows[:, None] != rows[None]) & (cols[:, None] != cols[None])
    distance = ((rows[:, None] - rows[None]) ** 2 + (cols[:, None] - cols[None]) ** 2).double().sqrt()
    neighbour = distance == 1
    numbers = {
        **_figure("position_similarity.png", draw),
        "posemb": kind,
        "grid": list(grid),
        "mean_same_row": float(flat[same_row].mean()) if same_row.any() else None,
        "mean_same_column": float(flat[same_col].mean()) if same_col.any() else None,
        "mean_other": float(flat[other].mean()) if other.any() else None,
        "mean_neighbour": float(flat[neighbour].mean()) if neighbour.any() else None,
        "similarity": similarity.tolist(),
    }
    if table.shape[0] > 1:
        numbers["shown"] = (
            f"the first of {table.shape[0]} per-layer sets (posemb_where={model.encoder_config.posemb_where!r})"
        )
    if tuple(grid) != tuple(model.grid_size):  # --img-size: the table the model reads there, not the learned one
        numbers["interpolated_from"] = list(model.grid_size)
    return numbers, None


@torch.no_grad()
def _attention(
    checkpoint, images: Sequence[Tensor], size: int, config: InspectConfig
) -> tuple[Tensor, Tensor, tuple[int, int], int]:
    """(mean attention distance (L, k) over all images, rollout maps of the first images, grid, pixels per patch)."""
    model = checkpoint.model.eval()
    device = pick_device(config.device)
    model.to(device)
    prefix = model.num_prefix_tokens
    total, count, maps, shown = None, 0, [], 0
    grid, patch = (0, 0), 0
    for start in range(0, len(images), config.batch_size):
        chunk = images[start : start + config.batch_size]
        inputs = torch.cat([prepare(image[None].to(device), checkpoint, size) for image in chunk])
        named = model.forward_intermediates(inputs)
        attns = [named[f"attn{i:02d}"] for i in range(len(model.blocks))]  # L x (B, k, T, T)
        side = math.isqrt(attns[0].shape[-1] - prefix)
        grid, patch = (side, side), size // side  # square inputs: pixels per token along a side
        distances = torch.stack([mean_attention_distance(a, grid, patch, prefix) for a in attns])  # (L, k)
        total = distances * len(chunk) if total is None else total + distances * len(chunk)
        count += len(chunk)
        if shown < config.num_overlays:  # rollout only for the images that will be drawn
            maps.append(rollout_map(attention_rollout(attns), grid, prefix).cpu())
            shown += len(chunk)
    return (total / count).cpu(), torch.cat(maps)[: config.num_overlays], grid, patch


def inspect_model(
    checkpoint, images: Sequence[Tensor], out_dir: str | os.PathLike, config: InspectConfig
) -> dict[str, Any]:
    """Write the figures that apply to `checkpoint.model` into `out_dir` and return their numbers.

    Args:
        images: uint8 (C, H, W) tensors (any sizes; each is resized to the model's input); the
            attention figures need at least one and are skipped without.
    Returns:
        the content of `out_dir/inspect.json`.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    earlier = (out / "inspect.json").is_file()  # an earlier run's folder: its figures are vitkit's to replace
    model = checkpoint.model
    size = resolution(checkpoint, config.img_size)
    report: dict[str, Any] = {"img_size": size, "num_images": len(images), "notes": {}}
    skipped = _notes_for_non_vit(model)
    if skipped:
        report["notes"] = skipped
        return _written_report(report, out, earlier)
    report["model"] = {
        "pool": model.encoder_config.pool,
        "posemb": model.encoder_config.posemb,
        "depth": len(model.blocks),
        "heads": model.encoder_config.num_heads,
    }
    numbers, note = _filters(model, out, config)
    report["filters"] = numbers
    if note:
        report["notes"]["filters"] = note
    grid = _grid(model, size)
    numbers, note = _position_similarity(model, grid, out, config.draw)
    report["position_similarity"] = numbers
    if note:
        report["notes"]["position_similarity"] = note
    if not images:
        reason = "no images given (--images FILE... or --data URI): attention needs inputs"
        report["notes"].update(attention_distance=reason, attention_rollout=reason)
    else:
        report.update(_attention_report(checkpoint, images, size, out, config))
    return _written_report(report, out, earlier)


def _written_report(report: dict[str, Any], out: Path, earlier: bool) -> dict[str, Any]:
    """`report` written as out/inspect.json, after removing the figures an `earlier` run wrote there that this
    one did not draw (skipped, or --no-figures)."""
    if earlier:
        drawn = {report[name].get("figure") for name in SECTIONS if isinstance(report.get(name), dict)}
        for name in SECTIONS:
            if f"{name}.png" not in drawn:
                (out / f"{name}.png").unlink(missing_ok=True)
    atomic_write_text(out / "inspect.json", json.dumps(report, indent=1) + "\n")
    return report


def _attention_report(
    checkpoint, images: Sequence[Tensor], size: int, out: Path, config: InspectConfig
) -> dict[str, Any]:
    """Figure 7 right and Figure 6 for `images`: "attention_distance" and "attention_rollout", drawn when asked."""
    distances, maps, grid, patch = _attention(checkpoint, images, size, config)
    if config.draw:
        plots.plot_attention_distance(distances, out / "attention_distance.png", size)
        plots.plot_rollout(list(images[: len(maps)]), maps, out / "attention_rollout.png")
    return {
        "attention_distance": {
            **_figure("attention_distance.png", config.draw),
            "pixels_per_patch": patch,
            "uniform_reference": float(patch_distances(grid, patch).mean()),  # what uniform attention would give
            "per_layer_head": distances.tolist(),
            "per_layer_mean": distances.mean(dim=1).tolist(),
            "per_layer_min": distances.min(dim=1).values.tolist(),
            "per_layer_max": distances.max(dim=1).values.tolist(),
        },
        "attention_rollout": {
            **_figure("attention_rollout.png", config.draw),
            "grid": list(grid),
            "maps": plots.relevance_maps(maps),
            **dict(zip(("centre_mass", "centre_uniform"), _centre_mass(maps), strict=True)),
        },
    }


def _grid(model: torch.nn.Module, size: int) -> tuple[int, int]:
    """The patch grid at input side `size` (the stored grid scaled by size / img_size)."""
    base = model.encoder_config.img_size if hasattr(model, "encoder_config") else size
    tokens = model.grid_size[0] * size // base
    return (tokens, tokens)


def _centre_mass(maps: Tensor) -> tuple[float | None, float | None]:
    """(share of rollout relevance on the centre of the patch grid, averaged over images; the share a uniform
    map gives, the centre's share of the grid's area).  The centre leaves a quarter of each side on each edge,
    rounded down: the central 4x4 of 8x8 (25%), 5x5 of 7x7 (51%).  A rough "does the model look at the
    object" number for centred photos; (None, None) on a grid with no edge to leave (under 4 patches a side)."""
    gh, gw = maps.shape[-2:]
    top, left = gh // 4, gw // 4
    if not top or not left:
        return None, None
    centre = maps[:, top : gh - top, left : gw - left].flatten(1).sum(1)
    share = float((centre / maps.flatten(1).sum(1).clamp_min(1e-300)).mean())
    return share, (gh - 2 * top) * (gw - 2 * left) / (gh * gw)


def load_images(paths: Sequence[str | os.PathLike], channels: int, size: int) -> list[Tensor]:
    """Decode image files to uint8 (C, size, size) (shorter side resized, centre crop); a corrupt
    file raises `BadImageError` naming it."""
    return [decode_image(path, channels=1 if channels == 1 else 3, size=size) for path in paths]


def sample_images(
    uri: str, split: str, count: int, channels: int, size: int, seed: int = 0, reading: dict[str, Any] | None = None
) -> list[Tensor]:
    """`count` images of a data split drawn by `seed`, uint8 (C, H, W), in an order drawn by `seed` too: the
    rollout figure shows the first --num-overlays, which in the split's order are a sorted folder's first
    classes.  `reading`: how the run read its data (`vitkit.runs.data_reading`)."""
    check_named_split(uri, split, reading)
    images = load_split(uri, split, image_size=size, channels=1 if channels == 1 else 3, **(reading or {}))
    drawn = drawn_sample(images, count, seed)
    order = torch.randperm(len(drawn), generator=torch.Generator().manual_seed(seed))
    return [drawn.read(int(i)) for i in order]


def inspect_command(
    path: str | os.PathLike,
    out: str | os.PathLike,
    config: InspectConfig,
    *,
    image_files: Sequence[str] = (),
    data: str | None = None,
    split: str = "test",
    num_images: int = 32,
    columns: dict[str, str] | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Open a checkpoint (or a run's final one), gather images (files and/or a data split) and write the figures;
    figures in a folder that is not an earlier inspect's (no inspect.json) are replaced only with `force`."""
    if not force and config.draw:  # --no-figures replaces none
        _check_foreign_figures(Path(out))
    checkpoint = open_checkpoint(path)
    size, chans = resolution(checkpoint, config.img_size), channels(checkpoint)
    images = load_images(image_files, chans, size)
    if data:
        reading = {**data_reading(path, data), **(columns or {})}
        images += sample_images(data, split, num_images, chans, size, reading=reading)
    report = inspect_model(checkpoint, images, out, config)
    return {"checkpoint": str(find_checkpoint(path)), "out": str(out), **report}


def _check_foreign_figures(out: Path) -> None:
    """ValueError where `out` holds a file named as one of the figures but no inspect.json: someone else's."""
    if (out / "inspect.json").is_file():
        return
    taken = [f"{name}.png" for name in SECTIONS if (out / f"{name}.png").exists()]
    if taken:
        named = ", ".join(taken)
        raise ValueError(
            f"{out} holds {named} but no inspect.json (another program's figures, or an inspect stopped before "
            "it finished); choose another --out or pass --force to replace"
        )


def _written(report: dict[str, Any]) -> str:
    """What an inspect run wrote: its figures and inspect.json, or inspect.json alone and why."""
    sections = [report[name] for name in SECTIONS if report.get(name)]
    figures = [section["figure"] for section in sections if "figure" in section]
    if figures:
        return f"{len(figures)} figure(s) and inspect.json"
    return "inspect.json alone (--no-figures)" if sections else "inspect.json alone (no figure applies: notes)"


def summary(report: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers of an inspect report (without per-tile matrices) plus printable lines."""
    short: dict[str, Any] = {
        key: report[key] for key in ("checkpoint", "out", "img_size", "num_images", "notes") if key in report
    }
    lines = [
        f"wrote {_written(report)} to {report.get('out')} ({report.get('num_images', 0)} images at "
        f"{report.get('img_size')} px)"
    ]
    filters = report.get("filters") or {}
    if filters:
        ratio = filters["explained_variance_ratio"]
        short["filters_components"], short["filters_variance"] = len(ratio), sum(ratio)
        lines.append(
            f"{_label('Figure 7 left', filters)} top {len(ratio)} components explain {100 * sum(ratio):.1f}% of "
            "filter variance"
        )
    position = report.get("position_similarity") or {}
    if position:
        keys = ("mean_same_row", "mean_same_column", "mean_neighbour", "mean_other")
        short["position_similarity"] = {key: position[key] for key in keys}
        lines.append(
            _label("Figure 7 center", position)
            + " mean cosine same row {mean_same_row:.3f}, same column "
            "{mean_same_column:.3f}, neighbours {mean_neighbour:.3f}, elsewhere {mean_other:.3f}".format(
                **{k: (v if v is not None else float("nan")) for k, v in short["position_similarity"].items()}
            )
        )
    distance = report.get("attention_distance") or {}
    if distance:
        short["attention_distance_per_layer"] = distance["per_layer_mean"]
        short["attention_distance_uniform"] = distance["uniform_reference"]
        lines.append(
            f"{_label('Figure 7 right', distance)} mean attention distance (px) per layer: "
            + ", ".join(f"{d:.1f}" for d in distance["per_layer_mean"])
            + f" (uniform attention: {distance['uniform_reference']:.1f})"
        )
        lines.append(
            "                min/max over heads per layer: "
            + ", ".join(
                f"{a:.1f}-{b:.1f}" for a, b in zip(distance["per_layer_min"], distance["per_layer_max"], strict=True)
            )
        )
    rollout = report.get("attention_rollout") or {}
    if rollout:
        short["rollout_centre_mass"] = share = rollout["centre_mass"]
        uniform = rollout["centre_uniform"]
        where = (
            f"{100 * share:.1f}% of rollout relevance on the centre of the image ({100 * uniform:.0f}% = uniform)"
            if share is not None
            else "no centre share: the patch grid has under 4 patches a side"
        )
        lines.append(f"{_label('Figure 6', rollout)} {where}")
    for name, note in report.get("notes", {}).items():
        lines.append(f"{name}: skipped: {note}")
    short["lines"] = lines
    return short
