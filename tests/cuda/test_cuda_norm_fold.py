"""The norm fold on the GPU (NINFER_NORM_FOLD; linear.cu TMA_IO_RESID_NORM / TMA_IO_ROW_NORM):
a Qwen RMSNorm carried by the GEMVs around it instead of a norm launch.

Checked, on fresh random inputs with poisoned outputs (NaN / 0xFFFF):
- the producer (`linear_residual_norm`): the residual gains x @ W^T (float64 oracle), out is
  bf16(residual * gain) of the stored residual, bitwise, and parts[n, b] is the sum of r^2 over
  row block b's rows (tiles b, b + P, ...; float64), columns past P untouched; for every x layout
  (x in registers, 1..5 stages; per stage in tile groups) and a partial last tile;
- the consumers (`linear` / `linear_swiglu` with `row_norm`): rows divided by
  sqrt(sum(parts[n]) / dim + eps) (float64; the SwiGLU before its silu, out rounded to bf16);
- every output row alone equals that row in a batch of 8 (batch invariance), bitwise;
- producer then consumer against add_rms_norm then linear (bf16 rounding apart: ~1e-2), and
  both refused where the fold does not apply;
- the router's `normed_out` (TMA_IO_NORM_X): bf16(x / rms) bitwise, the rms in the kernel's f32
  order, for 1, 17 and 132 blocks;
- the producer's prefetch build (NORM_FOLD_PREFETCH) gives the default build's bits.
"""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.core.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from ninfer.errors import InvalidInput
from ninfer.kernels_cuda import linear as klinear
from ninfer.ops import reference as ref
from ninfer.ops.linear import RowNorm

from cuda_testutil import assert_close, assert_same_bits, cp, dev, host, poisoned

pytestmark = pytest.mark.gpu

EPS = 1e-6


@pytest.fixture(autouse=True)
def bf16_x(monkeypatch):
    """The fold rides on the bf16-x GEMV (NINFER_GEMV_BF16_X=1, the default)."""
    monkeypatch.setattr(klinear, "GEMV_BF16_X", True)


def _bits(rng, shape, scale=1.0):
    return f32_to_bf16_bits((rng.standard_normal(shape) * scale).astype(np.float32))


