"""kv_write and paged_attention on the GPU.

paged_attention: float64 oracle (on the pages as stored: bf16 pages are compared with the oracle
on the bf16 values) over contexts in every chunk-size regime (64-key chunks up to 4096 keys, then
ceil(len / 64) rounded up to 64; one and several 8-chunk merge groups), GQA groups 1..8, head
dims 32..256, f32/bf16 pages, power-of-two and other page sizes, strided q and out; bitwise
batch invariance (a row alone == the same row in any batch, split (decode) mode == loop (prefill)
mode); invalid rows/pages -> NaN rows only; workspace counters back at 0 after every launch;
workspace too small -> InvalidInput.

The MMA variant (bf16 pages, D 64..256, <= 8 heads per KV head; katt.use_mma) is the default
for those shapes; tests that force either path monkeypatch katt.MMA (NINFER_ATTN_MMA at
import). It is held to TOL_MMA and its error is printed next to the FMA path's."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer import ops
from ninfer.core.dtypes import f32_to_bf16_bits
from ninfer.errors import InvalidInput
from ninfer.kernels_cuda import attention as katt
from ninfer.ops import reference as ref

from cuda_testutil import (LONG_GRAIN_CHANGED, LONG_GRAIN_SAME, builds_same_bits,
                           assert_attention_graph_replay, assert_close, assert_same_bits, cp,
                           decode_rows, dev, differs, host, assert_invalid_attention_rows_nan,
                           nan_own_key_slots, poisoned, random_block_tables, randn, rel_err,
                           use_long_grain_build)

pytestmark = pytest.mark.gpu

TOL = 1e-5  # vs float64 on the stored K/V (bf16 pages: the oracle sees the same bf16 values)
# MMA path: q and p as bf16 hi + lo terms (~2^-17 relative each) and tensor-core f32
# accumulation; expected ~1e-5, so a looser bound than the FMA path
TOL_MMA = 5e-5
# lengths across the chunk regimes: 1 chunk, 64-key chunks (1..8 groups), chunks of 128 / 192
REGIME_LENGTHS = [1, 63, 64, 65, 1000, 4096, 4097, 5000, 9000]


@pytest.fixture(autouse=True)
def _no_tma(monkeypatch):
    """These tests hold the FMA / MMA kernels to their contract (split == loop mode bitwise);
    the NINFER_ATTN_TMA kernel has its own file (test_cuda_attention_tma.py)."""
    monkeypatch.setattr(katt, "TMA", False)


def _tol(bf16, heads, hkv, d):
    mma = katt.use_mma(katt.C.WKind.BF16 if bf16 else katt.C.WKind.F32, heads // hkv, d)
    return TOL_MMA if mma else TOL


def _pages(rng, num_pages, hkv, page_size, d, bf16):
    values = randn(rng, (num_pages, hkv, page_size, d))
    return f32_to_bf16_bits(values) if bf16 else values


class _Kv:
    """Random paged K/V for sequences of `lengths` (host copies, device copies, f64 oracle)."""

    def __init__(self, rng, lengths, hkv, d, bf16, page_size=16, spare_cols=2):
        self.page_size = page_size
        pages = sum(-(-n // page_size) for n in lengths) + 3
        self.kp = _pages(rng, pages, hkv, page_size, d, bf16)
        self.vp = _pages(rng, pages, hkv, page_size, d, bf16)
        cols = -(-max(lengths) // page_size) + spare_cols
        self.bt = random_block_tables(rng, lengths, page_size, pages, cols)
        self.kp_d, self.vp_d, self.bt_d = dev(self.kp), dev(self.vp), dev(self.bt)
        self._k64 = self._v64 = None

    def oracle(self, q, row_seq, row_pos, scale):
        if self._k64 is None:  # widen once (ref.paged_attention takes float64 pages as is)
            self._k64, self._v64 = ref.pages_f64(self.kp), ref.pages_f64(self.vp)
        return ref.paged_attention(q, self._k64, self._v64, self.bt, row_seq, row_pos, scale)

    def run(self, q_d, row_seq, row_pos, scale, out=None, workspace=None, **kw):
        n, heads, d = q_d.shape
        out = poisoned((n, heads, d)) if out is None else out
        katt.paged_attention(q_d, self.kp_d, self.vp_d, self.bt_d, dev(np.asarray(row_seq,
                             np.int32)), dev(np.asarray(row_pos, np.int32)), scale, out,
                             workspace=workspace, **kw)
        return out


@pytest.mark.parametrize("bf16", [False, True])
def test_kv_write(rng, bf16):
    hkv, page_size, d, num_pages = 2, 16, 64, 12
    kp_h = _pages(rng, num_pages, hkv, page_size, d, bf16)
    vp_h = _pages(rng, num_pages, hkv, page_size, d, bf16)
    bt = random_block_tables(rng, [40, 20], page_size, num_pages, 4)
    row_seq = np.array([0, 1, 0, 1, 0], np.int32)
    row_pos = np.array([0, 19, 17, 3, 39], np.int32)
    k_full = randn(rng, (5, hkv, d + 3))  # k as a strided view of a wider buffer
    k_h = k_full[:, :, 1:1 + d]
    v_h = randn(rng, (5, hkv, d))
    kp_d, vp_d = dev(kp_h), dev(vp_h)
    ops.kv_write(dev(k_full)[:, :, 1:1 + d], dev(v_h), kp_d, vp_d, dev(bt), dev(row_seq),
                 dev(row_pos))
    exp_k, exp_v = ref.kv_write(k_h, v_h, kp_h, vp_h, bt, row_seq, row_pos)
    assert_same_bits(kp_d, exp_k, "k pages")
    assert_same_bits(vp_d, exp_v, "v pages")


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("heads,hkv", [(16, 4), (16, 2)])  # 9B (G=4), 35B-A3B (G=8)
def test_paged_attention_regimes_vs_float64(rng, bf16, heads, hkv):
    d = 256
    kv = _Kv(rng, REGIME_LENGTHS, hkv, d, bf16)
    seqs = list(range(len(REGIME_LENGTHS)))
    # the last position of every sequence, plus chunk / group boundaries of the longest ones
    row_seq = seqs + [8, 8, 8, 5, 5, 6]
    row_pos = [n - 1 for n in REGIME_LENGTHS] + [511, 512, 4095, 2047, 2048, 4096]
    n = len(row_seq)
    q_full = randn(rng, (n, heads, 2 * d), 2.0)  # q half of an interleaved [q | gate] buffer
    scale = d ** -0.5
    out = kv.run(dev(q_full)[:, :, :d], row_seq, row_pos, scale)
    expect = kv.oracle(q_full[:, :, :d], np.array(row_seq), np.array(row_pos), scale)
    o = host(out)
    for i in range(n):
        assert_close(o[i], expect[i], _tol(bf16, heads, hkv, d), f"row {i} (len {row_pos[i] + 1})")


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("heads,hkv,d", [(4, 4, 64), (8, 4, 128), (6, 2, 256), (24, 4, 256),
                                         (10, 2, 32), (7, 1, 64), (16, 2, 128)])
@pytest.mark.parametrize("page_size", [16, 12])
def test_paged_attention_vs_float64(rng, bf16, heads, hkv, d, page_size):
    lengths = [1, 37, 300, 700, 1500]
    kv = _Kv(rng, lengths, hkv, d, bf16, page_size)
    # rows: the last position of each sequence plus some earlier ones (prefill-like rows)
    row_seq = np.array([0, 1, 2, 3, 3, 2, 1, 4, 4], np.int32)
    row_pos = np.array([0, 36, 299, 699, 255, 256, 5, 1499, 511], np.int32)
    n = len(row_seq)
    q_full = randn(rng, (n, heads, 2 * d))
    q_d = dev(q_full)[:, :, :d]
    scale = d ** -0.5
    out = poisoned((n, heads, d))
    ops.paged_attention(q_d, kv.kp_d, kv.vp_d, kv.bt_d, dev(row_seq), dev(row_pos), scale, out)
    assert_close(out, kv.oracle(q_full[:, :, :d], row_seq, row_pos, scale),
                 _tol(bf16, heads, hkv, d))
    out_full = poisoned((n, heads, d + 8))  # the launcher also takes strided out rows/heads
    kv.run(q_d, row_seq, row_pos, scale, out=out_full[:, :, 4:4 + d])
    assert_same_bits(out_full[:, :, 4:4 + d], out, "strided out")
    assert np.isnan(host(out_full)[:, :, :4]).all() and np.isnan(host(out_full)[:, :, -4:]).all()


@pytest.mark.parametrize("mma", [True, False])
@pytest.mark.parametrize("heads,hkv,d,bf16", [(16, 4, 256, True), (24, 4, 256, True),
                                              (8, 2, 128, False), (16, 2, 64, True)])
def test_paged_attention_bitwise_batch_invariance(rng, monkeypatch, heads, hkv, d, bf16, mma):
    """A row's bits do not depend on the batch: alone, in any subset, in split (decode) and in
    loop (prefill) mode, and across repeated launches sharing one workspace (both paths)."""
    monkeypatch.setattr(katt, "MMA", mma)
    lengths = [9000, 33, 512, 4097, 65, 1]
    kv = _Kv(rng, lengths, hkv, d, bf16)
    row_seq = np.array([0, 1, 2, 0, 3, 4, 5, 0, 3], np.int32)
    row_pos = np.array([8999, 32, 511, 400, 4096, 64, 0, 4095, 63], np.int32)
    n = len(row_seq)
    q = dev(randn(rng, (n, heads, d), 2.0))
    scale = d ** -0.5
    ws = katt.AttentionWorkspace.allocate(16, heads, d, kv.bt.shape[1] * kv.page_size)
    batch = kv.run(q, row_seq, row_pos, scale, workspace=ws)
    assert np.isfinite(host(batch)).all()
    for rows in ([0], [6], [2, 3], [8, 1, 4], list(range(n))[::-1]):
        part = kv.run(q[rows], row_seq[rows], row_pos[rows], scale, workspace=ws)
        assert_same_bits(part, batch[rows], f"rows {rows}")
    again = kv.run(q, row_seq, row_pos, scale, workspace=ws)  # counters were reset
    assert_same_bits(again, batch, "repeated launch")
    assert not host(ws.counters).any(), "workspace counters must be 0 after a launch"
    # without a workspace (allocated per call)
    assert_same_bits(kv.run(q[[4]], row_seq[[4]], row_pos[[4]], scale), batch[[4]], "no ws")
    # loop mode: a prefill-sized call, and a small call forced into loop mode
    many = katt.SPLIT_MAX_ROWS + 7
    pick = rng.integers(0, n, many)
    pick[:n] = np.arange(n)
    big = kv.run(q[pick], row_seq[pick], row_pos[pick], scale)
    assert_same_bits(big[:n], batch, "loop mode (N > SPLIT_MAX_ROWS) vs split mode")
    monkeypatch.setattr(katt, "SPLIT_MAX_ROWS", 0)
    loop = kv.run(q, row_seq, row_pos, scale)
    assert_same_bits(loop, batch, "loop mode vs split mode")


@pytest.mark.parametrize("mma", [True, False])
@pytest.mark.parametrize("heads,hkv,d,bf16", [(16, 4, 256, True), (8, 2, 128, False)])
def test_long_grain_vs_float64_and_the_default_build(rng, monkeypatch, heads, hkv, d, bf16, mma):
    """NINFER_ATTN_CHUNK_GRAIN_LONG = 256 (the build with ATTN_CHUNK_GRAIN_LONG): rows whose
    chunking it changes match the float64 oracle and differ from the default build's bits;
    rows whose chunking it keeps are bitwise the default build's; a row alone == the row in
    the batch, and split == loop mode, bitwise; counters 0 after."""
    if katt.CHUNK_GRAIN != 64:
        pytest.skip("the row lengths are those of grain 64")
    monkeypatch.setattr(katt, "MMA", mma)
    lengths = LONG_GRAIN_CHANGED + LONG_GRAIN_SAME
    kv = _Kv(rng, lengths, hkv, d, bf16)
    n = len(lengths)
    row_seq, row_pos = np.arange(n, dtype=np.int32), np.array(lengths, np.int32) - 1
    q = dev(randn(rng, (n, heads, d), 2.0))
    scale = d ** -0.5
    ws = katt.AttentionWorkspace.allocate(n, heads, d, kv.bt.shape[1] * kv.page_size)
    default = kv.run(q, row_seq, row_pos, scale, workspace=ws)
    use_long_grain_build(monkeypatch)
    batch = kv.run(q, row_seq, row_pos, scale, workspace=ws)
    got = host(batch)
    expect = kv.oracle(host(q), row_seq, row_pos, scale)
    for i, length in enumerate(lengths):
        assert_close(got[i], expect[i], _tol(bf16, heads, hkv, d), f"len {length}")
        if length in LONG_GRAIN_SAME:
            assert_same_bits(batch[i], default[i], f"len {length}: its chunks are unchanged")
        else:
            assert differs(batch[i], default[i]), f"len {length}: the long grain changed nothing"
    for r in (0, 2, 5):
        alone = kv.run(q[[r]], row_seq[[r]], row_pos[[r]], scale, workspace=ws)
        assert_same_bits(alone, batch[[r]], f"len {lengths[r]} alone vs in the batch")
    assert not host(ws.counters).any(), "workspace counters must be 0 after a launch"
    monkeypatch.setattr(katt, "SPLIT_MAX_ROWS", 0)
    assert_same_bits(kv.run(q, row_seq, row_pos, scale), batch, "loop mode vs split mode")


# G = 1, 2, 3 (GW 1 / 3 / 2 heads per warp), 4, 5, 6, 8 (8-warp blocks); f32 and bf16 pages
@pytest.mark.parametrize("heads,hkv,d,bf16", [(4, 4, 64, True), (8, 4, 128, False),
                                              (6, 2, 256, True), (16, 4, 256, True),
                                              (10, 2, 64, True), (12, 2, 128, False),
                                              (16, 2, 256, True), (16, 2, 256, False)])
@pytest.mark.parametrize("split", [True, False])
def test_past_kv_ready_same_bits(rng, monkeypatch, heads, hkv, d, bf16, split):
    """past_kv_ready (the first K / V tiles read before the PDL wait) changes no bit: decode
    rows (one per sequence) whose own key falls at every place of a tile, a warp's tile pair
    and a chunk (first / last key of a tile, lengths 1..9, 31..33, 63..65, several chunks and
    merge groups), an invalid row (NaN), with and without the output gate; split and loop
    mode; and within float64 tolerance."""
    monkeypatch.setattr(katt, "MMA", False)
    monkeypatch.setattr(katt, "PREWAIT", True)  # whatever NINFER_ATTN_PREWAIT says
    if not split:
        monkeypatch.setattr(katt, "SPLIT_MAX_ROWS", 0)
    lengths = [1, 2, 7, 8, 9, 16, 17, 31, 32, 33, 63, 64, 65, 96, 127, 129, 1025, 4097, 9000]
    kv = _Kv(rng, lengths, hkv, d, bf16)
    # an invalid row: NaN in both
    row_seq, row_pos, q, gate = decode_rows(rng, lengths, heads, d, (len(lengths) + 5, 3))
    n = len(row_seq)
    scale = d ** -0.5
    ws = katt.AttentionWorkspace.allocate(n, heads, d, kv.bt.shape[1] * kv.page_size)
    for g in (None, gate):
        plain = kv.run(q, row_seq, row_pos, scale, workspace=ws, gate=g)
        early = kv.run(q, row_seq, row_pos, scale, workspace=ws, gate=g, past_kv_ready=True)
        assert_same_bits(early, plain, f"past_kv_ready, gate {g is not None}")
        assert np.isnan(host(early)[-1]).all() and np.isfinite(host(early)[:-1]).all()
    assert not host(ws.counters).any(), "workspace counters must be 0 after a launch"
    want = kv.oracle(host(q)[:-1], row_seq[:-1], row_pos[:-1], scale)
    got = kv.run(q[:-1], row_seq[:-1], row_pos[:-1], scale, workspace=ws, past_kv_ready=True)
    assert_close(got, want, _tol(bf16, heads, hkv, d))


@pytest.mark.parametrize("heads,hkv,d", [(16, 4, 256), (16, 2, 256), (6, 2, 128)])
def test_past_kv_ready_sees_the_key_written_just_before(rng, monkeypatch, heads, hkv, d):
    """The row's own key is written by the kernel launched just before (kv_write, PDL): with
    past_kv_ready the attention still reads it after its wait. The slot starts as NaN, so an
    early read of it would make the row NaN; the result matches the oracle on the new key."""
    monkeypatch.setattr(katt, "MMA", False)
    monkeypatch.setattr(katt, "PREWAIT", True)
    lengths = [1, 8, 9, 33, 64, 65, 1025, 3000]
    kv = _Kv(rng, lengths, hkv, d, True)
    row_seq = np.arange(len(lengths), dtype=np.int32)
    row_pos = np.array(lengths, np.int32) - 1
    n = len(lengths)
    kp, vp = nan_own_key_slots(kv.kp, kv.vp, kv.bt, row_seq, row_pos)
    kv.kp_d, kv.vp_d = dev(kp), dev(vp)
    k_new, v_new = randn(rng, (n, hkv, d)), randn(rng, (n, hkv, d))
    q = dev(randn(rng, (n, heads, d), 2.0))
    ws = katt.AttentionWorkspace.allocate(n, heads, d, kv.bt.shape[1] * kv.page_size)
    seq_d, pos_d = dev(row_seq), dev(row_pos)
    for _ in range(3):
        katt.kv_write(dev(k_new), dev(v_new), kv.kp_d, kv.vp_d, kv.bt_d, seq_d, pos_d)
        got = kv.run(q, row_seq, row_pos, d ** -0.5, workspace=ws, past_kv_ready=True)
        kv.kp_d[...] = dev(kp)  # NaN again for the next round
        kv.vp_d[...] = dev(vp)
    kv.kp, kv.vp = ref.kv_write(k_new, v_new, kp, vp, kv.bt, row_seq, row_pos)
    kv._k64 = None
    assert np.isfinite(host(got)).all()
    assert_close(got, kv.oracle(host(q), row_seq, row_pos, d ** -0.5), TOL)


@pytest.mark.parametrize("heads,hkv,d,bf16,mma", [(16, 4, 256, True, False),
                                                   (16, 4, 256, True, True),
                                                   (16, 2, 256, True, False),
                                                   (12, 2, 128, False, False)])
def test_acq_rel_counting_same_bits(rng, monkeypatch, heads, hkv, d, bf16, mma):
    """NINFER_ATTN_ACQ_REL (the split mode counts its partials with one acquire-release atomic
    per block: SOURCE_ACQ_REL) gives the fenced build's bits: rows of one chunk, of one and of
    several merge groups, at B=1 and B=9, gated, past_kv_ready, an invalid row; the counters
    are 0 after every launch."""
    monkeypatch.setattr(katt, "MERGE_KERNEL", 0)  # the in-kernel merges count
    monkeypatch.setattr(katt, "MMA", mma)
    monkeypatch.setattr(katt, "PREWAIT", True)
    lengths = [1, 64, 65, 513, 1025, 4097, 9000, 33000]
    kv = _Kv(rng, lengths, hkv, d, bf16)
    # and an invalid row
    row_seq, row_pos, q, gate = decode_rows(rng, lengths, heads, d, (len(lengths) + 3, 5))
    n = len(row_seq)
    ws = katt.AttentionWorkspace.allocate(n, heads, d, kv.bt.shape[1] * kv.page_size)

    def launch(rows, batched):
        return kv.run(q[rows], row_seq[rows], row_pos[rows], d ** -0.5, workspace=ws,
                      gate=gate if batched else None, past_kv_ready=batched)

    o = host(builds_same_bits(monkeypatch, "ACQ_REL", (True, False), launch, n, (0, 4, 7),
                              ws.counters))
    assert np.isnan(o[-1]).all() and np.isfinite(o[:-1]).all()


# one chunk; 2..8 chunks (one merge group); 9..64 chunks (2..8 groups): every group count
MERGE_LENGTHS = [1, 64, 65, 100, 512, 513, 1025, 1600, 2100, 2600, 3100, 3584, 3585, 4096, 4097,
                 9000, 33000]


@pytest.mark.parametrize("heads,hkv,d,bf16,mma", [(16, 4, 256, True, False),
                                                   (16, 4, 256, True, True),
                                                   (16, 2, 256, True, False),
                                                   (12, 2, 128, False, False),
                                                   (6, 2, 32, True, False)])
def test_merge_kernel_same_bits(rng, monkeypatch, heads, hkv, d, bf16, mma):
    """NINFER_ATTN_MERGE_KERNEL 1, 2 and 3 (the blocks store their partials; attn_merge_kernel
    merges them) give the in-kernel merges' bits: rows of one chunk and of 1..8 merge groups,
    at B=1 and batched, gated, past_kv_ready, an invalid row (NaN); the counters stay 0; and
    the float64 oracle."""
    monkeypatch.setattr(katt, "MMA", mma)
    monkeypatch.setattr(katt, "PREWAIT", True)
    kv = _Kv(rng, MERGE_LENGTHS, hkv, d, bf16)
    row_seq, row_pos, q, gate = decode_rows(rng, MERGE_LENGTHS, heads, d,
                                            (len(MERGE_LENGTHS) + 3, 5))
    n = len(row_seq)
    assert sorted({katt.num_chunks(x) for x in MERGE_LENGTHS} - {1})[:2] == [2, 8]
    assert {-(-katt.num_chunks(x) // katt.GROUP) for x in MERGE_LENGTHS} == set(range(1, 9))
    ws = katt.AttentionWorkspace.allocate(n, heads, d, kv.bt.shape[1] * kv.page_size)

    def launch(rows, batched):
        return kv.run(q[rows], row_seq[rows], row_pos[rows], d ** -0.5, workspace=ws,
                      gate=gate if batched else None, past_kv_ready=batched)

    o = host(builds_same_bits(monkeypatch, "MERGE_KERNEL", (0, 1, 2, 3), launch, n,
                              (0, 3, 9, 16), ws.counters))
    assert np.isnan(o[-1]).all() and np.isfinite(o[:-1]).all()
    monkeypatch.setattr(katt, "MERGE_KERNEL", 1)
    got = host(kv.run(q, row_seq, row_pos, d ** -0.5, workspace=ws))[:-1]
    expect = kv.oracle(host(q)[:-1], row_seq[:-1], row_pos[:-1], d ** -0.5)
    for i, length in enumerate(MERGE_LENGTHS):
        assert_close(got[i], expect[i], _tol(bf16, heads, hkv, d), f"len {length}")


@pytest.mark.parametrize("split", [True, False])
def test_invalid_rows_and_pages_give_nan(rng, monkeypatch, split):
    heads, hkv, d, page_size = 8, 2, 128, 16
    lengths = [3000, 100]
    kv = _Kv(rng, lengths, hkv, d, True, page_size)
    if not split:
        monkeypatch.setattr(katt, "SPLIT_MAX_ROWS", 0)
    ws = katt.AttentionWorkspace.allocate(7, heads, d, kv.bt.shape[1] * page_size)
    assert_invalid_attention_rows_nan(rng, kv.kp_d, kv.vp_d, kv.bt, page_size, heads, d, ws)


def test_workspace_too_small_raises(rng):
    heads, hkv, d = 8, 2, 64
    kv = _Kv(rng, [5000], hkv, d, False)
    max_context = kv.bt.shape[1] * kv.page_size
    q = dev(randn(rng, (4, heads, d)))
    rows = np.zeros(4, np.int32), np.full(4, 4999, np.int32)
    for ws in (katt.AttentionWorkspace.allocate(4, heads, d, 1024),  # too few chunks
               katt.AttentionWorkspace.allocate(3, heads, d, max_context),  # too few rows
               katt.AttentionWorkspace.allocate(4, heads // 2, d, max_context),  # wrong heads
               katt.AttentionWorkspace.allocate(4, heads, 2 * d, max_context)):  # wrong dim
        with pytest.raises(InvalidInput, match="workspace"):
            kv.run(q, *rows, d ** -0.5, workspace=ws)
    ok = katt.AttentionWorkspace.allocate(4, heads, d, max_context)
    assert np.isfinite(host(kv.run(q, *rows, d ** -0.5, workspace=ok))).all()


# odd lengths around tiles (16 keys), chunks (64), pages (16 / 12) and merge groups (512)
MMA_LENGTHS = [1, 2, 15, 16, 17, 31, 63, 64, 65, 127, 129, 511, 513, 1000, 4097]


@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("d", [64, 128, 256])
def test_mma_path_vs_float64_and_fma(rng, monkeypatch, group, d):
    """MMA variant (bf16 pages) vs the float64 oracle over odd lengths, page boundaries and rows
    of different lengths in one launch, GQA groups 1/2/4/8; the FMA path on the same inputs for
    comparison; split == loop mode bitwise for the MMA path."""
    hkv = 2
    heads = group * hkv
    page_size = 12 if d == 128 else 16
    kv = _Kv(rng, MMA_LENGTHS, hkv, d, True, page_size)
    seqs = list(range(len(MMA_LENGTHS)))
    row_seq = np.array(seqs + [14, 14, 13, 12], np.int32)
    row_pos = np.array([n - 1 for n in MMA_LENGTHS] + [page_size - 1, page_size, 511, 191],
                       np.int32)
    n = len(row_seq)
    q_h = randn(rng, (n, heads, d), 2.0)
    q = dev(q_h)
    scale = d ** -0.5
    expect = kv.oracle(q_h, row_seq, row_pos, scale)
    assert katt.use_mma(katt.C.WKind.BF16, group, d) == katt.MMA
    monkeypatch.setattr(katt, "MMA", True)
    mma = host(kv.run(q, row_seq, row_pos, scale))
    monkeypatch.setattr(katt, "MMA", False)
    fma = host(kv.run(q, row_seq, row_pos, scale))
    errs = [(rel_err(mma[i], expect[i]), rel_err(fma[i], expect[i])) for i in range(n)]
    print(f"G={group} D={d}: max rel err mma {max(e[0] for e in errs):.2e}, "
          f"fma {max(e[1] for e in errs):.2e}")
    for i in range(n):
        assert_close(mma[i], expect[i], TOL_MMA, f"mma row {i} (len {row_pos[i] + 1})")
        assert_close(fma[i], expect[i], TOL, f"fma row {i} (len {row_pos[i] + 1})")
    monkeypatch.setattr(katt, "MMA", True)
    monkeypatch.setattr(katt, "SPLIT_MAX_ROWS", 0)
    assert_same_bits(kv.run(q, row_seq, row_pos, scale), mma, "mma loop mode vs split mode")


@pytest.mark.parametrize("mma,merge", [(True, 2), (False, 2), (False, 1), (False, 3), (True, 3), (False, 0)])
def test_graph_replay_equals_eager_bitwise(rng, monkeypatch, mma, merge):
    """A B=8 decode launch (9B shape, bf16 pages; with NINFER_ATTN_MERGE_KERNEL 1 / 2 / 3 the
    attention kernel, then the merge kernel) captured in a CUDA graph and replayed with new q
    gives the eager bits; the workspace counters stay 0."""
    from ninfer.core.cuda import DeviceContext

    monkeypatch.setattr(katt, "MMA", mma)
    monkeypatch.setattr(katt, "MERGE_KERNEL", merge)
    heads, hkv, d = 16, 4, 256
    lengths = [1024, 1023, 1, 77, 4096, 600, 2049, 33000]
    ctx = DeviceContext(0)
    with ctx.activate():
        kv = _Kv(rng, lengths, hkv, d, True)
        ws = katt.AttentionWorkspace.allocate(8, heads, d, kv.bt.shape[1] * kv.page_size)
        assert_attention_graph_replay(ctx, rng, "paged_attention", kv.kp_d, kv.vp_d, kv.bt_d,
                                      lengths, heads, d, ws)


# -- the fused output gate (gate=): out = attention * sigmoid(gate) --------------------------------

# one chunk (<= 64 keys), several chunks in one merge group, several groups (> 512 keys), chunks
# of 128 keys (> 4096 keys)
GATE_LENGTHS = [1, 37, 64, 65, 300, 700, 4097, 5000]
# batches of rows (indices into GATE_LENGTHS, one sequence each): B = 1 short / medium / long,
# B = 3, B = 8 (all, in order: q and the gate are then views of the whole projection)
GATE_BATCHES = [[1], [5], [7], [6, 2, 5], list(range(len(GATE_LENGTHS)))]


def _qkv_proj(rng, n, heads, hkv, d):
    """(host, device) of the model's qkv projection output [n, 2 A D + 2 Hkv D]; the q / gate
    halves are views of q_and_gate = proj[:, :2 A D].reshape(n, A, 2 D) (per head [q_h | gate_h]).
    The gate spans sigmoid's range, with a few saturating values (exp overflow / underflow)."""
    width = 2 * heads * d + 2 * hkv * d
    proj = randn(rng, (n, width), 2.0)
    gate = proj[:, :2 * heads * d].reshape(n, heads, 2 * d)[:, :, d:]
    assert np.shares_memory(gate, proj)
    gate *= 1.5
    picks = np.unravel_index(rng.choice(gate.size, 8, replace=False), gate.shape)
    gate[picks] = np.array([-100.0, 100.0, -90.0, 89.0, -20.0, 20.0, -0.0, 0.0], np.float32)
    return proj, dev(proj)


