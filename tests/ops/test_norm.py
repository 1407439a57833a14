"""rms_norm (both conventions, 2-D/3-D, strided, in place), add_rms_norm, gated_rms_norm, l2norm."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.core.dtypes import DType
from ninfer.ops import add_rms_norm, gated_rms_norm, l2norm_heads, rms_norm
from ninfer.ops import reference as ref

from .helpers import DTYPES, assert_close, assert_same_bits, poisoned, randn, rows_view, weight

EPS = 1e-6


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_centered", [True, False])
@pytest.mark.parametrize("n", [1, 3, 17])
def test_rms_norm_2d_strided(rng, dtype, zero_centered, n):
    x = rows_view(rng, (n, 45), scale=3.0)
    w = weight(rng, (45,), dtype, scale=0.5)
    out = poisoned((n, 45))
    rms_norm(x, w, EPS, out, zero_centered=zero_centered)
    assert_close(out, ref.rms_norm(x, w, EPS, zero_centered=zero_centered))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_per_head_in_place_on_interleaved_view(rng, dtype):
    # The q half of an interleaved [N, A, 2D] projection, normalised in place (q_norm).
    n, heads, d = 5, 3, 19
    qg = randn(rng, (n, heads, 2 * d))
    before = qg.copy()
    q = qg[:, :, :d]
    w = weight(rng, (d,), dtype, scale=0.3)
    expect = ref.rms_norm(before[:, :, :d], w, EPS, zero_centered=True)
    rms_norm(q, w, EPS, q, zero_centered=True)
    assert_close(q, expect)
    assert_same_bits(qg[:, :, d:], before[:, :, d:], "gate half untouched")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 17])
def test_add_rms_norm(rng, dtype, n):
    residual = randn(rng, (n, 33))
    x = randn(rng, (n, 33))
    w = weight(rng, (33,), dtype, scale=0.2)
    new_res, expect = ref.add_rms_norm(residual, x, w, EPS)
    out = poisoned((n, 33))
    add_rms_norm(residual, x, w, EPS, out)
    assert_close(residual, new_res)
    assert_close(out, expect)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 17])
def test_gated_rms_norm(rng, dtype, n):
    hv, dv = 3, 21
    x = randn(rng, (n, hv, dv))
    z = rows_view(rng, (n, hv * dv), pad=4).reshape(n, hv, dv) if n > 1 else randn(rng, (n, hv, dv))
    w = weight(rng, (dv,), dtype)
    out = poisoned((n, hv, dv))
    gated_rms_norm(x, z, w, EPS, out)
    assert_close(out, ref.gated_rms_norm(x, z, w, EPS))


@pytest.mark.parametrize("n", [1, 3, 17])
def test_l2norm_heads_on_conv_output_view(rng, n):
    hk, dk = 3, 20
    conv_out = randn(rng, (n, 2 * hk * dk + 7))
    k = conv_out[:, hk * dk: 2 * hk * dk].reshape(n, hk, dk)
    out = poisoned((n, hk, dk))
    scale = dk ** -0.5
    l2norm_heads(k, 1e-6, scale, out)
    assert_close(out, ref.l2norm_heads(k, 1e-6, scale))
    assert_close(np.linalg.norm(out, axis=-1), np.full((n, hk), scale), 1e-5)


def test_norm_checks(rng):
    w = weight(rng, (8,), DType.FLOAT32)
    x = randn(rng, (2, 8))
    with pytest.raises(ValueError, match="weight must have shape"):
        rms_norm(x, weight(rng, (9,), DType.FLOAT32), EPS, x, zero_centered=True)
    with pytest.raises(ValueError, match="2 or 3 dims"):
        rms_norm(x[0], w, EPS, x[0], zero_centered=True)
    with pytest.raises(ValueError, match="eps must be finite"):
        rms_norm(x, w, -1.0, x, zero_centered=True)
    with pytest.raises(TypeError, match="float16 is not supported"):
        rms_norm(x, weight(rng, (8,), DType.FLOAT32).__class__(
            np.zeros(8, np.float16), DType.FLOAT16), EPS, x, zero_centered=True)
