"""Few-shot and VTAB-1k style subsets: exact per-class counts, balance, disjointness, determinism."""

from __future__ import annotations

import pytest
import torch

from vitkit.data.fewshot import balanced_quota, k_per_class, vtab_subset


def test_k_per_class_exact_and_deterministic():
    labels = torch.tensor([0] * 20 + [1] * 7 + [2] * 30 + [5] * 9)
    index = k_per_class(labels, 5, seed=0)
    assert torch.bincount(labels[index]).tolist() == [5, 5, 5, 0, 0, 5]
    assert len(set(index.tolist())) == 20 and torch.equal(index, index.sort().values)
    assert torch.equal(index, k_per_class(labels, 5, seed=0))
    assert not torch.equal(index, k_per_class(labels, 5, seed=1))
    with pytest.raises(ValueError, match="^class 1 has only 7 training images; --shots 8 needs 8"):
        k_per_class(labels, 8, seed=0)


def test_a_class_too_small_for_k_is_named_by_its_name():
    labels = torch.tensor([0] * 30 + [1] * 12)
    with pytest.raises(ValueError) as refused:
        k_per_class(labels, 20, seed=0, class_names=["anchor", "bonsai"])
    assert str(refused.value) == (
        "class 'bonsai' (index 1) has only 12 training images; --shots 20 needs 20 of each (at most 12 here)"
    )
    with pytest.raises(ValueError, match=r"^class 'one' \(index 0\) has only 1 training image; --shots 5 needs 5"):
        k_per_class(torch.tensor([0] + [1] * 9), 5, seed=0, class_names=["one", "many"])


def test_vtab_subset_sizes_balance_and_disjoint():
    labels = torch.arange(5000) % 10
    train, val = vtab_subset(labels, seed=0)
    assert (len(train), len(val)) == (800, 200)
    assert set(train.tolist()).isdisjoint(val.tolist())
    assert torch.bincount(labels[train]).tolist() == [80] * 10 and torch.bincount(labels[val]).tolist() == [20] * 10
    again = vtab_subset(labels, seed=0)
    assert torch.equal(train, again[0]) and torch.equal(val, again[1])


def test_vtab_subset_with_small_classes_is_as_balanced_as_possible():
    labels = torch.tensor([0] * 30 + [1] * 500 + [2] * 1000 + [3] * 7)
    train, val = vtab_subset(labels, seed=3)
    counts = torch.bincount(labels[train]).tolist()
    assert (len(train), len(val)) == (800, 200) and set(train.tolist()).isdisjoint(val.tolist())
    assert counts[0] == 30 and counts[3] == 7 and abs(counts[1] - counts[2]) <= 1  # small classes used up
    assert torch.bincount(labels[val], minlength=4).tolist()[:1] == [0]  # nothing left of class 0 for val
    assert balanced_quota(torch.tensor([2, 10, 10]), 11, torch.Generator()).tolist()[0] == 2
    with pytest.raises(ValueError, match="needs 1000 samples"):
        vtab_subset(torch.zeros(999, dtype=torch.long), seed=0)


def test_k_per_class_counts_a_class_with_no_images() -> None:
    labels = torch.tensor([0, 0, 2, 2])
    assert k_per_class(labels, 1, seed=0).tolist() in ([0, 2], [0, 3], [1, 2], [1, 3])
    with pytest.raises(ValueError, match=r"class 1 has no usable training image"):
        k_per_class(labels, 1, seed=0, num_classes=3)
