"""linear on the GPU: the GEMV kernel (aligned and unaligned K, strided x, f32/bf16 weights),
the cuBLAS prefill path, and batch invariance (a row alone == the same row in a batch, bitwise)."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer import ops
from ninfer.core.dtypes import DType, bf16_bits_to_f32, f32_to_bf16_bits
from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda import linear as klinear
from ninfer.ops import reference as ref

from cuda_testutil import (DTYPES, TOL_BF16_X, assert_close, assert_same_bits, cp, dev, host,
                           poisoned, rows_view, weight_pair)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("k", [1000, 333, 4096])
def test_gemv_vs_float64(rng, dtype, n, k):
    m = 257
    x_h, x_d = rows_view(rng, (n, k), pad=8 if k % 8 == 0 else 5)
    w_h, w_d = weight_pair(rng, (m, k), dtype, scale=k ** -0.5)
    out = poisoned((n, m))
    ops.linear(x_d, w_d, out)
    assert_close(out, ref.linear(x_h, w_h))


@pytest.mark.parametrize("dtype", DTYPES)
def test_cublas_prefill_path(rng, dtype):
    n, k, m = 37, 512, 300
    x_h = (rng.standard_normal((n, k))).astype(np.float32)
    w_h, w_d = weight_pair(rng, (m, k), dtype, scale=k ** -0.5)
    out = poisoned((n, m))
    klinear.linear(dev(x_h), w_d, out)
    tol = TOL_BF16_X if dtype is DType.BFLOAT16 else 1e-5
    assert_close(out, ref.linear(x_h, w_h), tol)


@pytest.mark.parametrize("n,k,pad,offset", [
    (37, 512, 0, 0), (5, 4096, 12, 0), (3, 1001, 3, 0), (2, 12, 1, 0),
    (3, 64, 4, 1),        # base 4 bytes past a 16-byte boundary: scalar path
    (2, 70000, 0, 0),     # more than one pass of 64 column blocks
    (66000, 8, 0, 0),     # more rows than one grid's 65535
])
def test_to_bf16_rounds_like_numpy(rng, n, k, pad, offset):
    """The cuBLAS path's activation conversion: round to nearest even, bit for bit, on strided
    rows (vector path when K, the stride and the base allow 16-byte loads, else scalar)."""
    full = (rng.standard_normal((n, offset + k + pad)) * 3).astype(np.float32)
    full[0, offset: offset + 4] = [np.inf, -np.inf, 1e-40, -0.0]
    x = dev(full)[:, offset: offset + k]
    out = cp().full(n * k + 7, 0xFFFF, dtype=np.uint16)
    klinear.to_bf16(x, offset + k + pad, n, k, out)
    got = out.get()
    want = f32_to_bf16_bits(full[:, offset: offset + k]).reshape(-1)
    np.testing.assert_array_equal(got[: n * k], want)
    assert (got[n * k:] == 0xFFFF).all(), "wrote past N*K"


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_invariance(rng, dtype):
    n, k, m = 8, 2048, 129
    x_h = (rng.standard_normal((n, k))).astype(np.float32)
    _, w_d = weight_pair(rng, (m, k), dtype, scale=k ** -0.5)
    x_d = dev(x_h)
    batch = poisoned((n, m))
    klinear.linear(x_d, w_d, batch)
    for rows in ([0], [3, 4], [1, 2, 5, 6, 7]):
        part = poisoned((len(rows), m))
        klinear.linear(x_d[rows], w_d, part)
        assert_same_bits(part, batch[rows], f"rows {rows}")
    # N > 8 with batch_invariant=True: the same per-row values as the small calls
    big_h = (rng.standard_normal((21, k))).astype(np.float32)
    big_h[5] = x_h[2]
    big = poisoned((21, m))
    klinear.linear(dev(big_h), w_d, big, batch_invariant=True)
    assert_same_bits(big[5], batch[2], "row inside a 21-row batch")


def test_gemv_k_split_depends_on_k_only():
    assert [klinear.k_splits(k) for k in (512, 1024, 2048, 4096, 5120, 12288, 17408)] == \
        [1, 1, 2, 4, 5, 8, 8]


def test_workspace_is_used(rng):
    n, k, m = 16, 64, 40
    x_h = (rng.standard_normal((n, k))).astype(np.float32)
    w_h, w_d = weight_pair(rng, (m, k), DType.BFLOAT16)
    ws = cp().zeros(n * k + 3, dtype=np.uint16)
    out = poisoned((n, m))
    klinear.linear(dev(x_h), w_d, out, workspace=ws)
    assert int((ws[:n * k] != 0).sum()) > 0
    assert_close(out, ref.linear(x_h, w_h), TOL_BF16_X)


def test_mma_k_split_depends_on_k_only():
    assert [klinear.mma_splits(k) for k in (32, 512, 1000, 2048, 4096, 12288)] == \
        [1, 2, 4, 8, 16, 16]


@pytest.mark.parametrize("n", [1, 2, 5, 8, 11])
def test_tensor_core_gemv_rows_are_independent(rng, n):
    """bf16 weights take the mma kernel: every row of an n-row call (up to two 8-row tiles)
    equals the row computed alone, bitwise, and the float64 product within fp32 rounding."""
    k, m = 4096 + 96, 300  # a K tail of 3 steps past the splits, M not a multiple of 16
    x_h = (rng.standard_normal((n, k)) * 3.0).astype(np.float32)
    w_h, w_d = weight_pair(rng, (m, k), DType.BFLOAT16, scale=k ** -0.5)
    x_d = dev(x_h)
    out = poisoned((n, m))
    klinear.linear(x_d, w_d, out, batch_invariant=True)
    assert_close(out, ref.linear(x_h, w_h))
    for i in range(n):
        one = poisoned((1, m))
        klinear.linear(x_d[i:i + 1], w_d, one)
        assert_same_bits(one, out[i:i + 1], f"row {i} of {n}")


@pytest.mark.parametrize("n", [1, 3, 8])
def test_linear_swiglu_equals_linear_then_swiglu(rng, n):
    k, inner = 1000 + 24, 200  # a K tail, I not a multiple of 8
    x_h = (rng.standard_normal((n, k))).astype(np.float32)
    _, w_d = weight_pair(rng, (2 * inner, k), DType.BFLOAT16, scale=k ** -0.5)
    x_d = dev(x_h)
    gu = poisoned((n, 2 * inner))
    ops.linear(x_d, w_d, gu)
    ref_act = poisoned((n, inner))
    ops.swiglu(gu, ref_act)
    act = poisoned((n, inner))
    ops.linear_swiglu(x_d, w_d, act)
    assert_same_bits(act, ref_act, f"n={n}")


# linear_mma_rows_kernel (the default; NINFER_GEMV_ROWS=0 turns it off): row-contiguous weight
# reads staged through shared memory; must equal linear_mma_kernel bit for bit on every shape
# (same K split, fragments, mma order and reduction order), one block per tile or persistent.

def _strided_x(rng, n, k):
    """x f32 [n, k] on the device with NaN padding around each row; rows 16-byte aligned with a
    stride that is a multiple of 4 (what the mma kernels need)."""
    stride = -(-k // 4) * 4 + 8
    full = np.full((n, stride), np.nan, dtype=np.float32)
    full[:, 4:4 + k] = (rng.standard_normal((n, k)) * 3.0).astype(np.float32)
    return full[:, 4:4 + k], dev(full)[:, 4:4 + k]


def _padded_bf16_weight(rng, m, k):
    """bf16 bits [m, k] whose rows are 16-byte aligned and padded with NaN up to the stride: a
    kernel reading past K (and not zeroing) turns the result into NaN."""
    stride = -(-k // 8) * 8 + 8
    full = np.full((m, stride), 0x7FC0, dtype=np.uint16)
    full[:, :k] = f32_to_bf16_bits((rng.standard_normal((m, k)) * k ** -0.5).astype(np.float32))
    return dev(full)[:, :k]


def _mma(x_d, w_d, *, swiglu, rows, row_blocks=None):
    """One explicit launch of linear_mma_kernel (rows=False) or linear_mma_rows_kernel
    (row_blocks: blocks along the row tiles, fewer than the tiles = persistent; None: one per
    tile)."""
    n, k = x_d.shape
    m = w_d.shape[0] // 2 if swiglu else w_d.shape[0]
    tiles = -(-m // (8 if swiglu else 16))
    out = poisoned((n, m))
    klinear._launch_mma(x_d, C.row_stride(x_d, "x"), w_d, C.row_stride(w_d, "w"), out,
                        C.row_stride(out, "out"), m, k, n, swiglu=swiglu, rows=rows,
                        row_blocks=tiles if row_blocks is None else row_blocks, tma=False)
    return out


@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("k", [64, 1000, 1016, 4096, 4096 + 96, 12288,
                               333, 4100])  # the last two: K % 8 != 0 (a partial unit)
def test_gemv_rows_kernel_equals_mma_kernel_bitwise(rng, k, swiglu):
    m = 147 if swiglu else 301  # odd: a partial row tile
    w_d = _padded_bf16_weight(rng, 2 * m if swiglu else m, k)
    for n in list(range(1, 9)) + [11]:
        _, x_d = _strided_x(rng, n, k)
        want = _mma(x_d, w_d, swiglu=swiglu, rows=False)
        assert np.isfinite(host(want)).all(), f"n={n}: linear_mma_kernel output not finite"
        # one block per tile, then persistent launches (tiles walked with strides 3 and 1)
        for row_blocks in (None, 3, 1):
            got = _mma(x_d, w_d, swiglu=swiglu, rows=True, row_blocks=row_blocks)
            assert_same_bits(got, want, f"k={k} n={n} swiglu={swiglu} row_blocks={row_blocks}")


@pytest.mark.parametrize("swiglu", [False, True])
def test_gemv_rows_kernel_vs_float64(rng, swiglu):
    n, k, m = 5, 4096 + 96, 201
    rows_out = 2 * m if swiglu else m
    x_h, x_d = _strided_x(rng, n, k)
    w_h, w_d = weight_pair(rng, (rows_out, k), DType.BFLOAT16, scale=k ** -0.5)
    out = _mma(x_d, w_d.data, swiglu=swiglu, rows=True)
    want = ref.linear(x_h, w_h)
    assert_close(out, ref.swiglu(want) if swiglu else want)


def test_gemv_rows_flag_routes_linear_and_swiglu(rng, monkeypatch):
    """GEMV_ROWS (NINFER_GEMV_ROWS, read at import) switches both public entry points."""
    n, k, inner = 3, 2048, 96
    _, x_d = _strided_x(rng, n, k)
    w_d = _padded_bf16_weight(rng, 2 * inner, k)
    monkeypatch.setattr(klinear, "GEMV_TMA", False)
    monkeypatch.setattr(klinear, "GEMV_ROWS", True)
    monkeypatch.setattr(klinear, "GEMV_PERSIST", False)
    out = poisoned((n, 2 * inner))
    klinear.linear(x_d, w_d, out)
    act = poisoned((n, inner))
    klinear.linear_swiglu(x_d, w_d, act)
    assert_same_bits(out, _mma(x_d, w_d, swiglu=False, rows=True), "linear")
    assert_same_bits(act, _mma(x_d, w_d, swiglu=True, rows=True), "linear_swiglu")
    assert_same_bits(out, _mma(x_d, w_d, swiglu=False, rows=False), "linear vs mma kernel")
    # persistent grid (K = 4096: 16 splits, 2 blocks per SM) over more row tiles than blocks
    # (H200: 264 < 563)
    _, x4 = _strided_x(rng, n, 4096)
    big = _padded_bf16_weight(rng, 9001, 4096)
    monkeypatch.setattr(klinear, "GEMV_PERSIST", True)
    out2 = poisoned((n, 9001))
    klinear.linear(x4, big, out2)
    assert_same_bits(out2, _mma(x4, big, swiglu=False, rows=False), "persistent linear")


# linear_tma_kernel (NINFER_GEMV_TMA=1; sm_90, K % 16 == 0): weights streamed by bulk copies into
# a shared-memory ring. Not bitwise equal to the kernels above (another k pairing), but batch
# invariant: every output element's arithmetic depends on K alone, whatever N, the tile's other
# rows or the number of persistent blocks.

def _tma(x_d, w_d, *, swiglu, row_blocks=None, sk=None, consumers=None, ring_kib=None,
         x_regs=True, tile_group=None):
    n, k = x_d.shape
    m = w_d.shape[0] // 2 if swiglu else w_d.shape[0]
    out = poisoned((n, m))
    klinear._launch_tma(x_d, C.row_stride(x_d, "x"), w_d, C.row_stride(w_d, "w"), out,
                        C.row_stride(out, "out"), m, k, n, swiglu=swiglu, row_blocks=row_blocks,
                        sk=sk, consumers=consumers, ring_kib=ring_kib, x_regs=x_regs,
                        tile_group=tile_group)
    return out


@pytest.mark.parametrize("sk, consumers, ring_kib", [(1024, 8, 192), (2048, 16, 192),
                                                     (1024, 16, 64), (2048, 8, 96)])
@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("k", [16, 272, 2048, 4096 + 96, 12288])  # 272, 4192: a partial stage
def test_gemv_tma_kernel_vs_float64(rng, k, swiglu, sk, consumers, ring_kib):
    m = 147 if swiglu else 301  # odd: a partial row tile
    n = 5
    x_h, x_d = _strided_x(rng, n, k)
    w_full = _padded_bf16_weight(rng, 2 * m if swiglu else m, k)  # NaN past K in every row
    w_h = host(w_full)
    out = _tma(x_d, w_full, swiglu=swiglu, sk=sk, consumers=consumers, ring_kib=ring_kib)
    want = ref.linear(x_h, bf16_bits_to_f32(w_h))
    assert_close(out, ref.swiglu(want) if swiglu else want, what=f"k={k} swiglu={swiglu}")


@pytest.mark.parametrize("sk, consumers", [(1024, 8), (2048, 16), (1024, 16)])
@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("k", [272, 4096])
def test_gemv_tma_kernel_is_batch_invariant(rng, k, swiglu, sk, consumers):
    """Each row of an N-row call (N up to 11: two column tiles) equals that row alone, bitwise,
    with one block per SM, 3 blocks, or 1 block walking every row tile."""
    m = 147 if swiglu else 301
    w_d = _padded_bf16_weight(rng, 2 * m if swiglu else m, k)
    _, x_d = _strided_x(rng, 11, k)
    alone = [_tma(x_d[i:i + 1], w_d, swiglu=swiglu, sk=sk, consumers=consumers)
             for i in range(11)]
    for n in (1, 2, 7, 8, 11):
        for row_blocks in (None, 3, 1):
            got = _tma(x_d[:n], w_d, swiglu=swiglu, row_blocks=row_blocks, sk=sk,
                       consumers=consumers)
            for i in range(n):
                assert_same_bits(got[i:i + 1], alone[i],
                                 f"k={k} n={n} row {i} row_blocks={row_blocks}")


def test_gemv_tma_swiglu_equals_linear_then_swiglu(rng):
    n, k, inner = 3, 1024 + 48, 200
    _, x_d = _strided_x(rng, n, k)
    w_d = _padded_bf16_weight(rng, 2 * inner, k)
    gu = _tma(x_d, w_d, swiglu=False)
    ref_act = poisoned((n, inner))
    ops.swiglu(gu, ref_act)
    assert_same_bits(_tma(x_d, w_d, swiglu=True), ref_act, "swiglu")


def test_gemv_tma_flag_routes_linear_and_swiglu(rng, monkeypatch):
    """GEMV_TMA routes both entry points to linear_tma_kernel when K % 16 == 0 and to the rows
    kernel otherwise."""
    monkeypatch.setattr(klinear, "GEMV_TMA", True)
    n, inner = 3, 96
    for k, tma in ((2048, True), (1000 + 4, False)):
        _, x_d = _strided_x(rng, n, k)
        w_d = _padded_bf16_weight(rng, 2 * inner, k)
        out = poisoned((n, 2 * inner))
        klinear.linear(x_d, w_d, out)
        act = poisoned((n, inner))
        klinear.linear_swiglu(x_d, w_d, act)
        if tma:
            want, want_act = _tma(x_d, w_d, swiglu=False), _tma(x_d, w_d, swiglu=True)
        else:
            want = _mma(x_d, w_d, swiglu=False, rows=False)
            want_act = _mma(x_d, w_d, swiglu=True, rows=False)
        assert_same_bits(out, want, f"linear k={k}")
        assert_same_bits(act, want_act, f"linear_swiglu k={k}")


@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("k", [16, 1040, 2048, 3072 + 48, 4096, 5120])
def test_gemv_tma_x_in_registers_same_bits(rng, monkeypatch, k, swiglu):
    """The instances that keep x's fragments in registers (1024-k stages, 16 consumers, K <=
    5120: all of them, whatever NINFER_GEMV_TMA_X_STAGES picks by default) give the bits of the
    instance that reads x per tile, for N = 1..8."""
    monkeypatch.setattr(klinear, "TMA_X_STAGES", klinear.TMA_MAX_X_STAGES)
    assert klinear.tma_x_stages(k, 1024, 16) == -(-k // 1024)
    m = 147 if swiglu else 301
    w_d = _padded_bf16_weight(rng, 2 * m if swiglu else m, k)
    for n in (1, 3, 8):
        _, x_d = _strided_x(rng, n, k)
        want = _tma(x_d, w_d, swiglu=swiglu, sk=1024, consumers=16, x_regs=False)
        assert np.isfinite(host(want)).all()
        for row_blocks in (None, 3):
            got = _tma(x_d, w_d, swiglu=swiglu, sk=1024, consumers=16, row_blocks=row_blocks)
            assert_same_bits(got, want, f"k={k} n={n} row_blocks={row_blocks}")


@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("k, x_regs", [(6144 + 48, True), (12288, True), (2048, False),
                                       (1024 + 16, False)])
def test_gemv_tma_tile_groups_same_bits(rng, k, x_regs, swiglu):
    """Row tiles walked in lockstep groups of 2 or 4 (x read once per stage and group) give the
    bits of one tile at a time, for N = 1..8, with the tiles spread over many blocks (a partial
    last group) or walked by 5 or 1 blocks; against float64 too."""
    m = 147 if swiglu else 301
    w_full = _padded_bf16_weight(rng, 2 * m if swiglu else m, k)
    for n in (1, 3, 8):
        x_h, x_d = _strided_x(rng, n, k)
        want = _tma(x_d, w_full, swiglu=swiglu, sk=1024, consumers=16, x_regs=x_regs,
                    tile_group=1)
        ref_out = ref.linear(x_h, bf16_bits_to_f32(host(w_full)))
        assert_close(want, ref.swiglu(ref_out) if swiglu else ref_out, what=f"k={k} n={n}")
        for tg in (2, 4):
            for row_blocks in (None, 5, 1):
                got = _tma(x_d, w_full, swiglu=swiglu, sk=1024, consumers=16, x_regs=x_regs,
                           tile_group=tg, row_blocks=row_blocks)
                assert_same_bits(got, want, f"k={k} n={n} tile_group={tg} row_blocks={row_blocks}")


def _pdl_chain(x_d, ws, outs, *, pdl):
    """x -> SwiGLU GEMV -> linear -> linear ... each GEMV reading the previous one's output, all
    linear_tma_kernel launches, back to back on one stream."""
    cur = x_d
    for i, (w, out) in enumerate(zip(ws, outs)):
        n, k = cur.shape
        swiglu = i == 0
        m = w.shape[0] // 2 if swiglu else w.shape[0]
        klinear._launch_tma(cur, C.row_stride(cur, "x"), w, C.row_stride(w, "w"), out,
                            C.row_stride(out, "out"), m, k, n, swiglu=swiglu, pdl=pdl)
        cur = out


def test_gemv_tma_pdl_chain_equals_plain_launches(rng):
    """With programmatic dependent launch each GEMV may start before its producer finishes; its
    consumers wait (griddepcontrol.wait) before reading x, so a dependent chain gives the bits of
    plain launches, eagerly and replayed from a captured graph."""
    from ninfer.core.cuda import CudaGraph, DeviceContext

    n, dims = 3, [2048, 4096, 1024, 3072, 4096]  # gate_up 2*4096 x 2048, then dims[i+1] x dims[i]
    ws = [_padded_bf16_weight(rng, 2 * dims[1], dims[0])]
    ws += [_padded_bf16_weight(rng, dims[i + 1], dims[i]) for i in range(1, len(dims) - 1)]
    ctx = DeviceContext(0)
    with ctx.activate():
        _, x_d = _strided_x(rng, n, dims[0])
        plain = [poisoned((n, d)) for d in dims[1:]]
        _pdl_chain(x_d, ws, plain, pdl=False)
        ctx.synchronize()
        assert np.isfinite(host(plain[-1])).all()
        for _ in range(3):
            got = [poisoned((n, d)) for d in dims[1:]]
            _pdl_chain(x_d, ws, got, pdl=True)
            ctx.synchronize()
            for i, (a, b) in enumerate(zip(got, plain)):
                assert_same_bits(a, b, f"eager PDL chain, GEMV {i}")
        got = [poisoned((n, d)) for d in dims[1:]]
        graph = CudaGraph("pdl-chain")
        with graph.capture(ctx.stream):
            _pdl_chain(x_d, ws, got, pdl=True)
        for _ in range(3):
            for g in got:
                g.fill(np.nan)
            graph.launch(ctx.stream)
            ctx.synchronize()
            for i, (a, b) in enumerate(zip(got, plain)):
                assert_same_bits(a, b, f"graph PDL chain, GEMV {i}")
        graph.destroy()
