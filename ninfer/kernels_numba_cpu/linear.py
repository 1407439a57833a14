"""CPU kernel for `linear`: out[N, M] = x[N, K] @ w[M, K]^T with fp32 accumulation.

One group of `_matmul.grouped_matmul`: every output element is `_dot.dot` of its x row and weight
row, so the value never depends on N, on the row blocking or on the chunking of M.
"""
from __future__ import annotations

import numpy as np

from ninfer.kernels_numba_cpu._layout import rows3
from ninfer.kernels_numba_cpu._matmul import chunks_for, grouped_matmul
from ninfer.kernels_numba_cpu._threads import launch

_ONE_GROUP = np.zeros(1, np.int64)


def linear(x, weight, out) -> None:
    n, k_len = x.shape
    m_len = weight.shape[0]
    if n == 0 or m_len == 0:
        return
    xbuf, xs, _ = rows3(x)
    rows = np.arange(n, dtype=np.int64)
    launch(grouped_matmul, n * m_len * k_len, xbuf, rows * xs, weight.data.reshape(-1),
           _ONE_GROUP, np.array([0, n], np.int64), out.reshape(-1), rows * m_len, m_len, k_len,
           chunks_for(m_len, 1))