def _weight(rng, m, k):
    """bf16 bits [m, k] on the device, rows 16-byte aligned, NaN bits past K."""
    stride = -(-k // 8) * 8 + 8
    full = np.full((m, stride), 0x7FC0, dtype=np.uint16)
    full[:, :k] = _bits(rng, (m, k), k ** -0.5)
    return dev(full)[:, :k]


def _x(rng, n, k):
    """x as bf16 bits [n, k] (C-contiguous) on the device and its values."""
    vals = _bits(rng, (n, k), 2.0)
    return dev(vals), bf16_bits_to_f32(vals)


def _produce(x_d, w_d, resid_h, gain_h, extra_cols=3):
    """linear_residual_norm on fresh device copies; returns (residual, out, parts) on the host
    (parts with `extra_cols` poisoned columns past P, checked untouched)."""
    n, m = x_d.shape[0], w_d.shape[0]
    resid = dev(resid_h.copy())
    out = cp().full((n, m), 0xFFFF, np.uint16)  # bf16 NaN bits
    p = klinear.residual_norm_parts(w_d)
    parts = poisoned((n, p + extra_cols))
    klinear.linear_residual_norm(x_d, w_d, resid, dev(gain_h), out, parts)
    return host(resid), host(out), host(parts)


def _block_sums(r: np.ndarray, p: int) -> np.ndarray:
    """float64 sums of r^2 per row block: block b holds the 16-row tiles b, b + p, ..."""
    n, m = r.shape
    tile_block = (np.arange(m) // 16) % p
    out = np.zeros((n, p))
    for b in range(p):
        out[:, b] = (r[:, tile_block == b].astype(np.float64) ** 2).sum(axis=1)
    return out


@pytest.mark.parametrize("m, k", [
    (301, 1040), (4096, 4096), (1000, 5120), (4096 + 48, 2064),  # x in registers (2..5 stages)
    (733, 12288), (4096, 6144 + 48),  # x per stage (tile groups)
])
def test_producer_vs_float64(rng, m, k):
    w_d = _weight(rng, m, k)
    w_h = bf16_bits_to_f32(host(w_d))
    gain = (1.0 + rng.standard_normal(m) * 0.1).astype(np.float32)
    p = klinear.residual_norm_parts(w_d)
    assert p == min(-(-m // 16), cp().cuda.Device().attributes["MultiProcessorCount"])
    for n in (1, 3, 8):
        x_d, x_h = _x(rng, n, k)
        resid_h = rng.standard_normal((n, m)).astype(np.float32)
        r, out, parts = _produce(x_d, w_d, resid_h, gain)
        want_r = resid_h.astype(np.float64) + ref.linear(x_h, w_h)
        assert_close(r, want_r, what=f"residual m={m} k={k} n={n}")
        assert_same_bits(out, f32_to_bf16_bits(r * gain), f"out m={m} k={k} n={n}")
        assert_close(parts[:, :p], _block_sums(r, p), what=f"parts m={m} k={k} n={n}")
        assert np.isnan(parts[:, p:]).all(), "columns past P were written"


@pytest.mark.parametrize("m, k", [(733, 12288), (4096, 4096), (12672 + 8, 1024)])
def test_producer_prefetch_gives_the_same_bits(rng, monkeypatch, m, k):
    """NINFER_NORM_FOLD_PREFETCH (linear.cu NORM_FOLD_PREFETCH: the residual and gain elements
    of a block's first 4 tiles loaded right after its PDL wait): the default build's bits, for
    blocks of 1, 2 and 6 tiles (the last two not prefetched)."""
    w_d = _weight(rng, m, k)
    gain = (1.0 + rng.standard_normal(m) * 0.1).astype(np.float32)
    for n in (1, 8):
        x_d, _ = _x(rng, n, k)
        resid_h = rng.standard_normal((n, m)).astype(np.float32)
        monkeypatch.setattr(klinear, "NORM_FOLD_PREFETCH", False)
        want = _produce(x_d, w_d, resid_h, gain)
        monkeypatch.setattr(klinear, "NORM_FOLD_PREFETCH", True)
        got = _produce(x_d, w_d, resid_h, gain)
        for a, b, what in zip(got, want, ("residual", "out", "parts")):
            assert_same_bits(a, b, f"{what} m={m} k={k} n={n}")


@pytest.mark.parametrize("k", [1024, 4096, 12288])
def test_producer_rows_are_batch_invariant(rng, k):
    m = 4096 + 16
    w_d = _weight(rng, m, k)
    gain = (1.0 + rng.standard_normal(m) * 0.1).astype(np.float32)
    x_d, _ = _x(rng, 8, k)
    resid_h = rng.standard_normal((8, m)).astype(np.float32)
    batch = _produce(x_d, w_d, resid_h, gain)
    for i in (0, 5, 7):
        alone = _produce(x_d[i:i + 1], w_d, resid_h[i:i + 1], gain)
        for got, want, what in zip(alone, batch, ("residual", "out", "parts")):
            assert_same_bits(got, want[i:i + 1], f"{what} row {i} k={k}")


def _consume(x_d, w_d, parts_h, dim, *, swiglu):
    n = x_d.shape[0]
    m = w_d.shape[0] // 2 if swiglu else w_d.shape[0]
    norm = RowNorm(dev(parts_h), dim, EPS)
    if swiglu:
        out = cp().full((n, m), 0xFFFF, np.uint16)
        klinear.linear_swiglu(x_d, w_d, out, row_norm=norm)
        return bf16_bits_to_f32(host(out))
    out = poisoned((n, m))
    klinear.linear(x_d, w_d, out, row_norm=norm)
    return host(out)


@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("k, p", [(1040, 57), (4096, 132), (5120, 200), (12288, 1), (2064, 256)])
def test_consumer_vs_float64(rng, swiglu, k, p):
    m = 147 if swiglu else 301
    w_d = _weight(rng, 2 * m if swiglu else m, k)
    w_h = bf16_bits_to_f32(host(w_d))
    dim = 4096
    for n in (1, 3, 8):
        x_d, x_h = _x(rng, n, k)
        parts = (rng.random((n, p)) * 3.0 * dim / p + 0.1).astype(np.float32)
        denom = np.sqrt(parts.astype(np.float64).sum(axis=1, keepdims=True) / dim + EPS)
        y = ref.linear(x_h, w_h) / denom
        got = _consume(x_d, w_d, parts, dim, swiglu=swiglu)
        if swiglu:  # the activation rounded to bf16
            assert_close(got, ref.swiglu(y), tol=8e-3, what=f"swiglu k={k} p={p} n={n}")
        else:
            assert_close(got, y, what=f"linear k={k} p={p} n={n}")


@pytest.mark.parametrize("swiglu", [False, True])
def test_consumer_rows_are_batch_invariant(rng, swiglu):
    k, m, p = 4096, 301, 132
    w_d = _weight(rng, 2 * m if swiglu else m, k)
    x_d, _ = _x(rng, 8, k)
    parts = (rng.random((8, p)) * 50.0 + 0.1).astype(np.float32)
    batch = _consume(x_d, w_d, parts, k, swiglu=swiglu)
    for i in (0, 3, 7):
        assert_same_bits(_consume(x_d[i:i + 1], w_d, parts[i:i + 1], k, swiglu=swiglu),
                         batch[i:i + 1], f"row {i}")


def _denominators(parts: np.ndarray, dim: int) -> np.ndarray:
    """The consumer's rms per row, in its f32 order: lane l sums parts[j] for j = l, l + 32, ...
    in order, the warp butterfly (xor 16, 8, 4, 2, 1) adds the lanes, then sqrt(sum / dim +
    eps), every step rounded to f32."""
    n, p = parts.shape
    lanes = np.zeros((n, 32), np.float32)
    for j in range(p):
        lanes[:, j % 32] += parts[:, j]
    for o in (16, 8, 4, 2, 1):
        lanes = lanes + lanes[:, np.arange(32) ^ o]
    return np.sqrt(lanes[:, 0] / np.float32(dim) + np.float32(EPS))


@pytest.mark.parametrize("m", [16, 257, 4096])
def test_router_norm_writes_x_over_rms(rng, m):
    """`linear(..., row_norm=, normed_out=)` (TMA_IO_NORM_X, an MoE layer's router under
    NINFER_MOE_ROUTER_NORM): normed_out = bf16(x / rms) bitwise, with rms in the kernel's f32
    order, every column written whatever the grid (1, 17 and 132 blocks here); out is the same
    bits as without normed_out."""
    k, p = 2048, 132
    w_d = _weight(rng, m, k)
    for n in (1, 3, 8):
        x_d, x_h = _x(rng, n, k)
        parts = (rng.random((n, p)) * 30.0 + 0.1).astype(np.float32)
        out, xn = poisoned((n, m)), cp().full((n, k), 0xFFFF, np.uint16)
        klinear.linear(x_d, w_d, out, row_norm=RowNorm(dev(parts), k, EPS), normed_out=xn)
        denom = _denominators(parts, k)
        assert_same_bits(host(xn), f32_to_bf16_bits(x_h / denom[:, None]), f"xn m={m} n={n}")
        plain = poisoned((n, m))
        klinear.linear(x_d, w_d, plain, row_norm=RowNorm(dev(parts), k, EPS))
        assert_same_bits(out, plain, f"out with / without normed_out, m={m} n={n}")
        expect = ref.linear(x_h, bf16_bits_to_f32(host(w_d))) / denom[:, None]
        assert_close(out, expect, what=f"out m={m} n={n}")


def test_producer_then_consumer_is_the_norm_then_linear(rng):
    """o_proj-like producer (K 4096 -> H 2048), then a consumer linear and SwiGLU reading the
    folded norm, against f32 add_rms_norm (Qwen 1 + w) and the plain linears on its bf16 x."""
    n, k, h, inner = 8, 4096, 2048, 1536
    w_out = _weight(rng, h, k)
    w_in, w_gu = _weight(rng, 3 * h, h), _weight(rng, 2 * inner, h)
    norm_w = (rng.standard_normal(h) * 0.1).astype(np.float32)
    gain = (np.float32(1.0) + norm_w).astype(np.float32)
    x_d, x_h = _x(rng, n, k)
    resid_h = (rng.standard_normal((n, h)) * 4.0).astype(np.float32)
    resid = dev(resid_h.copy())
    xg = cp().full((n, h), 0xFFFF, np.uint16)
    parts = poisoned((n, klinear.residual_norm_parts(w_out)))
    klinear.linear_residual_norm(x_d, w_out, resid, dev(gain), xg, parts)
    norm = RowNorm(parts, h, EPS)
    y_in = poisoned((n, 3 * h))
    klinear.linear(xg, w_in, y_in, row_norm=norm)
    act = cp().full((n, inner), 0xFFFF, np.uint16)
    klinear.linear_swiglu(xg, w_gu, act, row_norm=norm)
    # the unfolded reference: r, then x = bf16(r / rms * (1 + w)), then the linears (float64)
    r = resid_h.astype(np.float64) + ref.linear(x_h, bf16_bits_to_f32(host(w_out)))
    normed = r / np.sqrt((r ** 2).mean(axis=1, keepdims=True) + EPS) * gain
    xb = bf16_bits_to_f32(f32_to_bf16_bits(normed.astype(np.float32)))
    assert_close(y_in, ref.linear(xb, bf16_bits_to_f32(host(w_in))), tol=1e-2, what="in_proj")
    assert_close(bf16_bits_to_f32(host(act)),
                 ref.swiglu(ref.linear(xb, bf16_bits_to_f32(host(w_gu)))), tol=2e-2,
                 what="gate_up")


def test_refusals(rng):
    w_d = _weight(rng, 64, 256)
    x_d, _ = _x(rng, 9, 256)  # 9 rows: past the GEMV's one column tile
    resid = dev(rng.standard_normal((9, 64)).astype(np.float32))
    out = cp().zeros((9, 64), np.uint16)
    parts = poisoned((9, 8))
    with pytest.raises(InvalidInput):
        klinear.linear_residual_norm(x_d, w_d, resid, dev(np.ones(64, np.float32)), out, parts)
    x1, _ = _x(rng, 1, 256)
    with pytest.raises(InvalidInput):  # parts narrower than the row blocks
        klinear.linear_residual_norm(x1, w_d, resid[:1], dev(np.ones(64, np.float32)),
                                     out[:1], poisoned((1, 2)))
    with pytest.raises(InvalidInput):  # the consumer's row norm needs a bf16 x
        klinear.linear(dev(rng.standard_normal((1, 256)).astype(np.float32)), w_d,
                       poisoned((1, 64)), row_norm=RowNorm(dev(np.ones((1, 4), np.float32)), 64,
                                                           EPS))
    with pytest.raises(InvalidInput):  # more parts than the kernel sums
        klinear.linear(x1, w_d, poisoned((1, 64)),
                       row_norm=RowNorm(dev(np.ones((1, 257), np.float32)), 64, EPS))
    norm = RowNorm(dev(np.ones((1, 4), np.float32)), 256, EPS)
    with pytest.raises(InvalidInput):  # normed_out without row_norm
        klinear.linear(x1, w_d, poisoned((1, 64)), normed_out=cp().zeros((1, 256), np.uint16))
    with pytest.raises(InvalidInput):  # normed_out over x
        klinear.linear(x1, w_d, poisoned((1, 64)), row_norm=norm, normed_out=x1)


@pytest.mark.parametrize("k", [1040, 4096, 5120, 12288])
def test_x_vec_loads_give_the_same_bits(rng, monkeypatch, k):
    """NINFER_GEMV_X_VEC in the fold's instances (TMA_IO_X_VEC; K = 12288 reads x per stage:
    NINFER_GEMV_X_VEC_STAGES): the producer (with and without its prefetch build) and both
    consumers give the 4-byte loads' bits."""
    monkeypatch.setattr(klinear, "GEMV_X_VEC_STAGES", True)
    m, p, dim = 301, 57, 4096
    w_d = _weight(rng, m, k)
    w2_d = _weight(rng, 2 * m, k)
    gain = (1.0 + rng.standard_normal(m) * 0.1).astype(np.float32)
    for n in (1, 3, 8):
        x_d, _ = _x(rng, n, k)
        resid_h = rng.standard_normal((n, m)).astype(np.float32)
        parts = (rng.random((n, p)) * 3.0 * dim / p + 0.1).astype(np.float32)
        runs = []
        for on, prefetch in ((False, False), (True, False), (True, True)):
            monkeypatch.setattr(klinear, "GEMV_X_VEC", on)
            monkeypatch.setattr(klinear, "NORM_FOLD_PREFETCH", prefetch)
            runs.append((*_produce(x_d, w_d, resid_h, gain),
                         _consume(x_d, w_d, parts, dim, swiglu=False),
                         _consume(x_d, w2_d, parts, dim, swiglu=True)))
        assert np.isfinite(runs[0][3]).all() and np.isfinite(runs[0][4]).all()
        for run, label in ((runs[1], "x_vec"), (runs[2], "x_vec + prefetch")):
            for a, b, what in zip(run, runs[0], ("residual", "out", "parts", "linear", "swiglu")):
                assert_same_bits(a, b, f"{label}: {what} k={k} n={n}")
