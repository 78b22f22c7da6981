"""Position embeddings (App. D.4) and their resampling (Sec. 3.2), each against an independent computation."""

from __future__ import annotations

import math

import pytest
import torch

from vitkit.models import posemb as pe


@pytest.mark.parametrize("method", ["bilinear", "bicubic"])
def test_resample_to_the_same_grid_is_identity(method):
    table = torch.randn(2, 1 + 4 * 5, 8)
    out = pe.resample_pos_embed(table, (4, 5), (4, 5), num_prefix_tokens=1, method=method)
    assert torch.equal(out, table)


def test_bilinear_resampling_keeps_a_linear_embedding_linear():
    """E[r, c] = r·a + c·b + e0 on a 4x4 grid resampled to 7x10: corners map to corners (scipy zoom order=1)."""
    a, b, e0 = torch.randn(6), torch.randn(6), torch.randn(6)
    old, new = (4, 4), (7, 10)
    rows, cols = torch.meshgrid(torch.arange(old[0]).float(), torch.arange(old[1]).float(), indexing="ij")
    grid = rows[..., None] * a + cols[..., None] * b + e0  # (4, 4, 6)
    cls = torch.randn(1, 1, 6)
    table = torch.cat([cls, grid.reshape(1, 16, 6)], dim=1)
    out = pe.resample_pos_embed(table, new, old, num_prefix_tokens=1, method="bilinear")
    assert out.shape == (1, 1 + 70, 6)
    assert torch.equal(out[:, :1], cls)  # the [class] row is kept aside
    r = torch.arange(new[0]).float() * (old[0] - 1) / (new[0] - 1)  # new row i sits at old row i·3/6
    c = torch.arange(new[1]).float() * (old[1] - 1) / (new[1] - 1)
    rr, cc = torch.meshgrid(r, c, indexing="ij")
    expected = rr[..., None] * a + cc[..., None] * b + e0
    torch.testing.assert_close(out[0, 1:], expected.reshape(70, 6), atol=1e-5, rtol=1e-5)


def test_resample_rejects_a_wrong_token_count():
    with pytest.raises(ValueError, match="expected 1 \\+ 4x4"):
        pe.resample_pos_embed(torch.zeros(1, 1 + 15, 4), (5, 5), (4, 4))


def test_relative_logits_equal_a_direct_loop():
    torch.manual_seed(1)
    q = torch.randn(2, 3, 5, 4)  # (B, k, T, D_h)
    table = torch.randn(2 * 5 - 1, 4)  # offsets -4 ... 4
    out = pe.relative_logits(q, table)
    expected = torch.empty(2, 3, 5, 5)
    for i in range(5):
        for j in range(5):
            expected[:, :, i, j] = q[:, :, i] @ table[i - j + 4]  # r_{i-j}: offset i - j stored at row i - j + T - 1
    torch.testing.assert_close(out, expected)


def test_relative_logits_resample_the_table_for_longer_sequences():
    table = torch.arange(5.0)[:, None].expand(5, 2)  # T0 = 3, value = offset + 2, linear in the offset
    q = torch.ones(1, 1, 4, 2)  # T = 4: 7 offsets, linearly resampled end to end
    out = pe.relative_logits(q, table)
    offsets = torch.arange(4)[:, None] - torch.arange(4)[None, :]  # i - j in -3 ... 3
    expected = 2 * (offsets + 3).float() * 4 / 6  # q . r = 2 · (row position (offset + 3) mapped onto 0 ... 4)
    torch.testing.assert_close(out[0, 0], expected)


def test_sincos_values_at_known_positions():
    grid, dim = (2, 3), 8  # D/4 = 2 frequencies: omega = 1, 1/10000
    table = pe.sincos_2d(grid, dim)
    assert table.shape == (1, 6, 8)
    for row in range(2):
        for col in range(3):
            x, y = float(col), float(row)
            expected = [math.sin(x), math.sin(x * 1e-4), math.cos(x), math.cos(x * 1e-4)]
            expected += [math.sin(y), math.sin(y * 1e-4), math.cos(y), math.cos(y * 1e-4)]
            torch.testing.assert_close(table[0, row * 3 + col], torch.tensor(expected))


def test_learned_2d_concatenates_column_and_row_embeddings():
    pos_x, pos_y = torch.randn(1, 3, 4), torch.randn(1, 2, 4)  # gw = 3 columns, gh = 2 rows, D/2 = 4
    table = pe.learned_2d(pos_x, pos_y, (2, 3))
    for row in range(2):
        for col in range(3):
            assert torch.equal(table[0, row * 3 + col], torch.cat([pos_x[0, col], pos_y[0, row]]))


def test_learned_2d_resamples_each_axis_linearly():
    pos_x = torch.arange(3.0)[None, :, None].expand(1, 3, 2)  # column c -> c
    pos_y = torch.zeros(1, 2, 2)
    table = pe.learned_2d(pos_x, pos_y, (2, 5))  # 3 columns -> 5: 0, 0.5, 1, 1.5, 2
    torch.testing.assert_close(table[0, :5, 0], torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0]))


def test_check_grid_names_a_valid_size():
    assert pe.check_grid(48, 32, 16) == (3, 2)
    with pytest.raises(ValueError, match="resize or crop it to 48x32"):
        pe.check_grid(50, 30, 16)