def _q_gate(proj, heads, d):
    qg = proj[:, :2 * heads * d].reshape(proj.shape[0], heads, 2 * d)
    return qg[:, :, :d], qg[:, :, d:]


def _then_sigmoid_mul(attn, gate):
    """The unfused decode path: the gate copied out contiguously (as attn_prep does), then
    sigmoid_mul over [N, A * D] (the CUDA sigmoid_mul is 2-D)."""
    n = attn.shape[0]
    gate_c = cp().ascontiguousarray(gate)
    out = poisoned(attn.shape)
    ops.sigmoid_mul(attn.reshape(n, -1), gate_c.reshape(n, -1), out.reshape(n, -1))
    return out


@pytest.mark.parametrize("heads,hkv,d,bf16,mma", [
    (16, 4, 256, True, True), (16, 4, 256, True, False),  # 9B: G = 4, D = 256, bf16 pages
    (6, 2, 128, True, True), (6, 2, 128, True, False),     # G = 3
    (10, 2, 64, False, False),                             # G = 5 (one warp per head), f32
])
def test_gated_attention_equals_attention_then_sigmoid_mul(rng, monkeypatch, heads, hkv, d,
                                                           bf16, mma):
    """paged_attention(..., gate=) is bitwise paged_attention then sigmoid_mul, for B = 1, 3, 8,
    rows of one chunk, of several chunks in one group, of several merge groups and of > 4096
    keys, in split (decode) and loop (prefill) mode, with the gate the strided half of the
    model's interleaved q projection; rows are batch invariant with the gate too; float64 oracle
    of attention * sigmoid(gate)."""
    monkeypatch.setattr(katt, "MMA", mma)
    split_rows = katt.SPLIT_MAX_ROWS
    kv = _Kv(rng, GATE_LENGTHS, hkv, d, bf16)
    n_all = len(GATE_LENGTHS)
    proj_h, proj_d = _qkv_proj(rng, n_all, heads, hkv, d)
    q_h, gate_h = _q_gate(proj_h, heads, d)
    q_d, gate_d = _q_gate(proj_d, heads, d)
    assert gate_d.data.ptr == proj_d.data.ptr + 4 * d and gate_d.strides[0] == proj_d.strides[0]
    row_seq = np.arange(n_all, dtype=np.int32)
    row_pos = np.array(GATE_LENGTHS, np.int32) - 1
    scale = d ** -0.5
    expect = ref.sigmoid_mul(kv.oracle(q_h, row_seq, row_pos, scale), gate_h)
    tol = _tol(bf16, heads, hkv, d)
    ws = katt.AttentionWorkspace.allocate(8, heads, d, kv.bt.shape[1] * kv.page_size)
    full = None
    for rows in GATE_BATCHES:
        b = len(rows)
        q, gate = (q_d, gate_d) if b == n_all else _q_gate(proj_d[rows], heads, d)
        seqs, pos = dev(row_seq[rows]), dev(row_pos[rows])
        what = f"B={b} lengths {[GATE_LENGTHS[r] for r in rows]}"
        plain = poisoned((b, heads, d))
        ops.paged_attention(q, kv.kp_d, kv.vp_d, kv.bt_d, seqs, pos, scale, plain, workspace=ws)
        two_ops = _then_sigmoid_mul(plain, gate)
        gated = poisoned((b, heads, d))
        ops.paged_attention(q, kv.kp_d, kv.vp_d, kv.bt_d, seqs, pos, scale, gated, workspace=ws,
                            gate=gate)
        assert_same_bits(gated, two_ops, f"{what}: gated vs attention then sigmoid_mul")
        assert not host(ws.counters).any(), f"{what}: workspace counters must be 0"
        monkeypatch.setattr(katt, "SPLIT_MAX_ROWS", 0)  # loop mode: the SPLIT=0 write
        loop = poisoned((b, heads, d))
        ops.paged_attention(q, kv.kp_d, kv.vp_d, kv.bt_d, seqs, pos, scale, loop, gate=gate)
        monkeypatch.setattr(katt, "SPLIT_MAX_ROWS", split_rows)
        assert_same_bits(loop, two_ops, f"{what}: gated loop mode vs attention then sigmoid_mul")
        g = host(gated)
        for i, r in enumerate(rows):
            assert_close(g[i], expect[r], tol, f"{what}: row of length {GATE_LENGTHS[r]}")
        if b == n_all:
            full = g
    for rows in GATE_BATCHES[:-1]:  # the same rows alone / in a smaller batch: the same bits
        q, gate = _q_gate(proj_d[rows], heads, d)
        part = poisoned((len(rows), heads, d))
        katt.paged_attention(q, kv.kp_d, kv.vp_d, kv.bt_d, dev(row_seq[rows]), dev(row_pos[rows]),
                             scale, part, workspace=ws, gate=gate)
        order = [GATE_BATCHES[-1].index(r) for r in rows]
        assert_same_bits(part, full[order], f"rows {rows} vs the B=8 batch (gated)")


