"""CPU kernels for `kv_write` and `paged_attention` over the paged KV layout of docs/ops.md.

Pages are [num_pages, Hkv, page_size, D] (float32, or uint16 bf16 bits). Attention is two-pass
per (row, KV head): scores for keys 0..row_pos in ascending position (q.k is `_dot.dot`, times
scale), max-subtracted fp32 softmax with a sequential sum, then p_j = e_j / sum and
out = sum_j p_j v_j accumulated in ascending j. The GQA group of query heads sharing a KV head is
handled together so each K/V row is loaded once per group. With a gate, each output element is
o * sigmoid(gate) in f32 (elementwise.py's sigmoid_mul expression: the same bits as the two ops).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, uint64

from ninfer.kernels_numba_cpu._dot import LANES, dot
from ninfer.kernels_numba_cpu._layout import rows3
from ninfer.kernels_numba_cpu._prim import F0, sigmoid, store, widen
from ninfer.kernels_numba_cpu._threads import launch


@njit(parallel=True, cache=True, fastmath=False)
def _kv_write_kernel(k, ks0, ks1, v, vs0, vs1, k_pages, v_pages, block_tables,
                     row_seq, row_pos, heads, page_size, d):
    n = row_seq.shape[0]
    for r in prange(n * heads):
        t = r // heads
        h = r - t * heads
        pos = row_pos[t]
        page = block_tables[row_seq[t], pos // page_size]
        dst = ((page * heads + h) * page_size + pos % page_size) * d
        ko = t * ks0 + h * ks1
        vo = t * vs0 + h * vs1
        for j in range(d):
            store(k_pages, dst + j, k[ko + j])
            store(v_pages, dst + j, v[vo + j])


@njit
def _attend(q, qo0, qs1, k_pages, v_pages, pages, ctx, kvh, kv_heads, page_size, scale,
            out, t, group, gated, gate, go0, gs1):
    """One row's causal attention for the `group` query heads of KV head kvh (pages: its table);
    gated: out *= sigmoid(gate[go0 + g * gs1 + i]) for query head g of the group."""
    d = out.shape[2]
    scores = np.empty((group, ctx), np.float32)
    acc = np.empty(LANES, np.float32)
    for j in range(ctx):
        ko = ((pages[j // page_size] * kv_heads + kvh) * page_size + j % page_size) * d
        for g in range(group):
            scores[g, j] = dot(q, qo0 + g * qs1, k_pages, ko, d, acc) * scale
    for g in range(group):
        m = scores[g, 0]
        for j in range(1, ctx):
            m = max(m, scores[g, j])
        total = F0
        for j in range(ctx):
            e = np.exp(scores[g, j] - m)
            scores[g, j] = e
            total += e
        for j in range(ctx):
            scores[g, j] = scores[g, j] / total
    o = np.zeros((group, d), np.float32)
    for j in range(ctx):
        vo = uint64(((pages[j // page_size] * kv_heads + kvh) * page_size + j % page_size) * d)
        for g in range(group):
            p = scores[g, j]
            for i in range(d):
                o[g, i] += p * widen(v_pages[vo + uint64(i)])
    for g in range(group):
        for i in range(d):
            if gated:
                out[t, kvh * group + g, i] = o[g, i] * sigmoid(gate[go0 + g * gs1 + i])
            else:
                out[t, kvh * group + g, i] = o[g, i]


@njit(parallel=True, cache=True, fastmath=False)
def _attention_kernel(q, qs0, qs1, k_pages, v_pages, block_tables, row_seq, row_pos,
                      scale, out, kv_heads, page_size, gated, gate, gs0, gs1):
    n, n_heads, _ = out.shape
    group = n_heads // kv_heads
    for r in prange(n * kv_heads):
        t = r // kv_heads
        kvh = r - t * kv_heads
        _attend(q, t * qs0 + kvh * group * qs1, qs1, k_pages, v_pages, block_tables[row_seq[t]],
                row_pos[t] + 1, kvh, kv_heads, page_size, scale, out, t, group, gated, gate,
                t * gs0 + kvh * group * gs1, gs1)


def _check_rows(name, block_tables, row_seq, row_pos, page_size, num_pages, *, whole_context):
    """Index checks that keep the kernel inside its arrays (cheap NumPy on the host)."""
    n_seqs, max_pages = block_tables.shape
    if row_seq.min() < 0 or row_seq.max() >= n_seqs:
        raise ValueError(f"{name}: row_seq outside [0, {n_seqs})")
    if row_pos.min() < 0 or row_pos.max() >= max_pages * page_size:
        raise ValueError(f"{name}: row_pos outside [0, {max_pages * page_size})")
    if whole_context:
        used = (row_pos.astype(np.int64) // page_size + 1)[:, None] > np.arange(max_pages)
        pages = block_tables[row_seq][used]
    else:
        pages = block_tables[row_seq, row_pos // page_size]
    if pages.min() < 0 or pages.max() >= num_pages:
        raise ValueError(f"{name}: block table holds a page id outside [0, {num_pages})")


def kv_write(k, v, k_pages, v_pages, block_tables, row_seq, row_pos) -> None:
    if row_seq.shape[0] == 0:
        return
    num_pages, heads, page_size, d = k_pages.shape
    _check_rows("kv_write", block_tables, row_seq, row_pos, page_size, num_pages,
                whole_context=False)
    kb, ks0, ks1 = rows3(k)
    vb, vs0, vs1 = rows3(v)
    launch(_kv_write_kernel, 2 * k.size, kb, ks0, ks1, vb, vs0, vs1, k_pages.reshape(-1),
           v_pages.reshape(-1), block_tables, row_seq, row_pos, heads, page_size, d)


def paged_attention(q, k_pages, v_pages, block_tables, row_seq, row_pos, scale, out, *,
                    gate=None) -> None:
    if row_seq.shape[0] == 0:
        return
    num_pages, kv_heads, page_size, _ = k_pages.shape
    _check_rows("paged_attention", block_tables, row_seq, row_pos, page_size, num_pages,
                whole_context=True)
    qb, qs0, qs1 = rows3(q)
    # no gate: q's buffer stands in (never read), so the kernel has one signature
    gb, gs0, gs1 = (qb, 0, 0) if gate is None else rows3(gate)
    work = 2 * (int(row_pos.sum()) + len(row_pos)) * q.shape[1] * q.shape[2]
    launch(_attention_kernel, work, qb, qs0, qs1, k_pages.reshape(-1), v_pages.reshape(-1),
           block_tables, row_seq, row_pos, np.float32(scale), out, kv_heads, page_size,
           gate is not None, gb, gs0, gs1)
