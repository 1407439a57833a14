"""paged_attention_tma_kernel (NINFER_ATTN_TMA) on the GPU: split-mode paged_attention over bf16
pages with the K / V tiles streamed by bulk copies into a shared-memory ring.

Every test forces the path (katt.TMA = True) and checks through a spy on get_function that the
TMA instance is the one launched. Pages are NaN / Inf-poisoned past every sequence's length
(the rest of its last page, and spare pages) and outputs NaN-poisoned before each run. Checked:
float64 oracle on the stored bf16 values (relative error per row; the MMA path's error on the
same inputs printed beside it) over lengths 1, 15, 16, 17, 1000, 4097, 33000, GQA groups 1, 3,
4, 6, 8, head dims 64 / 128 / 256, page sizes 16 and 32; bitwise batch invariance (a row alone,
in other batches, repeated); graph replay == eager bitwise; gate= == paged_attention then
sigmoid_mul bitwise; invalid rows / pages -> NaN rows only; workspace counters 0 after every
launch; ineligible pages (page_size 12) fall back to the other kernels.
"""
from __future__ import annotations

import numpy as np
import pytest
from cuda_testutil import (LONG_GRAIN_CHANGED, LONG_GRAIN_SAME, builds_same_bits,
                           assert_attention_graph_replay, assert_close, assert_same_bits, cp,
                           decode_rows, dev, differs, host, assert_invalid_attention_rows_nan,
                           nan_own_key_slots, poisoned, randn, rel_err, use_long_grain_build)

from ninfer import ops
from ninfer.core.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from ninfer.kernels_cuda import attention as katt
from ninfer.ops import reference as ref

pytestmark = pytest.mark.gpu

# q and p as bf16 hi + lo terms (~2^-17 relative each), f32 tensor-core accumulation (the MMA
# path's bound; expected ~1e-5)
TOL = 5e-5
LENGTHS = [1, 15, 16, 17, 1000, 4097, 33000]
POISON = (0x7FC0, 0xFFC1, 0x7F80)  # bf16 NaN, NaN, +Inf


@pytest.fixture
def tma(monkeypatch):
    """Forces the TMA path; returns the list of kernel instances fetched (launched) since."""
    monkeypatch.setattr(katt, "TMA", True)
    launched: list[str] = []
    real = katt.get_function

    def spy(source, name):
        launched.append(name)
        return real(source, name)

    monkeypatch.setattr(katt, "get_function", spy)
    return launched


