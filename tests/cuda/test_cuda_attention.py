"""kv_write and paged_attention on the GPU: float64 oracle over several sequences (lengths that
need one and several 256-key chunks), GQA group sizes, head dims, f32/bf16 pages, strided q;
and batch invariance (a row alone == the same row in a batch, bitwise)."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer import ops
from ninfer.core.dtypes import f32_to_bf16_bits
from ninfer.kernels_cuda import attention as katt
from ninfer.ops import reference as ref

from cuda_testutil import assert_close, assert_same_bits, dev, host, poisoned, randn

pytestmark = pytest.mark.gpu


def _pages(rng, num_pages, hkv, page_size, d, bf16):
    values = randn(rng, (num_pages, hkv, page_size, d))
    return f32_to_bf16_bits(values) if bf16 else values


def _tables(rng, lengths, page_size, num_pages, max_pages):
    """Block tables of distinct random pages covering each sequence's length."""
    perm = rng.permutation(num_pages)
    bt = np.full((len(lengths), max_pages), -1, np.int32)
    used = 0
    for s, length in enumerate(lengths):
        need = -(-length // page_size)
        bt[s, :need] = perm[used:used + need]
        used += need
    return bt


@pytest.mark.parametrize("bf16", [False, True])
def test_kv_write(rng, bf16):
    hkv, page_size, d, num_pages = 2, 16, 64, 12
    kp_h = _pages(rng, num_pages, hkv, page_size, d, bf16)
    vp_h = _pages(rng, num_pages, hkv, page_size, d, bf16)
    bt = _tables(rng, [40, 20], page_size, num_pages, 4)
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
@pytest.mark.parametrize("heads,hkv,d", [(4, 4, 64), (8, 4, 128), (6, 2, 256), (16, 2, 256),
                                         (24, 4, 256)])
def test_paged_attention_vs_float64(rng, bf16, heads, hkv, d):
    page_size, num_pages = 16, 120
    lengths = [1, 37, 300, 700]
    kp = _pages(rng, num_pages, hkv, page_size, d, bf16)
    vp = _pages(rng, num_pages, hkv, page_size, d, bf16)
    bt = _tables(rng, lengths, page_size, num_pages, 48)
    # rows: the last position of each sequence plus some earlier ones (prefill-like rows)
    row_seq = np.array([0, 1, 2, 3, 3, 2, 1], np.int32)
    row_pos = np.array([0, 36, 299, 699, 255, 256, 5], np.int32)
    n = len(row_seq)
    q_full = randn(rng, (n, heads, 2 * d))  # q half of an interleaved [q | gate] projection
    q_h = q_full[:, :, :d]
    scale = d ** -0.5
    out = poisoned((n, heads, d))
    ops.paged_attention(dev(q_full)[:, :, :d], dev(kp), dev(vp), dev(bt), dev(row_seq),
                        dev(row_pos), scale, out)
    assert_close(out, ref.paged_attention(q_h, kp, vp, bt, row_seq, row_pos, scale))


def test_paged_attention_batch_invariance_and_workspace(rng):
    heads, hkv, d, page_size, num_pages = 8, 2, 256, 32, 64
    lengths = [900, 33, 512]
    kp, vp = (dev(_pages(rng, num_pages, hkv, page_size, d, True)) for _ in range(2))
    bt = dev(_tables(rng, lengths, page_size, num_pages, 32))
    row_seq = np.array([0, 1, 2, 0], np.int32)
    row_pos = np.array([899, 32, 511, 400], np.int32)
    q = dev(randn(rng, (4, heads, d)))
    ws = katt.AttentionWorkspace.allocate(8, heads, d, 32 * page_size)
    batch = poisoned((4, heads, d))
    katt.paged_attention(q, kp, vp, bt, dev(row_seq), dev(row_pos), d ** -0.5, batch,
                         workspace=ws)
    for rows in ([0], [2, 3], [1]):
        part = poisoned((len(rows), heads, d))
        katt.paged_attention(q[rows], kp, vp, bt, dev(row_seq[rows]), dev(row_pos[rows]),
                             d ** -0.5, part, workspace=ws)
        assert_same_bits(part, batch[rows], f"rows {rows}")
    # a prefill-sized call (> SPLIT_MAX_ROWS rows: chunks merged inside each block) gives the
    # same bits as the split decode path
    many = katt.SPLIT_MAX_ROWS + 7
    pick = rng.integers(0, 4, many)
    pick[:4] = np.arange(4)
    big = poisoned((many, heads, d))
    katt.paged_attention(q[pick], kp, vp, bt, dev(row_seq[pick]), dev(row_pos[pick]),
                         d ** -0.5, big)
    assert_same_bits(big[:4], batch, "loop mode vs split mode")


def test_invalid_page_gives_nan(rng):
    heads, hkv, d, page_size = 4, 2, 64, 16
    kp, vp = (dev(_pages(rng, 4, hkv, page_size, d, False)) for _ in range(2))
    bt = dev(np.array([[0, 1, 99]], np.int32))
    q = dev(randn(rng, (2, heads, d)))
    out = poisoned((2, heads, d))
    katt.paged_attention(q, kp, vp, bt, dev(np.zeros(2, np.int32)),
                         dev(np.array([40, 10], np.int32)), 0.125, out)
    o = host(out)
    assert np.isnan(o[0]).all() and np.isfinite(o[1]).all()
