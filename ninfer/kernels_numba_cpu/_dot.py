"""The fixed-order fp32 dot product used by every matrix kernel on the CPU (linear, MoE experts).

Order (this is the CPU side of the batch-invariance contract in docs/ops.md): with L = LANES,
lane j accumulates x[k] * w[k] for k = j, j + L, j + 2L, ... below K - K % L, in ascending k;
the lanes are then folded as a halving tree (lane j += lane j + 16 for j < 16, then + 8, + 4, + 2,
+ 1), and the tail k >= K - K % L is added to lane 0's total sequentially.
Every product and sum is an IEEE fp32 operation (no FMA contraction: fastmath is off), so the
result depends only on x, w and K, never on which rows or columns share the call. The lane form
lets LLVM vectorise the inner loop without reassociating anything. `dot2` computes two weight rows
against one x row with exactly `dot`'s per-row operations (shared x loads, twice the ILP).

Indices are uint64 so Numba emits no negative-index wraparound (which blocks vectorisation).
"""
from __future__ import annotations

from numba import njit, uint64

from ninfer.kernels_numba_cpu._prim import F0, widen

LANES = 32


@njit(inline="always")
def _fold_lanes(acc):
    """acc[0] = the LANES = 32 lanes summed as a fixed halving tree (+16, +8, +4, +2, +1)."""
    for j in range(16):
        acc[j] += acc[j + 16]
    for j in range(8):
        acc[j] += acc[j + 8]
    for j in range(4):
        acc[j] += acc[j + 4]
    for j in range(2):
        acc[j] += acc[j + 2]
    acc[0] += acc[1]


@njit(inline="always")
def dot(x, xo, w, wo, k_len, acc):
    """sum_k x[xo + k] * w[wo + k], k < k_len, in the fixed lane order; acc: f32[LANES] scratch."""
    xo = uint64(xo)
    wo = uint64(wo)
    k_lanes = k_len - k_len % LANES
    for j in range(LANES):
        acc[j] = F0
    for kb in range(0, k_lanes, LANES):
        ub = uint64(kb)
        for j in range(LANES):
            uj = uint64(j)
            acc[uj] += x[xo + ub + uj] * widen(w[wo + ub + uj])
    _fold_lanes(acc)
    s = acc[0]
    for k in range(k_lanes, k_len):
        uk = uint64(k)
        s += x[xo + uk] * widen(w[wo + uk])
    return s


@njit(inline="always")
def dot2(x, xo, w, wo0, wo1, k_len, acc0, acc1):
    """(dot(x, xo, w, wo0), dot(x, xo, w, wo1)) with the same per-row operation order."""
    xo = uint64(xo)
    wo0 = uint64(wo0)
    wo1 = uint64(wo1)
    k_lanes = k_len - k_len % LANES
    for j in range(LANES):
        acc0[j] = F0
        acc1[j] = F0
    for kb in range(0, k_lanes, LANES):
        ub = uint64(kb)
        for j in range(LANES):
            uj = uint64(j)
            xv = x[xo + ub + uj]
            acc0[uj] += xv * widen(w[wo0 + ub + uj])
            acc1[uj] += xv * widen(w[wo1 + ub + uj])
    _fold_lanes(acc0)
    _fold_lanes(acc1)
    s0 = acc0[0]
    s1 = acc1[0]
    for k in range(k_lanes, k_len):
        uk = uint64(k)
        xv = x[xo + uk]
        s0 += xv * widen(w[wo0 + uk])
        s1 += xv * widen(w[wo1 + uk])
    return s0, s1