class _Paged:
    """Random bf16 K / V pages for sequences of `lengths`, poisoned past each length; device
    copies; float64 oracle that gathers only the attended keys."""

    def __init__(self, rng, lengths, hkv, d, page_size=16, spare_cols=2):
        self.page_size, self.hkv, self.d = page_size, hkv, d
        used = [-(-n // page_size) for n in lengths]
        num_pages = sum(used) + 2  # two spare pages, all poison
        perm = rng.permutation(num_pages)
        self.bt = np.full((len(lengths), max(used) + spare_cols), -1, np.int32)
        self.kp = self._poison(rng, (num_pages, hkv, page_size, d))
        self.vp = self._poison(rng, (num_pages, hkv, page_size, d))
        at = 0
        for s, n in enumerate(lengths):
            pages = perm[at:at + used[s]]
            at += used[s]
            self.bt[s, :used[s]] = pages
            for i, page in enumerate(pages):
                valid = min(page_size, n - i * page_size)
                for arr in (self.kp, self.vp):
                    arr[page, :, :valid] = f32_to_bf16_bits(randn(rng, (hkv, valid, d)))
        self.kp_d, self.vp_d, self.bt_d = dev(self.kp), dev(self.vp), dev(self.bt)

    @staticmethod
    def _poison(rng, shape):
        return rng.choice(np.array(POISON, np.uint16), size=shape)

    def oracle(self, q, row_seq, row_pos, scale):
        q = np.asarray(q, np.float64)
        n, heads, d = q.shape
        group = heads // self.hkv
        out = np.zeros((n, heads, d))
        for r in range(n):
            length = int(row_pos[r]) + 1
            pages = self.bt[row_seq[r], :-(-length // self.page_size)]
            keys = bf16_bits_to_f32(self.kp[pages]).astype(np.float64)  # [P, Hkv, ps, D]
            vals = bf16_bits_to_f32(self.vp[pages]).astype(np.float64)
            keys = keys.transpose(1, 0, 2, 3).reshape(self.hkv, -1, d)[:, :length]
            vals = vals.transpose(1, 0, 2, 3).reshape(self.hkv, -1, d)[:, :length]
            for h in range(heads):
                s = keys[h // group] @ q[r, h] * scale
                p = np.exp(s - s.max())
                out[r, h] = (p / p.sum()) @ vals[h // group]
        return out

    def workspace(self, rows, heads):
        return katt.AttentionWorkspace.allocate(rows, heads, self.d,
                                                self.bt.shape[1] * self.page_size)

    def run(self, q_d, row_seq, row_pos, scale, ws, gate=None, bt_d=None, ready=False):
        n, heads, d = q_d.shape
        out = poisoned((n, heads, d))
        katt.paged_attention(q_d, self.kp_d, self.vp_d, self.bt_d if bt_d is None else bt_d,
                             dev(np.asarray(row_seq, np.int32)),
                             dev(np.asarray(row_pos, np.int32)), scale, out, workspace=ws,
                             gate=gate, past_kv_ready=ready)
        return out


class _Launch:
    """One TMA launch over rows of every length (LENGTHS, plus `extra` (sequence, position) rows):
    its pages, rows, host / device q, scale, workspace and host output; the launch checked to
    have run the TMA kernel and left the workspace counters at 0."""

    def __init__(self, rng, tma, group, d, page_size=16, extra=(), hkv=2):
        self.heads = group * hkv
        self.kv = _Paged(rng, LENGTHS, hkv, d, page_size)
        self.row_seq = np.array(list(range(len(LENGTHS))) + [s for s, _ in extra], np.int32)
        self.row_pos = np.array([n - 1 for n in LENGTHS] + [p for _, p in extra], np.int32)
        self.n = len(self.row_seq)
        self.q_h = randn(rng, (self.n, self.heads, d), 2.0)
        self.q = dev(self.q_h)
        self.scale = d ** -0.5
        self.ws = self.kv.workspace(self.n, self.heads)
        self.out = self.rerun()
        _assert_tma_ran(tma, d)
        assert not host(self.ws.counters).any(), "workspace counters must be 0 after a launch"

    def rerun(self):
        return host(self.kv.run(self.q, self.row_seq, self.row_pos, self.scale, self.ws))

    def oracle(self, q_h=None):
        return self.kv.oracle(self.q_h if q_h is None else q_h, self.row_seq, self.row_pos,
                              self.scale)


def _last_attention(launched) -> str:
    """The last attention instance fetched (the merge kernel that follows it aside)."""
    return [x for x in launched if not x.startswith("attn_merge_kernel")][-1]


def _assert_tma_ran(launched, d):
    """Every attention instance fetched since was a TMA one (the merge kernel aside)."""
    names = {f"paged_attention_tma_kernel<{d}, {b}>" for b in katt.TMA_MINB}
    attention = [x for x in launched if x != katt.merge_kernel_name(d)]
    assert attention and all(x in names for x in attention), launched
    launched.clear()


@pytest.mark.parametrize("group,d,page_size", [(1, 256, 16), (4, 256, 16), (6, 256, 16),
                                               (8, 256, 16), (4, 256, 32), (4, 128, 16),
                                               (8, 128, 16), (3, 64, 16)])
def test_tma_vs_float64(rng, monkeypatch, tma, group, d, page_size):
    """Rows of every length (one chunk, 64-key chunks in one and several merge groups, 128- and
    576-key chunks), plus page / tile / chunk / group boundaries, in one B=12 launch."""
    run = _Launch(rng, tma, group, d, page_size,
                  extra=((6, 15), (6, 16), (5, 511), (4, 31), (5, 4095)))
    out, expect = run.out, run.oracle()
    monkeypatch.setattr(katt, "TMA", False)
    monkeypatch.setattr(katt, "MMA", True)
    mma = run.rerun()
    errs = [(rel_err(out[i], expect[i]), rel_err(mma[i], expect[i])) for i in range(run.n)]
    print(f"G={group} D={d} page {page_size}: max rel err tma {max(e[0] for e in errs):.2e}, "
          f"mma {max(e[1] for e in errs):.2e}")
    for i in range(run.n):
        assert_close(out[i], expect[i], TOL, f"tma row {i} (len {run.row_pos[i] + 1})")


def test_tma_batch_invariance(rng, tma):
    """A row's bits do not depend on the batch (alone, in a B=8 batch of other lengths, in
    another order and subset) nor on earlier launches sharing the workspace (9B: G=4, D=256)."""
    heads, hkv, d = 16, 4, 256
    lengths = [9000, 33, 512, 4097, 65, 1, 17, 2000]
    kv = _Paged(rng, lengths, hkv, d)
    row_seq = np.arange(8, dtype=np.int32)
    row_pos = np.array(lengths, np.int32) - 1
    q = dev(randn(rng, (8, heads, d), 2.0))
    scale = d ** -0.5
    ws = kv.workspace(8, heads)
    batch = kv.run(q, row_seq, row_pos, scale, ws)
    _assert_tma_ran(tma, d)
    assert np.isfinite(host(batch)).all()
    for rows in ([0], [5], [6], [3], [2, 7], [7, 4, 1, 0], list(range(8))[::-1]):
        part = kv.run(q[rows], row_seq[rows], row_pos[rows], scale, ws)
        assert_same_bits(part, batch[rows], f"rows {rows} vs the B=8 batch")
    assert_same_bits(kv.run(q, row_seq, row_pos, scale, ws), batch, "repeated launch")
    assert not host(ws.counters).any(), "workspace counters must be 0 after a launch"
    _assert_tma_ran(tma, d)


@pytest.mark.parametrize("group,d", [(4, 256), (8, 256), (6, 128)])
def test_tma_register_caps_give_the_same_bits(rng, monkeypatch, tma, group, d):
    """The 2- and 3-blocks-per-SM instances (NINFER_ATTN_TMA_BLOCKS) run the same code under
    different register caps: bitwise the same rows, so choosing by the row count (the default,
    0) keeps rows batch invariant: a row alone (2) equals the row inside a batch of 8 (3)."""
    hkv = 2
    heads = hkv * group
    lengths = [1, 17, 1000, 4097, 33000, 64, 65, 2049]
    kv = _Paged(rng, lengths, hkv, d)
    row_seq = np.arange(8, dtype=np.int32)
    row_pos = np.array(lengths, np.int32) - 1
    q = dev(randn(rng, (8, heads, d), 2.0))
    gate = dev(randn(rng, (8, heads, 2 * d)))[:, :, d:]
    scale = d ** -0.5
    ws = kv.workspace(8, heads)
    outs = {}
    for blocks in katt.TMA_MINB:
        monkeypatch.setattr(katt, "TMA_BLOCKS", blocks)
        outs[blocks] = kv.run(q, row_seq, row_pos, scale, ws, gate=gate)
        assert _last_attention(tma) == f"paged_attention_tma_kernel<{d}, {blocks}>", tma
        assert np.isfinite(host(outs[blocks])).all()
    assert_same_bits(outs[3], outs[2], f"G={group} D={d}: 3 vs 2 blocks per SM")
    monkeypatch.setattr(katt, "TMA_BLOCKS", 0)
    batch = kv.run(q, row_seq, row_pos, scale, ws, gate=gate)
    assert _last_attention(tma) == f"paged_attention_tma_kernel<{d}, 3>", tma
    for r in range(8):
        alone = kv.run(q[r:r + 1], row_seq[r:r + 1], row_pos[r:r + 1], scale, ws,
                       gate=gate[r:r + 1])
        assert _last_attention(tma) == f"paged_attention_tma_kernel<{d}, 2>", tma
        assert_same_bits(alone, batch[r:r + 1], f"row {r} (len {lengths[r]}) alone vs batch")
    assert not host(ws.counters).any()


@pytest.mark.parametrize("merge", [2, 3])
def test_tma_graph_replay_equals_eager(rng, monkeypatch, tma, merge):
    """A B=8 decode launch (9B shape) captured in a CUDA graph and replayed with new q gives
    the eager bits, with the merge kernel launched by the blocks' PDL wait (2) or once their
    keys are done (3); the workspace counters stay 0."""
    from ninfer.core.cuda import DeviceContext

    monkeypatch.setattr(katt, "MERGE_KERNEL", merge)
    heads, hkv, d = 16, 4, 256
    lengths = [1024, 1023, 1, 77, 4096, 600, 2049, 33000]
    ctx = DeviceContext(0)
    with ctx.activate():
        kv = _Paged(rng, lengths, hkv, d)
        assert_attention_graph_replay(ctx, rng, "paged_attention_tma", kv.kp_d, kv.vp_d, kv.bt_d,
                                      lengths, heads, d, kv.workspace(8, heads))
        _assert_tma_ran(tma, d)


@pytest.mark.parametrize("heads,hkv,d", [(16, 4, 256), (12, 2, 128)])
def test_tma_gate_equals_attention_then_sigmoid_mul(rng, tma, heads, hkv, d):
    """gate= (the strided gate half of [q_h | gate_h]) is bitwise paged_attention then
    sigmoid_mul, for B=1 and B=8 (one-chunk rows, one and several merge groups); float64
    oracle of attention * sigmoid(gate)."""
    lengths = [1, 37, 64, 65, 700, 4097, 5000, 16]
    kv = _Paged(rng, lengths, hkv, d)
    n_all = len(lengths)
    qg_h = randn(rng, (n_all, heads, 2 * d), 2.0)
    qg_h[:, :, d:] *= 1.5
    qg_h[0, 0, d:d + 4] = [-100.0, 100.0, -90.0, 89.0]  # saturating gates
    qg_d = dev(qg_h)
    row_seq = np.arange(n_all, dtype=np.int32)
    row_pos = np.array(lengths, np.int32) - 1
    scale = d ** -0.5
    expect = ref.sigmoid_mul(kv.oracle(qg_h[:, :, :d], row_seq, row_pos, scale), qg_h[:, :, d:])
    ws = kv.workspace(n_all, heads)
    for rows in ([5], [0], list(range(n_all))):
        b = len(rows)
        sub = qg_d if b == n_all else qg_d[rows]
        q, gate = sub[:, :, :d], sub[:, :, d:]
        plain = kv.run(q, row_seq[rows], row_pos[rows], scale, ws)
        flat = poisoned((b, heads * d))
        ops.sigmoid_mul(plain.reshape(b, -1), cp().ascontiguousarray(gate).reshape(b, -1), flat)
        gated = kv.run(q, row_seq[rows], row_pos[rows], scale, ws, gate=gate)
        what = f"B={b} lengths {[lengths[r] for r in rows]}"
        assert_same_bits(gated, flat.reshape(b, heads, d), f"{what}: gated vs then sigmoid_mul")
        g = host(gated)
        for i, r in enumerate(rows):
            assert_close(g[i], expect[r], TOL, f"{what}: row of length {lengths[r]}")
        assert not host(ws.counters).any()
    _assert_tma_ran(tma, d)


@pytest.mark.parametrize("ready", [False, True])
def test_tma_invalid_rows_and_pages_give_nan(rng, monkeypatch, tma, ready):
    """An out-of-range page id (middle of a sequence) or -1 page inside the context, a row_seq
    out of range, row_pos < 0 or past the table: NaN rows, and only those; the other rows equal
    the same rows launched alone; also with past_kv_ready (pages looked up, and the first tiles
    copied, before the PDL wait)."""
    monkeypatch.setattr(katt, "PREWAIT", True)
    heads, hkv, d, page_size = 8, 2, 256, 16
    kv = _Paged(rng, [3000, 100], hkv, d, page_size)
    assert_invalid_attention_rows_nan(rng, kv.kp_d, kv.vp_d, kv.bt, page_size, heads, d,
                                      kv.workspace(7, heads), past_kv_ready=ready)
    _assert_tma_ran(tma, d)


@pytest.mark.parametrize("group,d,page_size", [(4, 256, 16), (8, 128, 32), (3, 64, 16)])
def test_tma_past_kv_ready_same_bits(rng, monkeypatch, tma, group, d, page_size):
    """past_kv_ready (the producer reads the row and its page ids and copies the chunk's first
    tiles before its PDL wait, stopping before the tile of the row's own key) changes no bit:
    decode rows whose own key falls at every place of a tile, of a ring pass (4 tiles) and of a
    chunk (lengths 1..17, 63..65, 80, 81, 127..129, several chunks and merge groups, 576-key
    chunks), an invalid row (NaN in both), with and without the gate, at B=20 (the
    3-blocks-per-SM instance) and B=1 (the 2-blocks one); and within the float64 tolerance."""
    monkeypatch.setattr(katt, "PREWAIT", True)  # whatever NINFER_ATTN_PREWAIT says
    hkv = 2
    heads = group * hkv
    lengths = [1, 2, 15, 16, 17, 63, 64, 65, 80, 81, 127, 128, 129, 1000, 4097, 4111, 9000,
               33000, 33007]
    kv = _Paged(rng, lengths, hkv, d, page_size)
    # and an invalid row
    row_seq, row_pos, q, gate = decode_rows(rng, lengths, heads, d, (len(lengths) + 5, 3))
    n = len(row_seq)
    scale = d ** -0.5
    ws = kv.workspace(n, heads)
    for g in (None, gate):
        plain = kv.run(q, row_seq, row_pos, scale, ws, gate=g)
        early = kv.run(q, row_seq, row_pos, scale, ws, gate=g, ready=True)
        assert_same_bits(early, plain, f"past_kv_ready, gate {g is not None}")
        o = host(early)
        assert np.isnan(o[-1]).all() and np.isfinite(o[:-1]).all()
        for r in (0, 4, 13, 17):
            alone = kv.run(q[r:r + 1], row_seq[r:r + 1], row_pos[r:r + 1], scale, ws,
                           gate=None if g is None else g[r:r + 1], ready=True)
            assert_same_bits(alone, plain[r:r + 1], f"row {r} alone, past_kv_ready")
    _assert_tma_ran(tma, d)
    assert not host(ws.counters).any(), "workspace counters must be 0 after a launch"
    got = host(kv.run(q[:-1], row_seq[:-1], row_pos[:-1], scale, ws, ready=True))
    want = kv.oracle(host(q)[:-1], row_seq[:-1], row_pos[:-1], scale)
    for i in range(n - 1):
        assert_close(got[i], want[i], TOL, f"row {i} (len {lengths[i]})")


def test_tma_acq_rel_counting_same_bits(rng, monkeypatch, tma):
    """NINFER_ATTN_ACQ_REL (SOURCE_ACQ_REL) gives the fenced build's bits with the TMA kernel
    at B=1 and B=9 (both register caps), gated and with past_kv_ready; counters 0 after."""
    monkeypatch.setattr(katt, "MERGE_KERNEL", 0)  # the in-kernel merges count
    monkeypatch.setattr(katt, "PREWAIT", True)
    heads, hkv, d = 16, 4, 256
    lengths = [1, 64, 65, 513, 1025, 4097, 9000, 33000, 2049]
    kv = _Paged(rng, lengths, hkv, d)
    row_seq, row_pos, q, gate = decode_rows(rng, lengths, heads, d)
    n = len(lengths)
    ws = kv.workspace(n, heads)

    def launch(rows, batched):
        return kv.run(q[rows], row_seq[rows], row_pos[rows], d ** -0.5, ws,
                      gate=gate if batched else None, ready=batched)

    assert np.isfinite(host(builds_same_bits(monkeypatch, "ACQ_REL", (True, False), launch, n,
                                             (0, 5, 7), ws.counters))).all()
    _assert_tma_ran(tma, d)


@pytest.mark.parametrize("group,d", [(4, 256), (8, 128)])
def test_tma_merge_kernel_same_bits(rng, monkeypatch, tma, group, d):
    """NINFER_ATTN_MERGE_KERNEL 1, 2 and 3 with the TMA kernel give the in-kernel merges' bits at
    B=1 and B=11 (both register caps), rows of one chunk and of 1..8 merge groups, gated and
    with past_kv_ready, an invalid row; counters 0 after; attn_merge_kernel ran."""
    monkeypatch.setattr(katt, "PREWAIT", True)
    hkv = 2
    heads = group * hkv
    lengths = [1, 64, 65, 513, 1025, 2100, 3100, 4097, 9000, 33000]
    kv = _Paged(rng, lengths, hkv, d)
    row_seq, row_pos, q, gate = decode_rows(rng, lengths, heads, d, (len(lengths) + 1, 7))
    n = len(row_seq)
    ws = kv.workspace(n, heads)

    def launch(rows, batched):
        return kv.run(q[rows], row_seq[rows], row_pos[rows], d ** -0.5, ws,
                      gate=gate if batched else None, ready=batched)

    o = host(builds_same_bits(monkeypatch, "MERGE_KERNEL", (0, 1, 2, 3), launch, n, (0, 4, 9),
                              ws.counters))
    assert np.isnan(o[-1]).all() and np.isfinite(o[:-1]).all()
    assert katt.merge_kernel_name(d) in tma
    _assert_tma_ran(tma, d)


def test_tma_long_grain(rng, monkeypatch, tma):
    """NINFER_ATTN_CHUNK_GRAIN_LONG = 256 with the TMA kernel: the float64 oracle; rows whose
    chunking it keeps are bitwise the default build's, the others differ; a row alone == the
    row in the batch (both register caps), gated and with past_kv_ready; counters 0 after."""
    if katt.CHUNK_GRAIN != 64:
        pytest.skip("the row lengths are those of grain 64")
    monkeypatch.setattr(katt, "PREWAIT", True)
    heads, hkv, d = 16, 4, 256
    lengths = LONG_GRAIN_CHANGED + LONG_GRAIN_SAME
    kv = _Paged(rng, lengths, hkv, d)
    row_seq, row_pos, q, gate = decode_rows(rng, lengths, heads, d)
    n, scale = len(lengths), d ** -0.5
    ws = kv.workspace(n, heads)
    default = kv.run(q, row_seq, row_pos, scale, ws, gate=gate, ready=True)
    use_long_grain_build(monkeypatch)
    batch = kv.run(q, row_seq, row_pos, scale, ws, gate=gate, ready=True)
    _assert_tma_ran(tma, d)
    plain = host(kv.run(q, row_seq, row_pos, scale, ws))
    want = kv.oracle(host(q), row_seq, row_pos, scale)
    for i, length in enumerate(lengths):
        assert_close(plain[i], want[i], TOL, f"len {length}")
        if length in LONG_GRAIN_SAME:
            assert_same_bits(batch[i], default[i], f"len {length}: its chunks are unchanged")
        else:
            assert differs(batch[i], default[i]), f"len {length}: the long grain changed nothing"
    for r in (0, 3, 5):
        alone = kv.run(q[r:r + 1], row_seq[r:r + 1], row_pos[r:r + 1], scale, ws,
                       gate=gate[r:r + 1], ready=True)
        assert_same_bits(alone, batch[r:r + 1], f"len {lengths[r]} alone vs in the batch")
    assert not host(ws.counters).any(), "workspace counters must be 0 after a launch"
    _assert_tma_ran(tma, d)


def test_tma_past_kv_ready_sees_the_key_written_just_before(rng, monkeypatch, tma):
    """The row's own key is written by the kernel launched just before (kv_write, PDL): with
    past_kv_ready the TMA kernel still copies its tile after the wait. The slot starts as NaN,
    so an early copy of it would make the row NaN; the result matches the oracle on the new
    key (lengths at tile, ring-pass and chunk boundaries)."""
    monkeypatch.setattr(katt, "PREWAIT", True)
    heads, hkv, d = 16, 4, 256
    lengths = [1, 16, 17, 64, 65, 80, 81, 1025, 3000, 4097]
    kv = _Paged(rng, lengths, hkv, d)
    row_seq = np.arange(len(lengths), dtype=np.int32)
    row_pos = np.array(lengths, np.int32) - 1
    n = len(lengths)
    kp, vp = nan_own_key_slots(kv.kp, kv.vp, kv.bt, row_seq, row_pos)
    k_new, v_new = randn(rng, (n, hkv, d)), randn(rng, (n, hkv, d))
    q = dev(randn(rng, (n, heads, d), 2.0))
    ws = kv.workspace(n, heads)
    seq_d, pos_d = dev(row_seq), dev(row_pos)
    for _ in range(3):
        kv.kp_d[...] = dev(kp)  # NaN in the own keys' slots
        kv.vp_d[...] = dev(vp)
        katt.kv_write(dev(k_new), dev(v_new), kv.kp_d, kv.vp_d, kv.bt_d, seq_d, pos_d)
        got = kv.run(q, row_seq, row_pos, d ** -0.5, ws, ready=True)
        assert np.isfinite(host(got)).all()
    tma[:] = [x for x in tma if x.startswith("paged_attention")]  # not kv_write
    _assert_tma_ran(tma, d)
    kv.kp, kv.vp = ref.kv_write(k_new, v_new, kp, vp, kv.bt, row_seq, row_pos)
    assert_close(got, kv.oracle(host(q), row_seq, row_pos, d ** -0.5), TOL)


def test_ineligible_pages_fall_back(rng, tma):
    """page_size 12 (tiles would cross pages): the other kernel runs, with its usual results."""
    heads, hkv, d = 8, 2, 128
    kv = _Paged(rng, [300, 1000], hkv, d, page_size=12)
    row_seq, row_pos = np.array([0, 1], np.int32), np.array([299, 999], np.int32)
    q_h = randn(rng, (2, heads, d))
    out = kv.run(dev(q_h), row_seq, row_pos, d ** -0.5, kv.workspace(2, heads))
    assert tma and not any("tma" in x for x in tma), tma
    assert_close(out, kv.oracle(q_h, row_seq, row_pos, d ** -0.5), TOL)
