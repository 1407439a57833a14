"""CPU kernel for `linear`: out[N, M] = x[N, K] @ w[M, K]^T with fp32 accumulation.

Parallel over output features (contiguous chunks of M); rows are processed in blocks of
ROW_BLOCK so each weight row is read from memory once per block while the x rows stay in cache.
Every output element is `_dot.dot` of its x row and weight row, so the value never depends on N,
on the blocking or on the chunking.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from ninfer.kernels_numba_cpu._dot import LANES, rows_times_matrix
from ninfer.kernels_numba_cpu._layout import rows3

ROW_BLOCK = 64
CHUNKS_PER_THREAD = 4


@njit(parallel=True, cache=True, fastmath=False)
def _linear_kernel(x, x_offs, w, out, out_offs, m_len, k_len, n_chunks):
    n = x_offs.shape[0]
    pairs = (m_len + 1) // 2
    per = 2 * ((pairs + n_chunks - 1) // n_chunks)
    for r0 in range(0, n, ROW_BLOCK):
        r1 = min(n, r0 + ROW_BLOCK)
        xo = x_offs[r0:r1]
        oo = out_offs[r0:r1]
        for c in prange(n_chunks):
            m0 = c * per
            m1 = min(m_len, m0 + per)
            if m0 < m1:
                acc0 = np.empty(LANES, np.float32)
                acc1 = np.empty(LANES, np.float32)
                rows_times_matrix(x, xo, w, 0, m0, m1, k_len, out, oo, acc0, acc1)


def n_chunks(m_len: int) -> int:
    """How many parallel chunks to split M into (a scheduling choice; never changes results)."""
    return max(1, min((m_len + 1) // 2, numba.get_num_threads() * CHUNKS_PER_THREAD))


def linear(x, weight, out) -> None:
    xbuf, xs, _ = rows3(x)
    n, k_len = x.shape
    m_len = weight.shape[0]
    if n == 0 or m_len == 0:
        return
    x_offs = np.arange(n, dtype=np.int64) * xs
    out_offs = np.arange(n, dtype=np.int64) * m_len
    _linear_kernel(xbuf, x_offs, weight.data.reshape(-1), out.reshape(-1), out_offs,
                   m_len, k_len, n_chunks(m_len))
