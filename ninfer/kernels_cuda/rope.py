"""Launcher for rope.cu: `rope(x, positions, inv_freq, freq_axis)` in place (docs/ops.md), with
programmatic dependent launch allowed (`_loader.launch(..., pdl=True)`)."""
from __future__ import annotations

import numpy as np

from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda._loader import KernelSource, get_function, launch

SOURCE = KernelSource("rope.cu", ("rope_kernel",))


def rope_operands(positions, inv_freq, freq_axis, n: int, dim: int) -> tuple[int, int]:
    """Check positions i32[3, n], inv_freq f32[R/2], freq_axis i32[R/2] for head dim `dim`;
    return (row stride of positions, R/2)."""
    C.device_array(positions, "positions", dtype=np.int32, ndim=2, shape=(3, n))
    pst = C.inner_contiguous(positions, "positions", 1)
    C.contiguous(C.device_array(inv_freq, "inv_freq", dtype=np.float32, ndim=1), "inv_freq")
    half = inv_freq.shape[0]
    C.contiguous(C.device_array(freq_axis, "freq_axis", dtype=np.int32, shape=(half,)),
                 "freq_axis")
    C.require(2 * half <= dim, "inv_freq", f"rotary dim {2 * half} exceeds head dim {dim}")
    return pst[0], half


def rope(x, positions, inv_freq, freq_axis) -> None:
    """Rotate the first R = 2*len(inv_freq) dims of each head of x f32[N,Hh,D] in place.

    positions i32[3,N] (rows t, h, w; row-strided allowed), inv_freq f32[R/2],
    freq_axis i32[R/2] with values in {0, 1, 2}.
    """
    C.device_array(x, "x", dtype=np.float32, ndim=3)
    n, heads, dim = x.shape
    st = C.inner_contiguous(x, "x", 1)
    pos_rs, half = rope_operands(positions, inv_freq, freq_axis, n, dim)
    if n * heads == 0 or half == 0:
        return
    threads = min(256, max(32, (half + 31) // 32 * 32))
    launch(get_function(SOURCE, "rope_kernel"), (n * heads,), (threads,),
           (x, np.int64(st[0]), np.int64(st[1]), np.int32(heads), positions, np.int64(pos_rs),
            inv_freq, freq_axis, np.int32(half)), name="rope", pdl=True)
