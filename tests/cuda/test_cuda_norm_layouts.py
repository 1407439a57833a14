"""norm_kernel's two layouts of one reduction order: small rows held by one warp (several rows
per block) give bitwise the results of one block per row, and a row's result does not depend on
the other rows of the launch (batch invariance)."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer import envs
from ninfer.kernels_cuda import norm as knorm

from ninfer.ops import reference as ref

from cuda_testutil import (DTYPES, assert_close, assert_same_bits, dev, poisoned, randn,
                           rows_view, weight_pair)

gpu = pytest.mark.gpu

# D of every warp-per-row shape (T = 64, 128, 128, 256, 256) and block shapes around them
WARP_DIMS = [37, 100, 128, 129, 256]
BLOCK_DIMS = [257, 4096, 5120]


def test_launch_shapes_cover_every_dim():
    """Every D maps to a declared instance (every NINFER_NORM_MAX_NV); a warp holds at most
    MAX_WARP_VALUES per lane."""
    shapes = {knorm.launch_shape(d, m) for d in range(1, 20000) for m in envs.NORM_MAX_NV}
    assert shapes == set(knorm._SHAPES)
    for nv, t, rb in shapes:
        assert rb == 1 or (nv > 0 and (t // 32) * nv <= knorm.MAX_WARP_VALUES)
    assert knorm.launch_shape(128) == (1, 128, knorm.WARP_ROWS)
    assert knorm.launch_shape(4096, 16) == (16, 256, 1)
    assert knorm.launch_shape(4096, 8) == (8, 512, 1)
    assert knorm.launch_shape(4096, 4) == (4, 1024, 1)
    assert knorm.launch_shape(5120, 8) == (8, 640, 1)
    assert knorm.launch_shape(5120, 16) == (8, 1024, 1)
    assert knorm.launch_shape(256, 4) == (1, 256, knorm.WARP_ROWS)


def _operands(rng, mode, n, heads, dim, dtype):
    """(x, launch kwargs but out, host residual or None) for `mode` over rows of D = dim:
    x f32[n, heads, dim] with strided rows (ADD_RMS_ZC: [n * heads, dim] and a residual)."""
    if mode == knorm.ADD_RMS_ZC:
        x = dev(randn(rng, (n * heads, dim)))
    else:
        x = rows_view(rng, (n, heads * dim), pad=5)[1].reshape(n, heads, dim)
    kw = dict(eps=1e-6)
    if mode == knorm.L2:
        kw["scale"] = 0.7
    else:
        kw["weight"] = weight_pair(rng, (dim,), dtype, scale=0.3)[1]
    if mode == knorm.GATED:
        kw["z"] = rows_view(rng, (n, heads * dim), pad=3)[1].reshape(n, heads, dim)
    res0 = randn(rng, x.shape) if mode == knorm.ADD_RMS_ZC else None
    return x, kw, res0


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", [knorm.RMS, knorm.RMS_ZC, knorm.GATED, knorm.L2,
                                  knorm.ADD_RMS_ZC])
@pytest.mark.parametrize("dim", WARP_DIMS)
def test_warp_rows_equal_block_rows(rng, dtype, mode, dim):
    n, heads = 13, 3  # 39 rows: not a multiple of WARP_ROWS
    x, kw, res0 = _operands(rng, mode, n, heads, dim, dtype)
    outs, residuals = [], []
    for reference in (False, True):
        out = poisoned(x.shape)
        residual = dev(res0) if res0 is not None else None
        knorm._launch(mode, x, out, residual=residual, reference_layout=reference, **kw)
        outs.append(out)
        residuals.append(residual)
    assert np.isfinite(outs[0].get()).all()
    assert_same_bits(outs[0], outs[1], f"mode {mode} D={dim}")
    if res0 is not None:
        assert_same_bits(residuals[0], residuals[1], "residual")


@gpu
@pytest.mark.parametrize("mode", [knorm.RMS_ZC, knorm.GATED, knorm.L2, knorm.ADD_RMS_ZC])
@pytest.mark.parametrize("dim", WARP_DIMS + BLOCK_DIMS)
def test_row_alone_equals_row_in_batch(rng, mode, dim):
    n, heads = 11, 2
    x, kw, res0 = _operands(rng, mode, n, heads, dim, DTYPES[1])
    full = poisoned(x.shape)
    residual = dev(res0) if res0 is not None else None
    knorm._launch(mode, x, full, residual=residual, **kw)
    for i in (0, 6, n - 1):
        part_kw = dict(kw)
        if "z" in kw:
            part_kw["z"] = kw["z"][i:i + 1]
        one = poisoned((1,) + x.shape[1:])
        res_one = dev(res0[i:i + 1]) if res0 is not None else None
        knorm._launch(mode, x[i:i + 1], one, residual=res_one, **part_kw)
        assert_same_bits(one, full[i:i + 1], f"row {i}")


@gpu
@pytest.mark.parametrize("dim", [64, 128, 256])
def test_warp_rows_gated_vs_float64(rng, dim):
    """The GDN output norm shape (a warp per head row) against the float64 oracle."""
    n, hv = 9, 5
    x_h = randn(rng, (n, hv, dim))
    z_h, z = rows_view(rng, (n, hv * dim), pad=4)
    w_h, w = weight_pair(rng, (dim,), DTYPES[1])
    out = poisoned((n, hv, dim))
    knorm.gated_rms_norm(dev(x_h), z.reshape(n, hv, dim), w, 1e-6, out)
    assert_close(out, ref.gated_rms_norm(x_h, z_h.reshape(n, hv, dim), w_h, 1e-6))