@pytest.mark.parametrize("split", [True, False])
def test_gated_attention_invalid_rows_give_nan(rng, monkeypatch, split):
    """With a gate, an invalid row / page still gives a NaN row (NaN * sigmoid(g)) and only that
    row; valid rows equal attention then sigmoid_mul bitwise."""
    heads, hkv, d, page_size = 8, 2, 128, 16
    kv = _Kv(rng, [3000, 100], hkv, d, True, page_size)
    bad_bt = kv.bt.copy()
    bad_bt[0, 70] = kv.kp.shape[0] + 5
    bt_d = dev(bad_bt)
    if not split:
        monkeypatch.setattr(katt, "SPLIT_MAX_ROWS", 0)
    row_seq = np.array([0, 0, 1, 2], np.int32)
    row_pos = np.array([2999, 70 * page_size - 1, 99, 5], np.int32)
    n = len(row_seq)
    proj_h, proj_d = _qkv_proj(rng, n, heads, hkv, d)
    q, gate = _q_gate(proj_d, heads, d)
    ws = katt.AttentionWorkspace.allocate(n, heads, d, bad_bt.shape[1] * page_size)
    args = (q, kv.kp_d, kv.vp_d, bt_d, dev(row_seq), dev(row_pos), d ** -0.5)
    plain, gated = poisoned((n, heads, d)), poisoned((n, heads, d))
    katt.paged_attention(*args, plain, workspace=ws)
    katt.paged_attention(*args, gated, workspace=ws, gate=gate)
    two_ops = _then_sigmoid_mul(plain, gate)
    o = host(gated)
    for i in range(n):
        if i in (0, 3):
            assert np.isnan(o[i]).all(), f"row {i} should be NaN"
        else:
            assert np.isfinite(o[i]).all(), f"row {i} should be finite"
            assert_same_bits(gated[i], two_ops[i], f"row {i}")
    assert not host(ws.counters).any()


