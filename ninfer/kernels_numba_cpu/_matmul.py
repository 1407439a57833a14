"""The one CPU matrix-product kernel: rows of x times (row blocks of) weight matrices.

`grouped_matmul` serves `linear` (one group: all rows, one matrix) and both MoE expert products
(one group per active expert: its routed rows, that expert's matrix), so a single compiled
kernel per weight dtype covers all of them and every output element is `_dot.dot` of one x row
and one weight row, whatever the grouping, blocking or chunking.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from ninfer.kernels_numba_cpu._dot import LANES, dot, dot2

ROW_BLOCK = 64
CHUNKS_PER_THREAD = 4


@njit
def _rows_times_matrix(x, xo_list, w, w_base, m0, m1, k_len, out, oo_list, acc0, acc1):
    """out[oo_list[i] + m] = dot(x row i, weight row m) for m in [m0, m1) and every listed row.

    Rows are x offsets `xo_list[i]`; weight row m starts at `w_base + m * k_len`. Weight rows are
    taken in pairs (each pair is read once for all rows), the odd last one alone.
    """
    n_rows = xo_list.shape[0]
    m = m0
    while m + 1 < m1:
        wo0 = w_base + m * k_len
        for i in range(n_rows):
            a, b = dot2(x, xo_list[i], w, wo0, wo0 + k_len, k_len, acc0, acc1)
            out[oo_list[i] + m] = a
            out[oo_list[i] + m + 1] = b
        m += 2
    if m < m1:
        wo0 = w_base + m * k_len
        for i in range(n_rows):
            out[oo_list[i] + m] = dot(x, xo_list[i], w, wo0, k_len, acc0)


@njit(parallel=True, cache=True, fastmath=False)
def grouped_matmul(x, x_offs, w, w_bases, row_starts, out, out_offs, m_len, k_len, chunks):
    """For each group g: rows row_starts[g]..row_starts[g+1] (x at x_offs[r], out at out_offs[r])
    times the [m_len, k_len] weight matrix starting at w[w_bases[g]]; parallel over (group,
    chunk of output features), rows in blocks of ROW_BLOCK so each weight row is read once per
    block."""
    n_groups = w_bases.shape[0]
    per = 2 * (((m_len + 1) // 2 + chunks - 1) // chunks)  # whole weight-row pairs per chunk
    for task in prange(n_groups * chunks):
        g = task // chunks
        m0 = (task - g * chunks) * per
        m1 = min(m_len, m0 + per)
        if m0 < m1:
            acc0 = np.empty(LANES, np.float32)
            acc1 = np.empty(LANES, np.float32)
            for r0 in range(row_starts[g], row_starts[g + 1], ROW_BLOCK):
                r1 = min(row_starts[g + 1], r0 + ROW_BLOCK)
                _rows_times_matrix(x, x_offs[r0:r1], w, w_bases[g], m0, m1, k_len, out,
                                   out_offs[r0:r1], acc0, acc1)


def chunks_for(m_len: int, n_groups: int) -> int:
    """Feature chunks per group so the tasks keep every thread busy (never changes results)."""
    tasks = numba.get_num_threads() * CHUNKS_PER_THREAD
    return max(1, min((m_len + 1) // 2, -(-tasks // max(1, n_groups))))
