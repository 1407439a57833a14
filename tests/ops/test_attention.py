"""kv_write + paged_attention: scattered pages vs a dense causal reference, bf16 pages, GQA,
batch invariance, index checks."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.core.dtypes import DType, round_to_bf16
from ninfer.core.kv_pool import PagedKVPool
from ninfer.ops import kv_write, paged_attention, sigmoid_mul
from ninfer.ops import reference as ref

from .helpers import DTYPES, assert_close, assert_same_bits, poisoned, randn

HKV, HEADS, D, PAGE = 2, 6, 40, 4
LENGTHS = (9, 1, 14)


def _setup(rng, dtype):
    """A pool with three sequences on shuffled pages, every position written in shuffled order."""
    max_pages = 4
    pool = PagedKVPool(1, 13, HKV, PAGE, D, dtype)
    page_ids = rng.permutation(13).astype(np.int32)
    tables = np.full((len(LENGTHS), max_pages), -1, np.int32)
    used = 0
    for s, length in enumerate(LENGTHS):
        n_pages = -(-length // PAGE)
        tables[s, :n_pages] = page_ids[used:used + n_pages]
        used += n_pages
    rows = [(s, p) for s, length in enumerate(LENGTHS) for p in range(length)]
    order = rng.permutation(len(rows))
    row_seq = np.array([rows[i][0] for i in order], np.int32)
    row_pos = np.array([rows[i][1] for i in order], np.int32)
    n = len(rows)
    fused = randn(rng, (n, 2 * HKV * D + 3))  # k and v as column blocks of one projection
    k = fused[:, :HKV * D].reshape(n, HKV, D)
    v = fused[:, HKV * D:2 * HKV * D].reshape(n, HKV, D)
    return pool, tables, row_seq, row_pos, k, v


def _dense_attention(q, k, v, row_seq, row_pos, seq, pos, scale, bf16):
    """Causal GQA attention for one query row from the dense (unpaged) K/V rows."""
    sel = [i for i in range(len(row_seq)) if row_seq[i] == seq and row_pos[i] <= pos]
    sel.sort(key=lambda i: row_pos[i])
    keys = np.asarray(k[sel], np.float64)
    vals = np.asarray(v[sel], np.float64)
    if bf16:
        keys, vals = round_to_bf16(keys.astype(np.float32)), round_to_bf16(vals.astype(np.float32))
    out = np.zeros((HEADS, D))
    for h in range(HEADS):
        s = keys[:, h // (HEADS // HKV)] @ np.asarray(q[h], np.float64) * scale
        p = np.exp(s - s.max())
        out[h] = p / p.sum() @ vals[:, h // (HEADS // HKV)]
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_write_matches_reference_bitwise(rng, dtype):
    pool, tables, row_seq, row_pos, k, v = _setup(rng, dtype)
    expect_k, expect_v = ref.kv_write(k, v, pool.k[0], pool.v[0], tables, row_seq, row_pos)
    kv_write(k, v, pool.k[0], pool.v[0], tables, row_seq, row_pos)
    assert_same_bits(pool.k[0], expect_k, "k pages")
    assert_same_bits(pool.v[0], expect_v, "v pages")


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_attention_scattered_pages_vs_dense(rng, dtype):
    pool, tables, row_seq, row_pos, k, v = _setup(rng, dtype)
    kv_write(k, v, pool.k[0], pool.v[0], tables, row_seq, row_pos)
    n = len(row_seq)
    qg = randn(rng, (n, HEADS, 2 * D))
    q = qg[:, :, :D]  # interleaved q/gate projection: heads strided
    scale = D ** -0.5
    out = poisoned((n, HEADS, D))
    paged_attention(q, pool.k[0], pool.v[0], tables, row_seq, row_pos, scale, out)
    bf16 = dtype is DType.BFLOAT16
    dense = np.stack([_dense_attention(q[i], k, v, row_seq, row_pos, row_seq[i], row_pos[i],
                                       scale, bf16) for i in range(n)])
    assert_close(out, dense)
    assert_close(out, ref.paged_attention(q, pool.k[0], pool.v[0], tables, row_seq, row_pos,
                                          scale))


@pytest.mark.parametrize("dtype", DTYPES)
def test_paged_attention_is_batch_invariant(rng, dtype):
    pool, tables, row_seq, row_pos, k, v = _setup(rng, dtype)
    kv_write(k, v, pool.k[0], pool.v[0], tables, row_seq, row_pos)
    n = len(row_seq)
    q = randn(rng, (n, HEADS, D))
    whole = poisoned((n, HEADS, D))
    paged_attention(q, pool.k[0], pool.v[0], tables, row_seq, row_pos, 0.3, whole)
    for i in rng.permutation(n)[:6]:
        one = poisoned((1, HEADS, D))
        paged_attention(q[i:i + 1], pool.k[0], pool.v[0], tables, row_seq[i:i + 1],
                        row_pos[i:i + 1], 0.3, one)
        assert_same_bits(one[0], whole[i], f"row {i}")


def test_attention_index_checks(rng):
    pool, tables, row_seq, row_pos, k, v = _setup(rng, DType.FLOAT32)
    q = randn(rng, (1, HEADS, D))
    out = poisoned((1, HEADS, D))
    with pytest.raises(ValueError, match="row_pos outside"):
        paged_attention(q, pool.k[0], pool.v[0], tables, np.array([0], np.int32),
                        np.array([16], np.int32), 1.0, out)
    with pytest.raises(ValueError, match="page id outside"):  # position 9 of seq 1: page -1
        kv_write(k[:1], v[:1], pool.k[0], pool.v[0], tables, np.array([1], np.int32),
                 np.array([9], np.int32))
    with pytest.raises(ValueError, match="not a multiple"):
        paged_attention(randn(rng, (1, 5, D)), pool.k[0], pool.v[0], tables,
                        np.array([0], np.int32), np.array([0], np.int32), 1.0,
                        poisoned((1, 5, D)))
    with pytest.raises(TypeError, match="pages"):
        kv_write(k, v, pool.k[0].astype(np.float16), pool.v[0], tables, row_seq, row_pos)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_paged_attention_is_attention_then_sigmoid_mul(rng, dtype):
    """gate=: bitwise paged_attention then sigmoid_mul, with q and the gate as the strided halves
    of an interleaved per-head [q_h | gate_h] projection (the model's layout); float64 oracle."""
    pool, tables, row_seq, row_pos, k, v = _setup(rng, dtype)
    kv_write(k, v, pool.k[0], pool.v[0], tables, row_seq, row_pos)
    n = len(row_seq)
    qg = randn(rng, (n, HEADS, 2 * D + 3), 2.0)[:, :, 1:1 + 2 * D]
    q, gate = qg[:, :, :D], qg[:, :, D:]
    scale = D ** -0.5
    gated = poisoned((n, HEADS, D))
    paged_attention(q, pool.k[0], pool.v[0], tables, row_seq, row_pos, scale, gated, gate=gate)
    plain = poisoned((n, HEADS, D))
    paged_attention(q, pool.k[0], pool.v[0], tables, row_seq, row_pos, scale, plain)
    two_ops = poisoned((n, HEADS, D))
    sigmoid_mul(plain, gate, two_ops)
    assert_same_bits(gated, two_ops, "gated vs paged_attention then sigmoid_mul")
    oracle = ref.paged_attention(q, pool.k[0], pool.v[0], tables, row_seq, row_pos, scale)
    assert_close(gated, oracle / (1.0 + np.exp(-np.asarray(gate, np.float64))))


def test_gated_paged_attention_gate_checks(rng):
    pool, tables, row_seq, row_pos, k, v = _setup(rng, DType.FLOAT32)
    kv_write(k, v, pool.k[0], pool.v[0], tables, row_seq, row_pos)
    n = len(row_seq)
    q = randn(rng, (n, HEADS, D))
    out = poisoned((n, HEADS, D))
    args = (q, pool.k[0], pool.v[0], tables, row_seq, row_pos, 0.3, out)
    with pytest.raises(TypeError, match="gate must be float32"):
        paged_attention(*args, gate=randn(rng, (n, HEADS, D)).astype(np.float64))
    with pytest.raises(ValueError, match="gate"):
        paged_attention(*args, gate=randn(rng, (n, HEADS, D + 1)))
    with pytest.raises(ValueError, match="gate"):
        paged_attention(*args, gate=randn(rng, (n, HEADS + 2, D)))
    with pytest.raises(ValueError, match="gate must be last axis contiguous"):
        paged_attention(*args, gate=randn(rng, (n, HEADS, 2 * D))[:, :, ::2])
    assert np.isnan(out).all(), "a rejected call must not write out"
