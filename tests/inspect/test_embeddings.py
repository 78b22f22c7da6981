"""Filter PCA (Figure 7 left) and position-embedding similarity (Figure 7 center)."""

from __future__ import annotations

import numpy as np
import torch

from vitkit.inspect.embeddings import filter_pca, position_similarity


def test_filter_pca_reconstructs_and_orders_variance() -> None:
    weight = torch.randn(32, 3, 4, 4)  # D=32 filters of C x P x P = 48 pixels: 32 = min(D, C*P*P) axes
    pca = filter_pca(weight, num_components=48)
    assert pca.components.shape == (32, 3, 4, 4)
    torch.testing.assert_close(pca.reconstruct().float(), weight, atol=1e-5, rtol=0)
    ratio = pca.explained_variance_ratio
    assert torch.all(ratio[:-1] >= ratio[1:]) and abs(float(ratio.sum()) - 1.0) < 1e-9
    flat = pca.components.flatten(1)
    torch.testing.assert_close(flat @ flat.T, torch.eye(32, dtype=torch.float64))  # orthonormal axes


def test_filter_pca_finds_a_planted_direction() -> None:
    direction = torch.zeros(1, 4, 4)
    direction[0, :, :2] = 1.0  # a left/right edge filter
    scores = torch.linspace(-3, 3, 16)
    weight = scores[:, None, None, None] * direction[None] + 0.01 * torch.randn(16, 1, 4, 4)
    top = filter_pca(weight, num_components=3).components[0]
    cosine = abs(float((top.flatten() @ direction.flatten().double()) / direction.norm()))
    assert cosine > 0.999


def test_position_similarity_of_row_column_embedding() -> None:
    gh, gw = 3, 4
    # e(r, c) = [onehot(r), onehot(c)]: same patch 1, same row or same column 0.5, otherwise 0.
    table = torch.zeros(gh * gw, gh + gw)
    for r in range(gh):
        for c in range(gw):
            table[r * gw + c, r] = 1.0
            table[r * gw + c, gh + c] = 1.0
    sim = position_similarity(table, (gh, gw)).numpy()
    expected = np.zeros((gh, gw, gh, gw))
    for r, c, r2, c2 in np.ndindex(gh, gw, gh, gw):
        expected[r, c, r2, c2] = 0.5 * (r == r2) + 0.5 * (c == c2)
    np.testing.assert_allclose(sim, expected, atol=1e-12)
    # the paper's reading: patches in the same row are more similar than patches elsewhere
    assert sim[1, 1, 1, 3] > sim[1, 1, 2, 3]
