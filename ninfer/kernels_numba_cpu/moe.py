"""CPU kernels for `moe_route`, `moe_experts` and `moe_block` (those two and the shared add).

moe_experts groups the (row, k) pairs by expert so every selected expert's weights are read once
per call; the products run through `_matmul.grouped_matmul` (the kernel `linear` uses), so each
pair's values are exactly what `linear` would compute, and each row's output adds its experts in
ascending expert id: a row's result never depends on the other rows of the call.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ninfer.kernels_numba_cpu._layout import rows3
from ninfer.kernels_numba_cpu._matmul import chunks_for, grouped_matmul
from ninfer.kernels_numba_cpu._prim import F0, silu
from ninfer.kernels_numba_cpu._threads import launch
from ninfer.kernels_numba_cpu.elementwise import sigmoid_scale_add


@njit(parallel=True, cache=True, fastmath=False)
def _route_kernel(logits, rs, n, n_exp, top_k, weights_out, ids_out):
    """logits: flat buffer, row t at t * rs."""
    for t in prange(n):
        row = t * rs
        m = logits[row]
        for e in range(1, n_exp):
            if logits[row + e] > m:
                m = logits[row + e]
        p = np.empty(n_exp, np.float32)
        total = F0
        for e in range(n_exp):
            p[e] = np.exp(logits[row + e] - m)
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


@njit(cache=True)
def _group_pairs(ids, n_exp):
    """Sort the (row, k) pairs by (expert, row).

    Returns pair_row[p] (the row of pair p), pair_of[row, k] (the pair index), the active experts
    and group starts (pairs of active[g] are group_starts[g]..group_starts[g+1]).
    """
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
    n_active = 0
    for e in range(n_exp):
        n_active += offsets[e + 1] > offsets[e]
    active = np.empty(n_active, np.int64)
    group_starts = np.empty(n_active + 1, np.int64)
    g = 0
    for e in range(n_exp):
        if offsets[e + 1] > offsets[e]:
            active[g] = e
            group_starts[g] = offsets[e]
            g += 1
    group_starts[n_active] = offsets[n_exp]
    return pair_row, pair_of, active, group_starts


@njit(parallel=True, cache=True, fastmath=False)
def _swiglu_pairs(gu, act, inter):
    """act[p] = silu(gu[p, :inter]) * gu[p, inter:] for every pair (flat buffers)."""
    for p in prange(act.shape[0] // inter):
        for i in range(inter):
            act[p * inter + i] = silu(gu[p * 2 * inter + i]) * gu[p * 2 * inter + inter + i]


@njit(parallel=True, cache=True, fastmath=False)
def _combine(y, pair_of, ids, weights, out):
    """out[t] = sum over t's slots in ascending expert id of weights[t, k] * y[pair_of[t, k]]."""
    n, hidden = out.shape
    top_k = ids.shape[1]
    for t in prange(n):
        order = np.empty(top_k, np.int64)  # slots by ascending expert id (stable insertion sort)
        for k in range(top_k):
            pos = k
            while pos > 0 and ids[t, order[pos - 1]] > ids[t, k]:
                order[pos] = order[pos - 1]
                pos -= 1
            order[pos] = k
        for j in range(hidden):
            out[t, j] = F0
        for k in order:
            wk = weights[t, k]
            yo = pair_of[t, k] * hidden
            for j in range(hidden):
                out[t, j] += wk * y[yo + j]


def moe_route(logits, top_k, weights_out, ids_out) -> None:
    n, n_exp = logits.shape
    if n == 0:
        return
    buf, rs, _ = rows3(logits)
    launch(_route_kernel, logits.size * (2 + int(top_k)), buf, rs, n, n_exp, int(top_k),
           weights_out, ids_out)


def moe_block(x, logits, top_k, gate_up, down, weights_out, ids_out, out, shared=None,
              shared_gate=None, routed=False) -> None:
    """moe_route, moe_experts, then sigmoid_scale_add of the shared expert (the ops in turn);
    routed=True: weights_out / ids_out already hold the routing (moe_route is skipped)."""
    if not routed:
        moe_route(logits, top_k, weights_out, ids_out)
    moe_experts(x, gate_up, down, ids_out, weights_out, out)
    if shared is not None:
        sigmoid_scale_add(out, shared, shared_gate)


def moe_experts(x, gate_up, down, ids, weights, out) -> None:
    n, hidden = x.shape
    if n == 0:
        return
    n_exp, two_inter, _ = gate_up.shape
    inter = two_inter // 2
    if ids.size and (ids.min() < 0 or ids.max() >= n_exp):
        raise ValueError(f"moe_experts: expert id outside [0, {n_exp})")
    pair_row, pair_of, active, group_starts = _group_pairs(ids, n_exp)
    n_pairs = pair_row.shape[0]
    pairs = np.arange(n_pairs, dtype=np.int64)
    gu = np.empty(n_pairs * two_inter, np.float32)
    act = np.empty(n_pairs * inter, np.float32)
    y = np.empty(n_pairs * hidden, np.float32)
    work = n_pairs * two_inter * hidden
    launch(grouped_matmul, work, x.reshape(-1), pair_row * hidden, gate_up.data.reshape(-1),
           active * (two_inter * hidden), group_starts, gu, pairs * two_inter, two_inter, hidden,
           chunks_for(two_inter, len(active)))
    launch(_swiglu_pairs, 4 * act.size, gu, act, inter)
    launch(grouped_matmul, work // 2, act, pairs * inter, down.data.reshape(-1),
           active * (hidden * inter), group_starts, y, pairs * hidden, hidden, inter,
           chunks_for(hidden, len(active)))
    launch(_combine, y.size, y, pair_of, ids, weights, out)
