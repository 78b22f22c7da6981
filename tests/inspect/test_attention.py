"""Mean attention distance (App. D.7) and attention rollout (Abnar & Zuidema 2020) on constructed maps."""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from vitkit.inspect.attention import attention_rollout, mean_attention_distance, rollout_map


def _uniform_pairwise_mean(gh: int, gw: int, patch: int) -> float:
    """Independent numpy computation: mean distance between all ordered pairs of patch centres (self-pairs too)."""
    centres = [((r + 0.5) * patch, (c + 0.5) * patch) for r in range(gh) for c in range(gw)]
    total = sum(math.dist(a, b) for a, b in itertools.product(centres, centres))
    return total / len(centres) ** 2


def test_self_attention_only_has_zero_distance() -> None:
    grid, prefix = (3, 4), 1
    tokens = prefix + 12
    attn = torch.eye(tokens).expand(2, 3, tokens, tokens)
    assert torch.equal(mean_attention_distance(attn, grid, 8, prefix), torch.zeros(3, dtype=torch.float64))


def test_uniform_attention_gives_the_analytic_mean_pairwise_distance() -> None:
    grid, patch = (4, 3), 16
    for prefix in (0, 1):
        tokens = prefix + 12
        attn = torch.full((2, 2, tokens, tokens), 1.0 / tokens)  # the [class] key's share is renormalised away
        expected = _uniform_pairwise_mean(*grid, patch)
        got = mean_attention_distance(attn, grid, patch, prefix)
        np.testing.assert_allclose(got.numpy(), [expected, expected], rtol=1e-12)
    assert 20.0 < expected < 40.0  # sanity: between one patch and the grid's diagonal (~ 58 px)


def test_attention_to_right_neighbour_is_one_patch() -> None:
    # each query attends to the patch to its right (wrapping at the row end would be wrong: use 1 x n grid
    # and a last query attending to its left neighbour) -> every distance is exactly P.
    n, patch = 5, 7
    attn = torch.zeros(1, 1, n, n)
    for i in range(n):
        attn[0, 0, i, i + 1 if i + 1 < n else i - 1] = 1.0
    assert mean_attention_distance(attn, (1, n), patch, 0).item() == patch


def test_rollout_of_identity_is_identity_and_rows_sum_to_one() -> None:
    tokens = 5
    eye = torch.eye(tokens).expand(1, 2, tokens, tokens)
    torch.testing.assert_close(attention_rollout([eye, eye, eye])[0], torch.eye(tokens, dtype=torch.float64))
    random = [torch.rand(2, 3, tokens, tokens).softmax(-1) for _ in range(4)]
    rows = attention_rollout(random).sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows))


def test_rollout_matches_hand_computed_two_layer_example() -> None:
    # 2 tokens, 2 heads.  Layer 1 heads: [[1,0],[0,1]] and [[0,1],[1,0]] -> mean [[.5,.5],[.5,.5]];
    # + I, renormalise -> [[.75,.25],[.25,.75]].  Layer 2 heads both [[0,1],[0,1]] -> + I -> [[.5,.5],[0,1]].
    # Rollout = L2 @ L1 = [[.5*.75+.5*.25, .5*.25+.5*.75], [.25, .75]] = [[.5, .5], [.25, .75]].
    layer1 = torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]])[None]
    layer2 = torch.tensor([[[0.0, 1.0], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]])[None]
    expected = torch.tensor([[0.5, 0.5], [0.25, 0.75]], dtype=torch.float64)
    torch.testing.assert_close(attention_rollout([layer1, layer2])[0], expected)


def test_rollout_map_reads_class_row_or_mean_of_patches() -> None:
    rollout = torch.arange(25, dtype=torch.float64).reshape(1, 5, 5)
    torch.testing.assert_close(
        rollout_map(rollout, (2, 2), 1)[0], torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    )
    gap = torch.arange(16, dtype=torch.float64).reshape(1, 4, 4)
    torch.testing.assert_close(rollout_map(gap, (2, 2), 0)[0], gap[0].mean(0).reshape(2, 2))
