"""bf16 decode operands on the GPU (NINFER_GEMV_BF16_X): the GEMV reading x as bf16 bits, and
the ops that write a GEMV's x as bf16 bits (the fused SwiGLU, the fused GDN decode, the paged
attention; the norms' bf16 output is covered with the prefill operands).

Checked, on fresh random inputs with poisoned outputs (NaN / 0xFFFF):
- linear_tma_kernel with a bf16 x gives bitwise the result of the f32 x holding the same values
  (its lo term is then 0), for every x layout the kernel has (x in registers for K <= 5 stages,
  read per stage in tile groups of 1 / 2 / 4), N = 1, 3, 8 and 11 (two column tiles), with
  several persistent block counts; against float64 on the rounded x too; each row alone equals
  the row in a batch (batch invariance);
- the SwiGLU GEMV's bf16 out is its f32 out rounded to nearest even, bitwise;
- `linear` / `linear_swiglu` / `ops.linear` route bf16 operands to those instances under the
  flag and refuse them (InvalidInput / TypeError) without it;
- gdn_decode_fused and paged_attention (every kernel: FMA, MMA, TMA; split and loop mode; with
  the output gate) write bf16 bits equal to their f32 output rounded, bitwise.
"""
from __future__ import annotations

import numpy as np
import pytest

from ninfer import ops
from ninfer.core.dtypes import DType, bf16_bits_to_f32, f32_to_bf16_bits
from ninfer.errors import InvalidInput
from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda import attention as katt
from ninfer.kernels_cuda import gdn_decode as kdec
from ninfer.kernels_cuda import linear as klinear
from ninfer.ops import reference as ref
from ninfer.ops.linear import reads_bf16_x, swiglu_reads_bf16_x

from cuda_testutil import (assert_close, assert_same_bits, cp, dev, host, random_block_tables,
                           randn, weight_pair)
from cuda_testutil import poisoned as _poisoned_f32

pytestmark = pytest.mark.gpu

X_BF16 = klinear.TMA_IO_X_BF16
OUT_BF16 = klinear.TMA_IO_OUT_BF16


@pytest.fixture
def bf16_x(monkeypatch):
    """The flag as NINFER_GEMV_BF16_X=1 sets it at import."""
    monkeypatch.setattr(klinear, "GEMV_BF16_X", True)


def poisoned(shape, dtype=np.float32):
    """NaN (f32) or 0xFFFF (bf16 bits: a NaN no finite result rounds to)."""
    if np.dtype(dtype) == np.uint16:
        return cp().full(shape, 0xFFFF, dtype=np.uint16)
    return _poisoned_f32(shape, dtype)


