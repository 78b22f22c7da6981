"""Hugging Face datasets made in the tests with `datasets` (never a hub): a small labelled image set, its
truth, its classes renamed.
Imported by test modules after their `pytest.importorskip("datasets")`."""

from __future__ import annotations

import datasets
import torch

from shardkit import numbered_images, png

CLASSES = ["ant", "bee", "cat", "dog"]


def labelled_dataset(count: int, start: int = 0, extra_image: bool = False, int_labels: bool = False):
    images, labels = numbered_images(start + count, classes=len(CLASSES))
    features = {
        "picture": datasets.Image(),
        "target": datasets.Value("int64") if int_labels else datasets.ClassLabel(names=CLASSES),
        "weight": datasets.Value("float32"),
    }
    rows = {
        "picture": [{"bytes": png(images[i]), "path": None} for i in range(start, start + count)],
        "target": labels[start:].tolist(),
        "weight": [0.5] * count,
    }
    if extra_image:
        features["thumb"] = datasets.Image()
        rows["thumb"] = rows["picture"]
    return datasets.Dataset.from_dict(rows, features=datasets.Features(features))


def truth(count: int, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = numbered_images(start + count, classes=len(CLASSES))
    return torch.from_numpy(images[start:, None]), torch.from_numpy(labels[start:])


def renamed(dataset, names: list[str]):
    """`dataset` with its ClassLabel names in another order (or others), each row keeping its class by name."""
    labels = [names.index(CLASSES[label]) if CLASSES[label] in names else 0 for label in dataset["target"]]
    features = dataset.features.copy()
    features["target"] = datasets.ClassLabel(names=names)
    return dataset.remove_columns("target").add_column("target", labels).cast(features)
