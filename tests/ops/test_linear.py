"""linear: float64 oracle, the documented lane order (bitwise), batch invariance, operand checks."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.core.dtypes import DType, bf16_bits_to_f32
from ninfer.kernels_numba_cpu._dot import LANES
from ninfer.ops import linear
from ninfer.ops import reference as ref

from .helpers import DTYPES, assert_close, assert_same_bits, poisoned, randn, rows_view, weight


def _widened(w) -> np.ndarray:
    return bf16_bits_to_f32(w.data) if w.dtype is DType.BFLOAT16 else w.data


def _lane_dot_f32(x: np.ndarray, w: np.ndarray) -> np.float32:
    """The CPU dot order of docs/ops.md emulated with NumPy fp32 scalar/elementwise ops."""
    k_len = len(x)
    k_lanes = k_len - k_len % LANES
    prod = x * w  # fp32 products, each rounded
    acc = np.zeros(LANES, np.float32)
    for kb in range(0, k_lanes, LANES):
        acc = acc + prod[kb:kb + LANES]
    half = LANES // 2
    while half:
        acc = acc[:half] + acc[half:2 * half]
        half //= 2
    s = acc[0]
    for k in range(k_lanes, k_len):
        s = np.float32(s + prod[k])
    return s


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,m,k", [(1, 37, 45), (3, 8, 100), (17, 33, 64), (70, 9, 131)])
def test_linear_matches_float64(rng, dtype, n, m, k):
    x = rows_view(rng, (n, k))
    w = weight(rng, (m, k), dtype)
    out = poisoned((n, m))
    linear(x, w, out)
    assert_close(out, ref.linear(x, w))


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_follows_documented_lane_order(rng, dtype):
    x = randn(rng, (3, 2 * LANES + 7))
    w = weight(rng, (5, x.shape[1]), dtype)
    out = poisoned((3, 5))
    linear(x, w, out)
    wf = _widened(w)
    expect = np.array([[_lane_dot_f32(x[i], wf[j]) for j in range(5)] for i in range(3)])
    assert_same_bits(out, expect.astype(np.float32), "lane-order emulation")


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_is_batch_invariant(rng, dtype):
    n, m, k = 67, 21, 77  # crosses the 64-row block
    x = randn(rng, (n, k))
    w = weight(rng, (m, k), dtype)
    whole = poisoned((n, m))
    linear(x, w, whole)
    for i in (0, 13, 64, 66):
        one = poisoned((1, m))
        linear(x[i:i + 1], w, one)
        assert_same_bits(one[0], whole[i], f"row {i} alone vs in a batch of {n}")
    perm = rng.permutation(n)[:5]
    part = poisoned((5, m))
    linear(np.ascontiguousarray(x[perm]), w, part)
    assert_same_bits(part, whole[perm], "permuted subset")


def test_linear_output_column_does_not_depend_on_its_neighbours(rng):
    # Weight rows are taken in pairs; an odd offset moves every row to the other slot of a pair.
    x = randn(rng, (4, 50))
    w = weight(rng, (11, 50), DType.BFLOAT16)
    full = poisoned((4, 11))
    shifted = poisoned((4, 10))
    linear(x, w, full)
    linear(x, w.rows(1, 11), shifted)
    assert_same_bits(shifted, full[:, 1:], "weight-row offset")


def test_linear_rejects_bad_operands(rng):
    x = randn(rng, (2, 8))
    w = weight(rng, (3, 8), DType.FLOAT32)
    with pytest.raises(ValueError, match="weight must have shape"):
        linear(x, weight(rng, (3, 9), DType.FLOAT32), np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="x must be float32"):
        linear(x.astype(np.float64), w, np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="out must be C-contiguous"):
        linear(x, w, np.zeros((3, 2), np.float32).T)
    with pytest.raises(ValueError, match="last axis contiguous"):
        linear(randn(rng, (8, 2)).T, w, np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="weight must be a Weight"):
        linear(x, w.data, np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError, match="unsupported array type"):
        linear(x.tolist(), w, np.zeros((2, 3), np.float32))