def _x_pair(rng, n, k):
    """x as bf16 bits [n, k] (rows 16-byte aligned, a stride past K padded with NaN bits) and
    as the f32 x holding the same values (rows strided, NaN padded); plus its host values."""
    vals = f32_to_bf16_bits((rng.standard_normal((n, k)) * 3.0).astype(np.float32))
    stride = -(-k // 8) * 8 + 8
    bits = np.full((n, stride), 0x7FC0, np.uint16)
    bits[:, :k] = vals
    wide = np.full((n, -(-k // 4) * 4 + 8), np.nan, np.float32)
    wide[:, 4:4 + k] = bf16_bits_to_f32(vals)
    return dev(bits)[:, :k], dev(wide)[:, 4:4 + k], bf16_bits_to_f32(vals)


def _weight(rng, m, k):
    """bf16 bits [m, k], rows 16-byte aligned, NaN bits past K."""
    stride = -(-k // 8) * 8 + 8
    full = np.full((m, stride), 0x7FC0, dtype=np.uint16)
    full[:, :k] = f32_to_bf16_bits((rng.standard_normal((m, k)) * k ** -0.5).astype(np.float32))
    return dev(full)[:, :k]


def _tma(x_d, w_d, *, swiglu, io=0, x_regs=True, tile_group=None, row_blocks=None, x_vec=None):
    n, k = x_d.shape
    m = w_d.shape[0] // 2 if swiglu else w_d.shape[0]
    out_dtype = np.uint16 if io & OUT_BF16 else np.float32
    out = poisoned((n, m), out_dtype)
    klinear._launch_tma(x_d, C.row_stride(x_d, "x"), w_d, C.row_stride(w_d, "w"), out,
                        C.row_stride(out, "out"), m, k, n, swiglu=swiglu, x_regs=x_regs,
                        tile_group=tile_group, row_blocks=row_blocks, io=io, x_vec=x_vec)
    return out


@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("k, x_regs, tile_group", [
    (16, True, 1), (1040, True, 1), (3072 + 48, True, 1), (5120, True, 1),  # x in registers
    (2048, False, 1), (2048, False, 2), (6144 + 48, True, 4), (12288, True, 2),  # per stage
])
def test_bf16_x_equals_f32_x_of_the_same_values(rng, swiglu, k, x_regs, tile_group):
    """(A bf16 x keeps its fragments in registers up to 5 stages, K = 5120 included; the f32 x
    it is compared with reads them per stage there.)"""
    if x_regs and k <= 5 * 1024:
        assert klinear.tma_x_stages(k, 1024, 16, bf16_x=True) == -(-k // 1024)
    m = 147 if swiglu else 301  # odd: a partial row tile
    w_d = _weight(rng, 2 * m if swiglu else m, k)
    w_h = bf16_bits_to_f32(host(w_d))
    for n in (1, 3, 8, 11):
        bits, wide, vals = _x_pair(rng, n, k)
        want = _tma(wide, w_d, swiglu=swiglu, x_regs=x_regs, tile_group=tile_group)
        assert np.isfinite(host(want)).all()
        for row_blocks in (None, 5):
            got = _tma(bits, w_d, swiglu=swiglu, io=X_BF16, x_regs=x_regs,
                       tile_group=tile_group, row_blocks=row_blocks)
            assert_same_bits(got, want, f"k={k} n={n} row_blocks={row_blocks}")
        expect = ref.linear(vals, w_h)
        assert_close(want, ref.swiglu(expect) if swiglu else expect, what=f"k={k} n={n}")


@pytest.mark.parametrize("swiglu", [False, True])
@pytest.mark.parametrize("k", [272, 4096, 8192])
def test_bf16_x_rows_are_batch_invariant(rng, swiglu, k):
    m = 147 if swiglu else 301
    w_d = _weight(rng, 2 * m if swiglu else m, k)
    bits, _, _ = _x_pair(rng, 11, k)
    io = X_BF16 | (OUT_BF16 if swiglu else 0)
    alone = [host(_tma(bits[i:i + 1], w_d, swiglu=swiglu, io=io)) for i in range(11)]
    for n in (2, 8, 11):
        got = host(_tma(bits[:n], w_d, swiglu=swiglu, io=io))
        for i in range(n):
            assert_same_bits(got[i:i + 1], alone[i], f"k={k} n={n} row {i}")


@pytest.mark.parametrize("k", [1024, 4096 + 16, 12288])
def test_swiglu_bf16_out_is_the_rounded_f32_out(rng, k):
    inner = 200
    w_d = _weight(rng, 2 * inner, k)
    for n in (1, 5, 8):
        bits, _, _ = _x_pair(rng, n, k)
        f32 = host(_tma(bits, w_d, swiglu=True, io=X_BF16))
        got = _tma(bits, w_d, swiglu=True, io=X_BF16 | OUT_BF16)
        assert np.isfinite(f32).all()
        assert_same_bits(got, f32_to_bf16_bits(f32), f"k={k} n={n}")


def test_entry_points_route_bf16_operands(rng, bf16_x):
    """Under the flag, `linear`, `linear_swiglu` and `ops.linear` / `ops.linear_swiglu` with
    bf16 operands run the bf16 instances (same bits as the explicit launches); cuBLAS (N > 8)
    takes the bf16 x too. The operand checks refuse what no kernel takes."""
    n, k, inner = 5, 2048, 96
    w_d = _weight(rng, 2 * inner, k)
    bits, wide, _ = _x_pair(rng, n, k)
    out = poisoned((n, 2 * inner))
    klinear.linear(bits, w_d, out)
    assert_same_bits(out, _tma(wide, w_d, swiglu=False), "linear, bf16 x")
    act = poisoned((n, inner), np.uint16)
    klinear.linear_swiglu(bits, w_d, act)
    assert_same_bits(act, _tma(bits, w_d, swiglu=True, io=X_BF16 | OUT_BF16), "swiglu bf16")
    act32 = poisoned((n, inner))
    klinear.linear_swiglu(bits, w_d, act32)
    assert_same_bits(act32, _tma(wide, w_d, swiglu=True), "swiglu, bf16 x, f32 out")
    # the ops layer, with Weight objects: the same bits as the f32 x of the same values
    _, w_obj = weight_pair(rng, (2 * inner, k), DType.BFLOAT16)
    assert reads_bf16_x(n, w_obj) and swiglu_reads_bf16_x(w_obj)
    packed = cp().ascontiguousarray(bits)
    out_ops, out_f32 = poisoned((n, 2 * inner)), poisoned((n, 2 * inner))
    ops.linear(packed, w_obj, out_ops)
    ops.linear(wide, w_obj, out_f32)
    assert np.isfinite(host(out_f32)).all()
    assert_same_bits(out_ops, out_f32, "ops.linear, bf16 x")
    act_ops = poisoned((n, inner), np.uint16)
    ops.linear_swiglu(packed, w_obj, act_ops)
    act_f32 = poisoned((n, inner))
    ops.linear_swiglu(wide, w_obj, act_f32)
    assert_same_bits(act_ops, f32_to_bf16_bits(host(act_f32)), "ops.linear_swiglu, bf16")
    # f32 weights: no bf16 x on the GEMV
    _, w32 = weight_pair(rng, (2 * inner, k), DType.FLOAT32)
    assert not reads_bf16_x(n, w32)
    with pytest.raises(TypeError):
        ops.linear(cp().ascontiguousarray(bits), w32, poisoned((n, 2 * inner)))
    # a bf16 out needs a bf16 x
    with pytest.raises(InvalidInput):
        klinear.linear_swiglu(wide, w_d, poisoned((n, inner), np.uint16))
    # N > 8: the cuBLAS path reads the bf16 bits (the same out as the f32 values)
    big_bits, big_wide, _ = _x_pair(rng, 12, k)
    o1, o2 = poisoned((12, 2 * inner)), poisoned((12, 2 * inner))
    klinear.linear(cp().ascontiguousarray(big_bits), w_d, o1)
    klinear.linear(big_wide, w_d, o2)
    assert_same_bits(o1, o2, "cuBLAS, bf16 x vs f32 x of the same values")


def test_flag_off_refuses_bf16_gemv_operands(rng, monkeypatch):
    monkeypatch.setattr(klinear, "GEMV_BF16_X", False)
    n, k, inner = 3, 1024, 64
    w_d = _weight(rng, 2 * inner, k)
    bits, _, _ = _x_pair(rng, n, k)
    with pytest.raises(InvalidInput):
        klinear.linear(bits, w_d, poisoned((n, 2 * inner)))
    with pytest.raises(InvalidInput):
        klinear.linear_swiglu(bits, w_d, poisoned((n, inner)))
    _, w_obj = weight_pair(rng, (2 * inner, k), DType.BFLOAT16)
    assert not reads_bf16_x(n, w_obj) and not swiglu_reads_bf16_x(w_obj)
    assert reads_bf16_x(9, w_obj)  # the cuBLAS path still does


# -- the producers' bf16 outputs --------------------------------------------------------------

def test_gdn_decode_bf16_out_is_the_rounded_f32_out(rng):
    hk, hv, dk, dv, kc, slots_n = 2, 4, 128, 128, 4, 10
    c = 2 * hk * dk + hv * dv
    conv0 = randn(rng, (slots_n, kc - 1, c), 0.5)
    state0 = randn(rng, (slots_n, hv, dk, dv), 0.1)
    _, cw = weight_pair(rng, (c, kc), DType.BFLOAT16, scale=0.5)
    _, alog = weight_pair(rng, (hv,), DType.FLOAT32, scale=0.5)
    _, dt = weight_pair(rng, (hv,), DType.FLOAT32)
    _, nw = weight_pair(rng, (dv,), DType.BFLOAT16)
    for n in (1, 3, 8):
        qkv, a, b = dev(randn(rng, (n, c))), dev(randn(rng, (n, hv))), dev(randn(rng, (n, hv)))
        z = dev(randn(rng, (n, hv, dv)))
        slots = dev(rng.choice(slots_n, n, replace=False).astype(np.int32))
        counters = kdec.decode_counters(n, hk)
        outs = {}
        for dtype in (np.float32, np.uint16):
            conv, state = dev(conv0), dev(state0)
            out = poisoned((n, hv, dv), dtype)
            kdec.gdn_decode_fused(qkv, cw, conv, a, b, alog, dt, state, slots, z, nw, 1e-6, out,
                                  counters=counters)
            outs[dtype] = (host(out), host(state), host(conv))
        f32, bits = outs[np.float32], outs[np.uint16]
        assert np.isfinite(f32[0]).all()
        assert_same_bits(bits[0], f32_to_bf16_bits(f32[0]), f"B={n}: out")
        assert_same_bits(bits[1], f32[1], f"B={n}: state")
        assert_same_bits(bits[2], f32[2], f"B={n}: conv state")


LENGTHS = [1, 37, 65, 700, 1025, 4097, 5000]


@pytest.mark.parametrize("variant", ["fma", "mma", "tma"])
@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("gated", [True, False])
def test_paged_attention_bf16_out_is_the_rounded_f32_out(rng, monkeypatch, variant, split,
                                                         gated):
    heads, hkv, d, page_size = 16, 4, 256, 16
    monkeypatch.setattr(katt, "TMA", variant == "tma")
    monkeypatch.setattr(katt, "MMA", variant == "mma")
    if not split:
        monkeypatch.setattr(katt, "SPLIT_MAX_ROWS", 0)
    pages = sum(-(-n // page_size) for n in LENGTHS) + 2
    kp = dev(f32_to_bf16_bits(randn(rng, (pages, hkv, page_size, d))))
    vp = dev(f32_to_bf16_bits(randn(rng, (pages, hkv, page_size, d))))
    cols = -(-max(LENGTHS) // page_size) + 1
    bt_d = dev(random_block_tables(rng, LENGTHS, page_size, pages, cols))
    ws = katt.AttentionWorkspace.allocate(8, heads, d, cols * page_size)
    n = len(LENGTHS)
    proj = dev(randn(rng, (n, heads, 2 * d), 2.0))
    q, gate = proj[:, :, :d], proj[:, :, d:]
    seqs = dev(np.arange(n, dtype=np.int32))
    pos = dev(np.array(LENGTHS, np.int32) - 1)
    outs = {}
    for dtype in (np.float32, np.uint16):
        out = poisoned((n, heads, d), dtype)
        ops.paged_attention(q, kp, vp, bt_d, seqs, pos, d ** -0.5, out,
                            workspace=ws if split else None, gate=gate if gated else None)
        outs[dtype] = host(out)
    assert np.isfinite(outs[np.float32]).all()
    assert_same_bits(outs[np.uint16], f32_to_bf16_bits(outs[np.float32]),
                     f"{variant} split={split} gated={gated}")
    if split:
        assert not host(ws.counters).any()


def _odd_rows(rng, n, k):
    """x as bf16 bits [n, k] whose rows are 8 bytes apart from 16-byte alignment (row stride
    k + 4): the TMA_IO_X_VEC instances must take their 4-byte loads for it."""
    full = np.full((n, k + 4), 0x7FC0, np.uint16)
    full[:, :k] = f32_to_bf16_bits((rng.standard_normal((n, k)) * 3.0).astype(np.float32))
    return dev(full)[:, :k]


@pytest.mark.parametrize("k, x_regs, tile_group", [
    (16, True, 1), (1040, True, 1), (3584, True, 1), (4096, True, 1), (5120, True, 1),
    (2048 + 16, False, 1), (2048, False, 2), (6144 + 48, True, 4), (12288, True, 2),  # per stage
])
@pytest.mark.parametrize("swiglu, io", [(False, X_BF16), (True, X_BF16),
                                        (True, X_BF16 | OUT_BF16)])
def test_x_vec_loads_give_the_same_bits(rng, k, x_regs, tile_group, swiglu, io):
    """NINFER_GEMV_X_VEC (linear.cu TMA_IO_X_VEC: a bf16 x in registers loaded 16 bytes per lane
    and handed out by quad transposes) gives the 4-byte loads' bits: 1 to 5 x stages, K past the
    last full stage and past the last full warp range (16, 1040, 3584, 2064), x read per stage
    in tile groups of 1, 2, 4 (NINFER_GEMV_X_VEC_STAGES), N = 1 (forced), 3, 8, 11; and an x
    with rows off 16-byte alignment (the instances' 4-byte fallback)."""
    if x_regs and k <= 5 * 1024:
        assert klinear.tma_x_stages(k, 1024, 16, bf16_x=True) == -(-k // 1024)
    m = 147 if swiglu else 301
    w_d = _weight(rng, 2 * m if swiglu else m, k)
    for n in (1, 3, 8, 11):
        aligned, _, _ = _x_pair(rng, n, k)
        for what, x_d in (("aligned", aligned), ("odd rows", _odd_rows(rng, n, k))):
            out = [_tma(x_d, w_d, swiglu=swiglu, io=io, x_regs=x_regs, tile_group=tile_group,
                        x_vec=on) for on in (False, True)]
            assert np.isfinite(bf16_bits_to_f32(host(out[0])) if io & OUT_BF16
                               else host(out[0])).all()
            assert_same_bits(out[1], out[0], f"{what} k={k} n={n}")
