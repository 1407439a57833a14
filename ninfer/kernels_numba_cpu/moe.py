"""CPU kernels for `moe_route` and `moe_experts`.

moe_experts groups the (row, k) pairs by expert so every selected expert's weights are read once
per call, but each pair's values come from `_dot.dot` exactly as `linear` would compute them, and
each row's output adds its experts in ascending expert id: a row's result never depends on the
other rows of the call.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from ninfer.kernels_numba_cpu._dot import LANES, rows_times_matrix
from ninfer.kernels_numba_cpu._prim import F0, silu

TASKS_PER_THREAD = 4


@njit(parallel=True, cache=True, fastmath=False)
def _route_kernel(logits, top_k, weights_out, ids_out):
    n, n_exp = logits.shape
    for t in prange(n):
        m = logits[t, 0]
        for e in range(1, n_exp):
            if logits[t, e] > m:
                m = logits[t, e]
        p = np.empty(n_exp, np.float32)
        total = F0
        for e in range(n_exp):
            p[e] = np.exp(logits[t, e] - m)
            total += p[e]
        for e in range(n_exp):
            p[e] = p[e] / total
        taken = np.zeros(n_exp, np.bool_)
        picked = F0
        for k in range(top_k):
            best = -1
            for e in range(n_exp):
                if not taken[e] and (best < 0 or p[e] > p[best]):
                    best = e
            taken[best] = True
            ids_out[t, k] = best
            weights_out[t, k] = p[best]
            picked += p[best]
        for k in range(top_k):
            weights_out[t, k] = weights_out[t, k] / picked


@njit(inline="always")
def _even_chunk(length, chunks):
    """An even chunk length that covers `length` in at most `chunks` pieces (whole weight pairs)."""
    return 2 * (((length + 1) // 2 + chunks - 1) // chunks)


@njit(cache=True)
def _group_pairs(ids, n_exp):
    """Pairs (row, k) sorted by (expert, row): pair_row, pair_of[(row, k)], expert offsets."""
    n, top_k = ids.shape
    counts = np.zeros(n_exp + 1, np.int64)
    for t in range(n):
        for k in range(top_k):
            counts[ids[t, k] + 1] += 1
    offsets = np.cumsum(counts)
    fill = offsets[:-1].copy()
    pair_row = np.empty(n * top_k, np.int64)
    pair_of = np.empty((n, top_k), np.int64)
    for t in range(n):
        for k in range(top_k):
            e = ids[t, k]
            pair_row[fill[e]] = t
            pair_of[t, k] = fill[e]
            fill[e] += 1
    return pair_row, pair_of, offsets


@njit(parallel=True, cache=True, fastmath=False)
def _experts_kernel(x, gate_up, down, ids, weights, out, n_exp, inter, n_tasks):
    n, hidden = out.shape
    top_k = ids.shape[1]
    pair_row, pair_of, offsets = _group_pairs(ids, n_exp)
    n_pairs = n * top_k
    active = np.empty(n_exp, np.int64)
    n_active = 0
    for e in range(n_exp):
        if offsets[e + 1] > offsets[e]:
            active[n_active] = e
            n_active += 1
    gu = np.empty(n_pairs * 2 * inter, np.float32)
    act = np.empty(n_pairs * inter, np.float32)
    y = np.empty(n_pairs * hidden, np.float32)
    x_offs = pair_row * hidden
    gu_offs = np.arange(n_pairs) * (2 * inter)
    act_offs = np.arange(n_pairs) * inter
    y_offs = np.arange(n_pairs) * hidden
    chunks = max(1, (n_tasks + n_active - 1) // n_active)
    # [g | u] = gate_up[e] @ x for every pair of expert e.
    per = _even_chunk(2 * inter, chunks)
    for task in prange(n_active * chunks):
        e = active[task // chunks]
        m0 = (task % chunks) * per
        m1 = min(2 * inter, m0 + per)
        if m0 < m1:
            p0, p1 = offsets[e], offsets[e + 1]
            acc0 = np.empty(LANES, np.float32)
            acc1 = np.empty(LANES, np.float32)
            rows_times_matrix(x, x_offs[p0:p1], gate_up, e * 2 * inter * hidden, m0, m1,
                              hidden, gu, gu_offs[p0:p1], acc0, acc1)
    for p in prange(n_pairs):
        for i in range(inter):
            act[p * inter + i] = silu(gu[p * 2 * inter + i]) * gu[p * 2 * inter + inter + i]
    # y = down[e] @ act for every pair of expert e.
    per = _even_chunk(hidden, chunks)
    for task in prange(n_active * chunks):
        e = active[task // chunks]
        m0 = (task % chunks) * per
        m1 = min(hidden, m0 + per)
        if m0 < m1:
            p0, p1 = offsets[e], offsets[e + 1]
            acc0 = np.empty(LANES, np.float32)
            acc1 = np.empty(LANES, np.float32)
            rows_times_matrix(act, act_offs[p0:p1], down, e * hidden * inter, m0, m1,
                              inter, y, y_offs[p0:p1], acc0, acc1)
    for t in prange(n):
        order = np.argsort(ids[t], kind="mergesort")
        for j in range(hidden):
            out[t, j] = F0
        for k in order:
            wk = weights[t, k]
            yo = pair_of[t, k] * hidden
            for j in range(hidden):
                out[t, j] += wk * y[yo + j]


def moe_route(logits, top_k, weights_out, ids_out) -> None:
    if logits.shape[0] == 0:
        return
    _route_kernel(logits, int(top_k), weights_out, ids_out)


def moe_experts(x, gate_up, down, ids, weights, out) -> None:
    if x.shape[0] == 0:
        return
    n_exp, two_inter, _ = gate_up.shape
    if ids.size and (ids.min() < 0 or ids.max() >= n_exp):
        raise ValueError(f"moe_experts: expert id outside [0, {n_exp})")
    n_tasks = numba.get_num_threads() * TASKS_PER_THREAD
    _experts_kernel(x.reshape(-1), gate_up.data.reshape(-1), down.data.reshape(-1), ids,
                    weights, out, n_exp, two_inter // 2, n_tasks)
