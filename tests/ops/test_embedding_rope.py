"""embedding (f32/bf16, id checks) and rope (partial NeoX, MRoPE axes, strided heads, in place)."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.ops import embedding, rope
from ninfer.ops import reference as ref

from .helpers import DTYPES, assert_close, assert_same_bits, poisoned, randn, weight


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 17])
def test_embedding_gathers_rows(rng, dtype, n):
    table = weight(rng, (29, 13), dtype)
    ids = rng.integers(0, 29, n).astype(np.int32)
    out = poisoned((n, 13))
    embedding(ids, table, out)
    assert_same_bits(out, ref.embedding(ids, table).astype(np.float32), "gathered rows")


def test_embedding_rejects_out_of_range_and_wrong_dtype(rng):
    table = weight(rng, (10, 4), DTYPES[0])
    with pytest.raises(ValueError, match="out of range"):
        embedding(np.array([3, 10], np.int32), table, np.zeros((2, 4), np.float32))
    with pytest.raises(TypeError, match="ids must be int32"):
        embedding(np.array([3, 1]), table, np.zeros((2, 4), np.float32))


def _inv_freq(rotary_dim: int, theta: float = 1e4) -> np.ndarray:
    return (1.0 / theta ** (np.arange(0, rotary_dim, 2) / rotary_dim)).astype(np.float32)


@pytest.mark.parametrize("n", [1, 3, 17])
def test_rope_partial_mrope_on_strided_heads(rng, n):
    heads, d, rot = 3, 22, 12
    qg = randn(rng, (n, heads, 2 * d))
    before = qg.copy()
    q = qg[:, :, :d]
    positions = rng.integers(0, 5000, (3, n)).astype(np.int32)  # distinct t, h, w rows
    inv_freq = _inv_freq(rot)
    freq_axis = (np.arange(rot // 2) % 3).astype(np.int32)
    expect = ref.rope(before[:, :, :d], positions, inv_freq, freq_axis)
    rope(q, positions, inv_freq, freq_axis)
    assert_close(q, expect)
    assert_same_bits(q[..., rot:], before[:, :, rot:d], "dims past R untouched")
    assert_same_bits(qg[:, :, d:], before[:, :, d:], "gate half untouched")


def test_rope_text_positions_equal_1d_rope(rng):
    # Text-only: all three position rows equal, so any axis map gives plain 1-D RoPE.
    n, heads, d = 7, 2, 16
    pos = np.arange(100, 100 + n, dtype=np.int32)
    x1 = randn(rng, (n, heads, d))
    x2 = x1.copy()
    inv_freq = _inv_freq(d)
    rope(x1, np.stack([pos] * 3), inv_freq, np.zeros(d // 2, np.int32))
    rope(x2, np.stack([pos] * 3), inv_freq, (np.arange(d // 2) % 3).astype(np.int32))
    assert_same_bits(x1, x2, "axis map irrelevant for text")


def test_rope_rejects_too_many_rotary_dims(rng):
    x = randn(rng, (2, 1, 8))
    with pytest.raises(ValueError, match="exceed head dim"):
        rope(x, np.zeros((3, 2), np.int32), _inv_freq(10), np.zeros(5, np.int32))
