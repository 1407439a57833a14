"""Chunkwise GDN prefill (tensor-core products in 3xTF32 and in bf16) against the float64
recurrence oracle: odd segment lengths (odd T, not a multiple of 64, a 1-token and an empty
segment), nonzero initial state, Hv = 2 Hk, padded head dims, unaligned (4-byte copy) q / k
views, untouched slots, NaN-poisoned outputs and workspaces, and bitwise split invariance at
multiples of 64 tokens; each on the paths of PATHS (3xTF32; bf16 with the module's default
tiles; bf16 on the fp32-tile kernels, bf16_cols=0). Tolerances (relative Frobenius error):
TOL_F32 for 3xTF32, TOL_BF16 for bf16 (FLA's policy: bf16 operands, fp32 accumulation and
state). The bf16-tile path (bf16_cols 32,
64) against float64, against the fp32-tile bf16 kernels (equal values) and itself cut at
multiples of 64 tokens (bitwise), on odd lengths, several segments and slots, head dims 128, 96,
64 and padded ones; each with both of its local kernels (local_pair: gdn_chunk_localpair_kernel,
the inverse (I + A)^-1 applied with 3xTF32 mma, checked against float64 and the old kernel
within tolerance; else gdn_chunk_local16_kernel, equal to the fp32-tile kernels' values)."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.kernels_cuda import gdn as kgdn
from ninfer.kernels_cuda.gdn_chunk import ChunkWorkspace
from ninfer.ops import reference as ref

from cuda_testutil import (TOL_F32, assert_chunk_prefill_splits_bitwise, assert_close,
                           assert_same_bits, cp, dev, gdn_inputs, host, poisoned, rel_err,
                           segments, slot_strided)

pytestmark = pytest.mark.gpu

# gdn_chunk_prefill arguments: 3xTF32 (bf16_cols has no effect there); bf16 with the module's
# bf16_cols / local_pair (the default: bf16 tiles); bf16 on the fp32-tile kernels
PATHS = {"tf32x3": dict(precision="tf32x3"), "bf16": dict(precision="bf16"),
         "bf16_fp32_tiles": dict(precision="bf16", bf16_cols=0)}
TOL_BF16 = 2e-2
TOLS = {"tf32x3": TOL_F32, "bf16": TOL_BF16}  # vs float64, by precision


def _tol(path: str) -> float:
    return TOLS[PATHS[path]["precision"]]


def _unaligned(a: np.ndarray):
    """A device view of `a` [N, H, d] whose head and row strides are odd (d + 5 elements)."""
    n, hh, d = a.shape
    parent = np.full((n, hh, d + 5), np.nan, np.float32)
    parent[:, :, 3:3 + d] = a
    return dev(parent)[:, :, 3:3 + d]


def _poisoned_workspace(n: int, segs: int, hv: int) -> ChunkWorkspace:
    """A workspace whose float buffers are all NaN: a read of anything not written this call
    (a stale row, a padded column) poisons the output."""
    ws = ChunkWorkspace.allocate(n, segs, hv)
    for a in (ws.w, ws.u, ws.gam, ws.p):
        a.fill(np.nan)
    return ws


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("hk,hv,dk,dv,g_scale,aligned", [
    (2, 4, 128, 128, 0.05, True),
    (2, 4, 128, 128, 0.3, True),
    (1, 2, 40, 72, 0.1, True),
    (2, 4, 128, 100, 0.1, False),
    (1, 2, 37, 33, 0.1, False),
])
def test_chunk_prefill_vs_float64(rng, hk, hv, dk, dv, g_scale, aligned, path):
    lengths, slots = (131, 1, 0, 77, 64, 200), (3, 0, 6, 1, 4, 2)  # T = 473
    starts, seg_slots = segments(lengths, slots)
    n = int(starts[-1])
    q, k, v, g, beta = gdn_inputs(rng, n, hk, hv, dk, dv, g_scale)
    st_h, st_d, _ = slot_strided(rng, 7, (hv, dk, dv), scale=0.1)
    untouched = host(st_d)[5].copy()  # slot 5 is in no segment
    exp_out, exp_state = ref.gdn_recurrence(q, k, v, g, beta, st_h, starts, seg_slots)
    qd, kd = (dev(q), dev(k)) if aligned else (_unaligned(q), _unaligned(k))
    out = poisoned((n, hv, dv))
    kgdn.gdn_chunk_prefill(qd, kd, dev(v), dev(g), dev(beta), st_d, dev(starts),
                           dev(seg_slots), out, workspace=_poisoned_workspace(n, 6, hv),
                           **PATHS[path])
    assert_close(out, exp_out, _tol(path), "chunk output")
    assert_close(st_d, exp_state, _tol(path), "chunk state")
    assert_same_bits(host(st_d)[5], untouched, "slot outside every segment")


@pytest.mark.parametrize("path", PATHS)
def test_chunk_prefill_matches_recurrence_kernel_long(rng, path):
    """Many chunks (state carried over 16 chunks) against the token-by-token kernel."""
    hk, hv, dk, dv, n = 2, 4, 128, 128, 1000
    q, k, v, g, beta = gdn_inputs(rng, n, hk, hv, dk, dv, 0.1)
    starts, seg_slots = segments((n,), (1,))
    _, st_rec, _ = slot_strided(rng, 2, (hv, dk, dv), scale=0.1)
    st_chunk = cp().ascontiguousarray(st_rec)
    args = [dev(a) for a in (q, k, v, g, beta)]
    out_rec, out_chunk = poisoned((n, hv, dv)), poisoned((n, hv, dv))
    kgdn.gdn_recurrence(*args, st_rec, dev(starts), dev(seg_slots), out_rec)
    kgdn.gdn_chunk_prefill(*args, st_chunk, dev(starts), dev(seg_slots), out_chunk,
                           **PATHS[path])
    assert_close(out_chunk, host(out_rec), _tol(path), "chunk vs recurrence output")
    assert_close(st_chunk, host(st_rec), _tol(path), "chunk vs recurrence state")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("cuts", [(64,), (128, 192), (64, 256)])
def test_chunk_prefill_split_bitwise(rng, cuts, path):
    assert_chunk_prefill_splits_bitwise(rng, 301, 2, 4, 128, 128, cuts, 0.1, slots=2,
                                        contiguous_split_state=True, **PATHS[path])


def test_bf16_products_differ_from_tf32x3(rng):
    """The precision argument picks other kernels: bf16 results are not the 3xTF32 bits, and
    within TOL_BF16 of them."""
    hk, hv, dk, dv, lengths = 2, 4, 128, 128, (200, 63)
    starts, seg_slots = segments(lengths, (0, 1))
    n = int(starts[-1])
    args = [dev(a) for a in gdn_inputs(rng, n, hk, hv, dk, dv, 0.1)]
    _, st_tf32, _ = slot_strided(rng, 2, (hv, dk, dv), scale=0.1)
    st_bf16 = cp().ascontiguousarray(st_tf32)
    outs = {}
    for precision, st in (("tf32x3", st_tf32), ("bf16", st_bf16)):
        outs[precision] = poisoned((n, hv, dv))
        kgdn.gdn_chunk_prefill(*args, st, dev(starts), dev(seg_slots), outs[precision],
                               precision=precision)
    assert_close(outs["bf16"], host(outs["tf32x3"]), TOL_BF16, "bf16 vs tf32x3 output")
    assert_close(st_bf16, host(st_tf32), TOL_BF16, "bf16 vs tf32x3 state")
    assert not np.array_equal(host(outs["bf16"]), host(outs["tf32x3"]))


@pytest.mark.parametrize("precision", TOLS)
@pytest.mark.parametrize("hk,hv,dk,dv,lengths", [
    (2, 4, 128, 128, (1000,)),                 # 16 chunks carried
    (2, 4, 128, 100, (64, 300, 5)),            # four 32-column state tiles, the last partial
    (1, 2, 37, 33, (130, 1, 0, 77, 64, 200)),  # padded head dims, 1-token and empty segments
])
def test_fp32_tiles_vs_float64(rng, hk, hv, dk, dv, lengths, precision):
    """The fp32-tile kernels (bf16_cols=0: gdn_chunk_local_kernel, gdn_chunk_state_kernel with
    the output inside it) on NaN-poisoned workspaces, segments in reversed slots: output and
    state within TOLS[precision] of float64."""
    slots = tuple(reversed(range(len(lengths))))
    starts, seg_slots = segments(lengths, slots)
    n = int(starts[-1])
    q, k, v, g, beta = gdn_inputs(rng, n, hk, hv, dk, dv, 0.1)
    st_h, st_d, _ = slot_strided(rng, len(lengths), (hv, dk, dv), scale=0.1)
    args = [dev(a) for a in (q, k, v, g, beta)]
    out = poisoned((n, hv, dv))
    kgdn.gdn_chunk_prefill(*args, st_d, dev(starts), dev(seg_slots), out,
                           workspace=_poisoned_workspace(n, len(lengths), hv),
                           precision=precision, bf16_cols=0)
    exp_out, exp_state = ref.gdn_recurrence(q, k, v, g, beta, st_h, starts, seg_slots)
    assert_close(out, exp_out, TOLS[precision], "output")
    assert_close(st_d, exp_state, TOLS[precision], "state")


# ---- bf16-tile path (bf16_cols 32 / 64: gdn_chunk_local16_kernel + gdn_chunk_state16_kernel) ----
BF16_COLS = (32, 64)


def _poisoned_workspace16(n: int, segs: int, hv: int) -> ChunkWorkspace:
    """A bf16-tile workspace whose float buffers are NaN and whose bf16 buffer (Q e^G) is NaN
    bits (0x7fc0): a read of anything not written this call poisons the output."""
    ws = ChunkWorkspace.allocate(n, segs, hv, bf16_tiles=True)
    for a in (ws.w, ws.u, ws.gam, ws.p):
        a.fill(np.nan)
    ws.qg.fill(0x7FC0)
    return ws


LOCALS = {"pair": True, "local16": False}  # the bf16-tile path's local kernel (local_pair)


def _run(args, st, starts, seg_slots, out, ws, bf16_cols: int, local_pair: bool = True) -> None:
    kgdn.gdn_chunk_prefill(*args, st, dev(starts), dev(seg_slots), out, workspace=ws,
                           precision="bf16", bf16_cols=bf16_cols, local_pair=local_pair)


def _assert_equal_values(a, b, what: str) -> None:
    """Equal as numbers (bitwise up to the sign of exact zeros), with the first difference."""
    a, b = host(a), host(b)
    bad = np.argwhere(~((a == b) | (np.isnan(a) & np.isnan(b))))
    assert bad.size == 0, (f"{what}: {len(bad)} of {a.size} differ, first at {tuple(bad[0])}: "
                           f"{a[tuple(bad[0])]!r} vs {b[tuple(bad[0])]!r}")


@pytest.mark.parametrize("local", LOCALS)
@pytest.mark.parametrize("bf16_cols", BF16_COLS)
@pytest.mark.parametrize("hk,hv,dk,dv,lengths,g_scale", [
    (2, 4, 128, 128, (131, 1, 0, 77, 64, 200), 0.1),   # 6 segments, a 1-token and an empty one
    (2, 4, 128, 128, (1000,), 0.05),                     # 16 chunks carried
    (2, 4, 128, 128, (63, 65), 0.3),
    (1, 2, 64, 64, (200, 1), 0.1),
    (2, 4, 96, 96, (65, 130), 0.1),
    (1, 2, 37, 33, (131, 1, 0, 77), 0.1),               # padded head dims
    (2, 4, 128, 100, (64, 300, 5), 0.1),                 # a partial column tile
    (2, 2, 128, 128, (131, 70), 0.1),                    # Hv = Hk: one value head per block
    (1, 3, 128, 128, (200, 1), 0.1),                     # odd group: one value head per block
])
def test_bf16_tiles_vs_float64_and_fp32_tiles(rng, local, bf16_cols, hk, hv, dk, dv, lengths,
                                              g_scale):
    """The bf16-tile path against float64 (TOL_BF16) and against the fp32-tile bf16 kernels, on
    NaN-poisoned workspaces, with an untouched slot. local16: equal values (the same bf16
    operands, products and accumulation order); pair (U, W from (I + A)^-1 by blocks, other
    fp32 rounding): within TOL_BF16 of them, and its error vs float64 at most 1.5x theirs plus
    1e-3 (no accuracy regression beyond rounding noise)."""
    slots = tuple(range(len(lengths)))[::-1]
    starts, seg_slots = segments(lengths, slots)
    n = int(starts[-1])
    q, k, v, g, beta = gdn_inputs(rng, n, hk, hv, dk, dv, g_scale)
    nslots = len(lengths) + 1  # the last slot is in no segment
    st_h, st_new, _ = slot_strided(rng, nslots, (hv, dk, dv), scale=0.1)
    _, st_old, _ = slot_strided(rng, nslots, (hv, dk, dv), scale=0.1)
    st_old[...] = st_new
    untouched = host(st_new)[nslots - 1].copy()
    exp_out, exp_state = ref.gdn_recurrence(q, k, v, g, beta, st_h, starts, seg_slots)
    args = [dev(a) for a in (q, k, v, g, beta)]
    out_new, out_old = poisoned((n, hv, dv)), poisoned((n, hv, dv))
    _run(args, st_new, starts, seg_slots, out_new, _poisoned_workspace16(n, len(lengths), hv),
         bf16_cols, LOCALS[local])
    _run(args, st_old, starts, seg_slots, out_old, _poisoned_workspace(n, len(lengths), hv), 0)
    assert_close(out_new, exp_out, TOL_BF16, "bf16-tile output vs float64")
    assert_close(st_new, exp_state, TOL_BF16, "bf16-tile state vs float64")
    assert_same_bits(host(st_new)[nslots - 1], untouched, "slot outside every segment")
    if not LOCALS[local]:
        _assert_equal_values(out_new, out_old, "bf16-tile vs fp32-tile output")
        _assert_equal_values(st_new, st_old, "bf16-tile vs fp32-tile state")
        return
    assert_close(out_new, host(out_old), TOL_BF16, "pair local vs fp32-tile output")
    assert_close(st_new, host(st_old), TOL_BF16, "pair local vs fp32-tile state")
    for what, new, old, exp in (("output", out_new, out_old, exp_out),
                                ("state", st_new, st_old, exp_state)):
        e_new, e_old = rel_err(new, exp), rel_err(old, exp)
        assert e_new <= 1.5 * e_old + 1e-3, f"{what}: pair local {e_new:.3e} vs old {e_old:.3e}"


@pytest.mark.parametrize("local", LOCALS)
@pytest.mark.parametrize("bf16_cols", BF16_COLS)
@pytest.mark.parametrize("n", [1, 63, 64, 65, 200, 1000])
def test_bf16_tiles_odd_lengths(rng, local, bf16_cols, n):
    """One segment of n tokens (a partial first / last chunk) against float64."""
    hk, hv, dk, dv = 2, 4, 128, 128
    q, k, v, g, beta = gdn_inputs(rng, n, hk, hv, dk, dv, 0.1)
    starts, seg_slots = segments((n,), (1,))
    st_h, st_d, _ = slot_strided(rng, 2, (hv, dk, dv), scale=0.1)
    exp_out, exp_state = ref.gdn_recurrence(q, k, v, g, beta, st_h, starts, seg_slots)
    out = poisoned((n, hv, dv))
    _run([dev(a) for a in (q, k, v, g, beta)], st_d, starts, seg_slots, out,
         _poisoned_workspace16(n, 1, hv), bf16_cols, LOCALS[local])
    assert_close(out, exp_out, TOL_BF16, f"output, T={n}")
    assert_close(st_d, exp_state, TOL_BF16, f"state, T={n}")


@pytest.mark.parametrize("local", LOCALS)
@pytest.mark.parametrize("bf16_cols", BF16_COLS)
@pytest.mark.parametrize("cuts", [(64,), (128, 192), (64, 256)])
def test_bf16_tiles_split_bitwise(rng, local, bf16_cols, cuts):
    """A prompt cut at multiples of 64 tokens: output and state bitwise those of the whole."""
    n, hk, hv, dk, dv = 301, 2, 4, 128, 128
    q, k, v, g, beta = gdn_inputs(rng, n, hk, hv, dk, dv, 0.1)
    _, st_whole, _ = slot_strided(rng, 2, (hv, dk, dv), scale=0.1)
    st_split = cp().ascontiguousarray(st_whole)
    ws = _poisoned_workspace16(n, 1, hv)
    slot = np.array([1], np.int32)
    whole = poisoned((n, hv, dv))
    _run([dev(a) for a in (q, k, v, g, beta)], st_whole, np.array([0, n], np.int32), slot,
         whole, ws, bf16_cols, LOCALS[local])
    split = poisoned((n, hv, dv))
    bounds = (0,) + tuple(cuts) + (n,)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        _run([dev(a[lo:hi]) for a in (q, k, v, g, beta)], st_split,
             np.array([0, hi - lo], np.int32), slot, split[lo:hi], ws, bf16_cols,
             LOCALS[local])
    assert_same_bits(split, whole, "output")
    assert_same_bits(st_split, st_whole, "state")


@pytest.mark.parametrize("local", LOCALS)
def test_bf16_tiles_unaligned_qk(rng, local):
    """q / k (and, pair local, v) views with odd strides (4-byte copies in the local kernel)."""
    hk, hv, dk, dv, lengths = 2, 4, 128, 128, (77, 130)
    starts, seg_slots = segments(lengths, (0, 1))
    n = int(starts[-1])
    q, k, v, g, beta = gdn_inputs(rng, n, hk, hv, dk, dv, 0.1)
    st_h, st_d, _ = slot_strided(rng, 2, (hv, dk, dv), scale=0.1)
    exp_out, exp_state = ref.gdn_recurrence(q, k, v, g, beta, st_h, starts, seg_slots)
    out = poisoned((n, hv, dv))
    _run([_unaligned(q), _unaligned(k), _unaligned(v), dev(g), dev(beta)], st_d, starts,
         seg_slots, out, _poisoned_workspace16(n, 2, hv), 32, LOCALS[local])
    assert_close(out, exp_out, TOL_BF16, "output")
    assert_close(st_d, exp_state, TOL_BF16, "state")


def test_pair_local_workspaces_vs_local16(rng):
    """The two bf16-tile local kernels on the same chunks write the same workspaces up to
    rounding: G and P bitwise (same formulas, same bf16 products), K e^{G_L - G} and Q e^G
    bitwise, U within 1e-4 and -W within bf16 rounding (2e-2 elementwise relative, 1e-2 in norm)
    of each other; rows < L of each chunk only (the rest is not written)."""
    hk, hv, dk, dv, lengths = 2, 4, 128, 128, (200, 63)
    starts, seg_slots = segments(lengths, (0, 1))
    n = int(starts[-1])
    args = [dev(a) for a in gdn_inputs(rng, n, hk, hv, dk, dv, 0.1)]
    wss = []
    for local_pair in (True, False):
        _, st, _ = slot_strided(rng, 2, (hv, dk, dv), scale=0.1)
        ws = _poisoned_workspace16(n, 2, hv)
        _run(args, st, starts, seg_slots, poisoned((n, hv, dv)), ws, 32, local_pair)
        wss.append(ws)
    pair, old = wss
    for what in ("gam", "p", "qg"):
        a, b = host(getattr(pair, what)), host(getattr(old, what))
        if what == "p":  # chunks of the two segments: 4 + 1
            a, b = a[:5], b[:5]
        bits = np.uint16 if a.dtype == np.uint16 else np.uint32
        bad = np.flatnonzero(a.view(bits) != b.view(bits))
        assert bad.size == 0, f"{what}: {bad.size} of {a.size} differ, first at {bad[0]}"
    assert_close(pair.u, host(old.u), 1e-4, "U pair vs local16")
    w_pair = host(pair.w).view(np.uint16).reshape(n, hv, 2 * 128)
    w_old = host(old.w).view(np.uint16).reshape(n, hv, 2 * 128)
    assert np.array_equal(w_pair[:, :, 128:], w_old[:, :, 128:]), "K e^{G_L - G}"

    def f32(bits):
        return (bits.astype(np.uint32) << 16).view(np.float32)

    assert_close(f32(w_pair[:, :, :128]), f32(w_old[:, :, :128]), 1e-2, "-W pair vs local16")
