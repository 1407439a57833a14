"""Unpacking strided NumPy views into (1-D buffer, element strides) pairs for the kernels.

Kernels index one flat C-contiguous buffer with explicit element strides. This keeps one compiled
variant per dtype combination (no 'A'-layout recompiles for every view) and lets LLVM vectorise
the contiguous last axis. The ops layer has already checked that strides are non-negative
multiples of the item size and that the last axis is contiguous.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided


def flat(a: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    """A 1-D C-contiguous view over the memory `a` spans, and `a`'s strides in elements."""
    item = a.itemsize
    strides = tuple(s // item for s in a.strides)
    if a.flags.c_contiguous:
        return a.reshape(-1), strides
    if a.size == 0:
        return np.empty(0, a.dtype), strides
    span = 1 + sum((n - 1) * s for n, s in zip(a.shape, strides))
    return as_strided(a, shape=(span,), strides=(item,)), strides


def rows3(a: np.ndarray) -> tuple[np.ndarray, int, int]:
    """View a 2-D [N, H] or 3-D [N, h, D] array as rows: (buffer, row stride, head stride).

    A 2-D array is one head per row (head stride 0).
    """
    buf, strides = flat(a)
    if a.ndim == 2:
        return buf, strides[0], 0
    return buf, strides[0], strides[1]
