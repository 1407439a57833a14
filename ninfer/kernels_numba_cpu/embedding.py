"""CPU kernel for `embedding`: out[n] = widen(table[ids[n]])."""
from __future__ import annotations

from numba import njit, prange

from ninfer.kernels_numba_cpu._prim import widen
from ninfer.kernels_numba_cpu._threads import launch


@njit(parallel=True, cache=True, fastmath=False)
def _embedding_kernel(ids, table, out):
    n, h = out.shape
    for i in prange(n):
        row = ids[i]
        for j in range(h):
            out[i, j] = widen(table[row, j])


def embedding(ids, table, out) -> None:
    if ids.shape[0] == 0:
        return
    vocab = table.shape[0]
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= vocab:
        raise ValueError(f"embedding: token id out of range [0, {vocab}): min {lo}, max {hi}")
    launch(_embedding_kernel, out.size, ids, table.data, out)