def test_gate_argument_checks(rng):
    """A wrong gate is rejected before any launch, naming the gate (kernel and ops layers)."""
    heads, hkv, d = 4, 2, 64
    kv = _Kv(rng, [100], hkv, d, False)
    q = dev(randn(rng, (2, heads, d)))
    rows = dev(np.zeros(2, np.int32)), dev(np.array([99, 50], np.int32))
    out = poisoned((2, heads, d))
    args = (q, kv.kp_d, kv.vp_d, kv.bt_d, *rows, d ** -0.5, out)
    bad = {
        "dtype float64": dev(randn(rng, (2, heads, d)).astype(np.float64)),
        "shape [2, A, D+1]": dev(randn(rng, (2, heads, d + 1))),
        "shape [3, A, D]": dev(randn(rng, (3, heads, d))),
        "shape [2, A/2, D]": dev(randn(rng, (2, heads // 2, d))),
        "last axis strided": dev(randn(rng, (2, heads, 2 * d)))[:, :, ::2],
        "host array": randn(rng, (2, heads, d)),
    }
    for what, gate in bad.items():
        with pytest.raises(InvalidInput, match="gate"):
            katt.paged_attention(*args, gate=gate)
        if what != "host array":  # ops: TypeError (dtype) / ValueError (shape, layout)
            with pytest.raises((TypeError, ValueError), match="gate"):
                ops.paged_attention(*args, gate=gate)
        else:
            with pytest.raises(TypeError, match="different backends"):
                ops.paged_attention(*args, gate=gate)
    assert np.isnan(host(out)).all(), "a rejected call must not launch"
