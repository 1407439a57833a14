"""ops.add_rms_norm_linear (linear.cu linear_tma_norm_kernel): the add_rms_norm folded into the
bf16-x GEMV after it must equal add_rms_norm (bf16 out) then linear / linear_swiglu bit for bit,
with the residual sum in residual_out and the residual left as it was. Needs sm_90."""
from __future__ import annotations

import numpy as np
import pytest
from cuda_testutil import assert_same_bits, cp, dev, host, poisoned, randn, weight_pair

from ninfer import ops
from ninfer.core.dtypes import DType
from ninfer.kernels_cuda import linear as klinear
from ninfer.kernels_cuda import norm as knorm

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _sm90():
    if not klinear.tma_ok(16):
        pytest.skip("the bf16-x GEMV needs sm_90")


def _run(rng, n, k, m, *, swiglu, bf16_out, norm_dtype):
    """(got, want) tuples: (out, residual_out or the in-place residual, residual after)."""
    res0, delta = randn(rng, (n, k), 2.0), dev(randn(rng, (n, k)))
    _, nw = weight_pair(rng, (k,), norm_dtype, scale=0.3)
    _, w = weight_pair(rng, ((2 * m if swiglu else m), k), DType.BFLOAT16, k ** -0.5)
    out_dtype = np.uint16 if bf16_out else np.float32

    def out_buf():
        return cp().full((n, m), 0xFFFF, np.uint16) if bf16_out else poisoned((n, m))

    residual, r_out, out = dev(res0), poisoned((n, k)), out_buf()
    assert ops.add_rms_norm_linear_applies(residual, nw, w, swiglu=swiglu)
    ops.add_rms_norm_linear(residual, delta, nw, 1e-6, w, out, residual_out=r_out,
                            swiglu=swiglu)
    got = (out, r_out, residual)

    ref_res, x, ref_out = dev(res0), cp().full((n, k), 0xFFFF, np.uint16), out_buf()
    ops.add_rms_norm(ref_res, delta, nw, 1e-6, x)
    if swiglu:
        ops.linear_swiglu(x, w, ref_out)
    else:
        ops.linear(x, w, ref_out)
    assert ref_out.dtype == out_dtype
    return got, (ref_out, ref_res, dev(res0))


# K: norm_kernel orders of T 256 (block_sum; NV 4 and 8), 512 and 640 (block_sum_tree; 640: more
# norm warps than the 16 consumers) and 64 (T 64, NV 1: a tiny model's hidden size)
@pytest.mark.parametrize("k", [64, 1024, 2048, 4096, 5120])
@pytest.mark.parametrize("swiglu,bf16_out", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("norm_dtype", [DType.BFLOAT16, DType.FLOAT32])
def test_add_rms_norm_linear_equals_two_ops_bitwise(rng, k, swiglu, bf16_out, norm_dtype):
    nv, threads, _ = knorm.launch_shape(k)
    assert 1 <= nv <= klinear.NORM_FOLD_STEPS, (k, nv, threads)
    for n in (1, 2, 5, 8):
        m = 200 if swiglu else 136  # partial row tiles
        got, want = _run(rng, n, k, m, swiglu=swiglu, bf16_out=bf16_out, norm_dtype=norm_dtype)
        what = f"n={n} k={k} swiglu={swiglu} bf16_out={bf16_out} norm={norm_dtype.value}"
        assert np.isfinite(host(want[1])).all(), what
        for a, b, label in zip(got, want, ("out", "residual sum", "residual"), strict=True):
            assert_same_bits(a, b, f"{label}: {what}")


def test_add_rms_norm_linear_launch_name_and_rejections(rng):
    """One launch named linear_norm; N > 8 rows, an f32 weight and the CPU are refused."""
    from cuda_testutil import launch_names

    n, k, m = 3, 1024, 64
    residual, delta = dev(randn(rng, (n, k))), dev(randn(rng, (n, k)))
    _, nw = weight_pair(rng, (k,), DType.BFLOAT16)
    _, w = weight_pair(rng, (m, k), DType.BFLOAT16, k ** -0.5)
    with launch_names(klinear, attrs=("launch", "launch_dependent")) as names:
        ops.add_rms_norm_linear(residual, delta, nw, 1e-6, w, poisoned((n, m)),
                                residual_out=poisoned((n, k)))
    assert names == ["linear_norm"], names
    big = dev(randn(rng, (9, k)))
    assert not ops.add_rms_norm_linear_applies(big, nw, w)
    with pytest.raises(ValueError, match="no folded-norm GEMV"):
        ops.add_rms_norm_linear(big, big, nw, 1e-6, w, poisoned((9, m)),
                                residual_out=poisoned((9, k)))
    _, w32 = weight_pair(rng, (m, k), DType.FLOAT32)
    assert not ops.add_rms_norm_linear_applies(residual, nw, w32)
