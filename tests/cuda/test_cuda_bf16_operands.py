"""bf16 operands of the cuBLAS prefill GEMMs written by the producing kernels.

Each producer (rms_norm, add_rms_norm, gated_rms_norm, sigmoid_mul, swiglu) given a uint16 `out`
must write exactly RNE(its own f32 result), bit for bit, and `linear` given that bf16 x must
give bitwise the result of the f32 x (which it rounds the same way before cuBLAS)."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer import ops
from ninfer.core.dtypes import DType, f32_to_bf16_bits
from ninfer.errors import InvalidInput
from ninfer.kernels_cuda import linear as klinear
from ninfer.kernels_cuda import norm as knorm
from ninfer.ops.linear import reads_bf16_x

from cuda_testutil import (DTYPES, assert_same_bits, cp, dev, host, poisoned, randn, rows_view,
                           weight_pair)

pytestmark = pytest.mark.gpu

BF16_POISON = 0xFFFF  # a NaN pattern no finite result rounds to


def poisoned_bf16(shape):
    return cp().full(shape, BF16_POISON, dtype=np.uint16)


def assert_rne_of(bits, f32, what: str) -> None:
    """bits (uint16, device) == round-to-nearest-even of the f32 result, element for element."""
    f = host(f32)
    assert np.isfinite(f).all(), f"{what}: f32 result not finite (unwritten?)"
    assert_same_bits(bits, f32_to_bf16_bits(np.ascontiguousarray(f)), what)


# hidden sizes covering every norm_kernel NV variant: 37 (64 threads, NV 1), 1000 (NV 4),
# 2049 (NV 16, a partial last step), 4096 (NV 16), 5120 (1024 threads, NV 8), 9001 (strided loop)
HIDDEN = [37, 1000, 2049, 4096, 5120, 9001]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_centered", [True, False])
@pytest.mark.parametrize("hidden", HIDDEN)
def test_rms_norm_bf16_out(rng, dtype, zero_centered, hidden):
    n = 13
    _, x = rows_view(rng, (n, hidden), pad=7)
    _, w = weight_pair(rng, (hidden,), dtype, scale=0.3)
    f32 = poisoned((n, hidden))
    ops.rms_norm(x, w, 1e-6, f32, zero_centered=zero_centered)
    bits = poisoned_bf16((n, hidden))
    ops.rms_norm(x, w, 1e-6, bits, zero_centered=zero_centered)
    assert_rne_of(bits, f32, "rms_norm")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", HIDDEN)
def test_add_rms_norm_bf16_out(rng, dtype, hidden):
    n = 11
    res0, x = randn(rng, (n, hidden)), dev(randn(rng, (n, hidden)))
    _, w = weight_pair(rng, (hidden,), dtype, scale=0.3)
    res_f32, f32 = dev(res0), poisoned((n, hidden))
    ops.add_rms_norm(res_f32, x, w, 1e-6, f32)
    res_bf16, bits = dev(res0), poisoned_bf16((n, hidden))
    ops.add_rms_norm(res_bf16, x, w, 1e-6, bits)
    assert_rne_of(bits, f32, "add_rms_norm out")
    assert_same_bits(res_bf16, res_f32, "add_rms_norm residual")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hv,dv", [(5, 128), (3, 64), (2, 300)])
def test_gated_rms_norm_bf16_out(rng, dtype, hv, dv):
    n = 9
    x = dev(randn(rng, (n, hv, dv)))
    _, z = rows_view(rng, (n, hv * dv), pad=4)
    z = z.reshape(n, hv, dv)
    _, w = weight_pair(rng, (dv,), dtype)
    f32 = poisoned((n, hv, dv))
    ops.gated_rms_norm(x, z, w, 1e-6, f32)
    bits = poisoned_bf16((n, hv, dv))
    ops.gated_rms_norm(x, z, w, 1e-6, bits)
    assert_rne_of(bits, f32, "gated_rms_norm")


@pytest.mark.parametrize("n,m", [(1, 5), (13, 333), (21, 4099), (7, 4096)])  # 4096: 4-wide
def test_sigmoid_mul_and_swiglu_bf16_out(rng, n, m):
    x = dev(randn(rng, (n, m), 3.0))
    _, gate = rows_view(rng, (n, m), pad=3, scale=3.0)
    f32 = poisoned((n, m))
    ops.sigmoid_mul(x, gate, f32)
    bits = poisoned_bf16((n, m))
    ops.sigmoid_mul(x, gate, bits)
    assert_rne_of(bits, f32, "sigmoid_mul")

    gu = dev(randn(rng, (n, 2 * m), 3.0))
    f32 = poisoned((n, m))
    ops.swiglu(gu, f32)
    bits = poisoned_bf16((n, m))
    ops.swiglu(gu, bits)
    assert_rne_of(bits, f32, "swiglu")


def test_bf16_out_rejections(rng):
    x = dev(randn(rng, (9, 64)))
    with pytest.raises(InvalidInput, match="out"):  # L2 has no bf16 variant
        knorm.l2norm_heads(x.reshape(9, 2, 32), 1e-6, 1.0, poisoned_bf16((9, 2, 32)))
    with pytest.raises(ValueError, match="C-contiguous"):  # bf16 outs are packed
        ops.swiglu(dev(randn(rng, (9, 128))), poisoned_bf16((9, 80))[:, :64])


@pytest.mark.parametrize("n,k,m", [(9, 64, 40), (37, 1000, 300), (512, 4096, 1024),
                                   (130, 12288, 515)])
def test_linear_bf16_x_equals_f32_x(rng, n, k, m):
    """The cuBLAS path with x given as bf16 bits == the f32 x (converted by to_bf16 into the
    workspace), bitwise; both operands are packed rows K apart at 16-byte aligned bases."""
    x_h = randn(rng, (n, k), 2.0)
    _, w = weight_pair(rng, (m, k), DType.BFLOAT16, scale=k ** -0.5)
    ws = cp().zeros(n * k, dtype=np.uint16)
    want = poisoned((n, m))
    ops.linear(dev(x_h), w, want, workspace=ws)
    x_bits = dev(f32_to_bf16_bits(x_h))
    assert_same_bits(ws.reshape(n, k), x_bits, "to_bf16 of x")
    got = poisoned((n, m))
    ops.linear(x_bits, w, got)
    assert np.isfinite(host(got)).all()
    assert_same_bits(got, want, f"linear n={n} k={k} m={m}")


def test_linear_bf16_x_needs_the_cublas_path(rng, monkeypatch):
    """Without NINFER_GEMV_BF16_X only the cuBLAS path reads a bf16 x (the bf16-x GEMV has its
    own tests: test_cuda_gemv_bf16_x.py)."""
    monkeypatch.setattr(klinear, "GEMV_BF16_X", False)
    k, m = 64, 40
    _, w16 = weight_pair(rng, (m, k), DType.BFLOAT16)
    _, w32 = weight_pair(rng, (m, k), DType.FLOAT32)
    out = poisoned((9, m))
    bits = dev(f32_to_bf16_bits(randn(rng, (9, k))))
    with pytest.raises(TypeError, match="cuBLAS"):
        ops.linear(bits[:8], w16, out[:8])  # GEMV rows
    with pytest.raises(TypeError, match="cuBLAS"):
        ops.linear(bits, w16, out, batch_invariant=True)
    with pytest.raises(TypeError, match="cuBLAS"):
        ops.linear(bits, w32, out)
    with pytest.raises(InvalidInput, match="x"):  # the launcher checks on its own, too
        klinear.linear(bits[:8], w16, out[:8])
    assert reads_bf16_x(9, w16) and not reads_bf16_x(8, w16)
    assert not reads_bf16_x(9, w16, batch_invariant=True) and not reads_bf16_x(9, w32)
