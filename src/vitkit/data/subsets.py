"""Fixed class-stratified parts of a training split: a fraction of every class, or N images of every class.

Every class's images are put in one random order, drawn once by SUBSET_SEED, and every part takes a prefix
of each order: smaller parts lie inside larger ones, as the paper's growing subsets of JFT (Sec. 4.3).  The
10-per-class part is inside the 100-per-class one, and a part of N per class is inside any fraction that
gives every class at least N images.  A part of N per class may keep a validation hold-out of its own
(`labelled_parts`): the images a learning-rate sweep scores on then come out of the N, as a user who has
only N labels per class would have to take them (the paper's VTAB-1k runs likewise tune on 200 of their
1,000 images, App. B.1.1).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch
from torch import Tensor

from vitkit.data.holdout import stratified_split
from vitkit.data.imageset import ImageSet

log = logging.getLogger(__name__)

SUBSET_SEED = 12345  # the one draw of the per-class orders: nested parts for growing fractions and counts


def class_orders(labels: Tensor) -> list[Tensor]:
    """Each class's indices (classes in ascending order) in the fixed random order of SUBSET_SEED."""
    generator = torch.Generator().manual_seed(SUBSET_SEED)
    orders = []
    for cls in torch.unique(labels).tolist():
        members = torch.nonzero(labels == cls).flatten()
        orders.append(members[torch.randperm(len(members), generator=generator)])
    return orders


def fraction_subset(train: ImageSet, fraction: float) -> ImageSet:
    """A fixed class-stratified `fraction` of the training split (every class keeps at least one image)."""
    if fraction >= 1.0:
        return train
    keep = [order[: max(1, round(fraction * len(order)))] for order in class_orders(train.labels)]
    part = train.subset(torch.cat(keep).sort().values)
    part.origin = f"a fixed {fraction:.1%} class-stratified part of {train.origin}"
    return part


def per_class_subset(train: ImageSet, count: int) -> ImageSet:
    """A fixed `count` images of every class of the training split (a class with fewer keeps all it has)."""
    orders = class_orders(train.labels)
    short = [(train.class_names[int(train.labels[o[0]])], len(o)) for o in orders if len(o) < count]
    if short:
        log.warning(
            "%d class(es) have fewer than %d training images (e.g. %s: %d); they keep all they have",
            len(short),
            count,
            *short[0],
        )
    part = train.subset(torch.cat([order[:count] for order in orders]).sort().values)
    part.origin = f"a fixed {count:,} images per class of {train.origin}" + (
        f" ({len(short)} class(es) have fewer)" if short else ""
    )
    return part


def labelled_parts(train: ImageSet, count: int, val_fraction: float, seed: int) -> tuple[ImageSet, ImageSet | None]:
    """(train, val) of a part of `count` images per class: val a class-stratified `val_fraction` of the part
    drawn by `seed` (None when 0), train the rest."""
    part = per_class_subset(train, count)
    if val_fraction <= 0:
        return part, None
    keep, held = stratified_split(part.labels, val_fraction, seed)
    return (
        replace(part.subset(keep), origin=f"{part.origin} minus a {val_fraction:.0%} validation hold-out"),
        replace(
            part.subset(held), origin=f"a {val_fraction:.0%} class-stratified hold-out (seed {seed}) of {part.origin}"
        ),
    )
