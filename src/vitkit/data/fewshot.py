"""Low-data subsets: k examples per class (the paper's few-shot evaluation, Sec. 4.1) and VTAB-1k style
800 train + 200 val subsets (Zhai et al., 2019), made class-balanced as far as the class sizes allow.

Both are deterministic functions of (labels, seed) and return sorted int64 indices into `labels`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def k_per_class(
    labels: Tensor, k: int, seed: int, class_names: Sequence[str] | None = None, num_classes: int | None = None
) -> Tensor:
    """Indices of exactly `k` random samples of every class (sorted): classes 0 to `num_classes` - 1 where
    it is given, else those present in `labels`; `class_names` (by class index) name a class that is too
    small in the error.

    Raises:
        ValueError: a class has fewer than `k` samples, or k < 1.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    labels = torch.as_tensor(labels).cpu()
    generator = torch.Generator().manual_seed(seed)
    chosen = []
    classes = range(num_classes) if num_classes is not None else torch.unique(labels).tolist()
    order = torch.argsort(labels, stable=True)  # each class's members in ascending position, found once
    sorted_labels = labels[order]
    for cls in classes:
        key = torch.tensor(cls, dtype=labels.dtype)
        members = order[
            int(torch.searchsorted(sorted_labels, key)) : int(torch.searchsorted(sorted_labels, key, right=True))
        ]
        if len(members) < k:
            name = f"class {class_names[cls]!r} (index {cls})" if class_names is not None else f"class {cls}"
            if not len(members):  # a folder of files that do not decode: no --shots serves it
                raise ValueError(f"{name} has no usable training image; --shots needs images of every class")
            raise ValueError(
                f"{name} has only {len(members)} training image{'s' * (len(members) != 1)}; --shots {k} needs {k} "
                "of each "
                f"(at most {len(members)} here)"
            )
        chosen.append(members[torch.randperm(len(members), generator=generator)[:k]])
    return torch.cat(chosen).sort().values


def balanced_quota(available: Tensor, total: int, generator: torch.Generator) -> Tensor:
    """Split `total` over classes as evenly as their sizes `available` (K,) allow (water-filling).

    Classes that run out give their share to the others; the last units that cannot be split evenly
    go to randomly chosen classes.
    """
    if total > int(available.sum()):
        raise ValueError(f"asked for {total} samples but only {int(available.sum())} are available")
    quota = torch.zeros_like(available)
    remaining = total
    while remaining > 0:
        room = available - quota
        open_classes = torch.nonzero(room > 0).flatten()
        share = remaining // len(open_classes)
        if share == 0:  # fewer units than open classes: one each to a random few
            lucky = open_classes[torch.randperm(len(open_classes), generator=generator)[:remaining]]
            quota[lucky] += 1
            break
        added = torch.clamp(room[open_classes], max=share)
        quota[open_classes] += added
        remaining -= int(added.sum())
    return quota


def vtab_subset(labels: Tensor, seed: int, train: int = 800, val: int = 200) -> tuple[Tensor, Tensor]:
    """Disjoint (train, val) indices, `train` and `val` samples, each as class-balanced as possible.

    VTAB-1k uses 800 training and 200 validation images per task; here both parts are balanced
    across classes (water-filling), the train part first, the val part from what is left.
    """
    labels = torch.as_tensor(labels).cpu()
    if train + val > len(labels):
        raise ValueError(f"a {train} + {val} subset needs {train + val} samples; the set has {len(labels)}")
    generator = torch.Generator().manual_seed(seed)
    classes, counts = torch.unique(labels, return_counts=True)
    train_quota = balanced_quota(counts, train, generator)
    val_quota = balanced_quota(counts - train_quota, val, generator)
    train_index, val_index = [], []
    for cls, n_train, n_val in zip(classes.tolist(), train_quota.tolist(), val_quota.tolist()):
        members = torch.nonzero(labels == cls).flatten()
        members = members[torch.randperm(len(members), generator=generator)]
        train_index.append(members[:n_train])
        val_index.append(members[n_train : n_train + n_val])
    return torch.cat(train_index).sort().values, torch.cat(val_index).sort().values
