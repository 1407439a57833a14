"""CPU kernel for `rope`: in-place NeoX rotation of the first R dims of every head, MRoPE axes."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ninfer.kernels_numba_cpu._layout import rows3
from ninfer.kernels_numba_cpu._threads import launch


@njit(parallel=True, cache=True, fastmath=False)
def _rope_kernel(x, xs0, xs1, heads, positions, inv_freq, freq_axis):
    half = inv_freq.shape[0]
    n = positions.shape[1]
    for t in prange(n):
        cos = np.empty(half, np.float32)
        sin = np.empty(half, np.float32)
        for j in range(half):
            angle = np.float32(positions[freq_axis[j], t]) * inv_freq[j]
            cos[j] = np.cos(angle)
            sin[j] = np.sin(angle)
        for i in range(heads):
            o = t * xs0 + i * xs1
            for j in range(half):
                x1 = x[o + j]
                x2 = x[o + j + half]
                x[o + j] = x1 * cos[j] - x2 * sin[j]
                x[o + j + half] = x2 * cos[j] + x1 * sin[j]


def rope(x, positions, inv_freq, freq_axis) -> None:
    if x.size == 0:
        return
    xb, xs0, xs1 = rows3(x)
    launch(_rope_kernel, x.size, xb, xs0, xs1, x.shape[1], positions, inv_freq, freq_axis)
