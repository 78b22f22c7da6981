"""Top-1 / top-5 and confusion matrix against hand computations."""

from __future__ import annotations

import torch

from vitkit.eval.accuracy import accuracy_from_logits, confusion_matrix, topk_accuracy


def test_topk_against_hand_computation() -> None:
    logits = torch.tensor([
        [0.9, 0.05, 0.03, 0.01, 0.005, 0.005],  # label 0: top-1 hit
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],  # label 1: rank 5 -> top-5 hit, top-1 miss
        [0.1, 0.2, 0.3, 0.4, 0.5, 0.6],  # label 0: rank 6 -> miss both
        [0.0, 0.0, 1.0, 0.0, 0.0, 0.0],  # label 2: hit
    ])
    labels = torch.tensor([0, 1, 0, 2])
    assert topk_accuracy(logits, labels, 1) == 0.5
    assert topk_accuracy(logits, labels, 5) == 0.75
    assert topk_accuracy(logits, labels, 10) == 1.0  # k capped at K = 6


def test_confusion_matrix_counts_and_sums() -> None:
    predictions = torch.tensor([0, 1, 1, 2, 2, 2, 0])
    labels = torch.tensor([0, 1, 2, 2, 2, 0, 0])
    matrix = confusion_matrix(predictions, labels, 3)
    assert matrix.tolist() == [[2, 0, 1], [0, 1, 0], [0, 1, 2]]
    assert int(matrix.sum()) == 7
    assert matrix.sum(1).tolist() == torch.bincount(labels).tolist()


def test_accuracy_from_logits_per_class() -> None:
    logits = torch.eye(3)[torch.tensor([0, 1, 1, 2, 2, 2, 0])]
    labels = torch.tensor([0, 1, 2, 2, 2, 0, 0])
    result = accuracy_from_logits(logits, labels, ["a", "b", "c"], k=5)
    assert result.k == 3 and result.topk == 1.0
    assert abs(result.top1 - 5 / 7) < 1e-12
    assert result.per_class == [2 / 3, 1.0, 2 / 3]
    assert sum(map(sum, result.confusion)) == 7
    assert result.to_dict()["per_class"]["b"] == 1.0
