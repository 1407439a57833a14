"""CPU kernels for `sigmoid_mul`, `swiglu`, `sigmoid_scale_add` and `add_inplace` (fp32)."""
from __future__ import annotations

from numba import njit, prange

from ninfer.kernels_numba_cpu._layout import rows3
from ninfer.kernels_numba_cpu._prim import sigmoid, silu
from ninfer.kernels_numba_cpu._threads import launch


@njit(parallel=True, cache=True, fastmath=False)
def _sigmoid_mul_kernel(x, xs0, xs1, gate, gs0, gs1, out, os0, os1, n, heads, d):
    for r in prange(n * heads):
        t = r // heads
        i = r - t * heads
        xo = t * xs0 + i * xs1
        go = t * gs0 + i * gs1
        oo = t * os0 + i * os1
        for j in range(d):
            out[oo + j] = x[xo + j] * sigmoid(gate[go + j])


@njit(parallel=True, cache=True, fastmath=False)
def _swiglu_kernel(gate_up, out):
    n, inter = out.shape
    for t in prange(n):
        for j in range(inter):
            out[t, j] = silu(gate_up[t, j]) * gate_up[t, inter + j]


@njit(parallel=True, cache=True, fastmath=False)
def _sigmoid_scale_add_kernel(acc, y, gate, gs0):
    n, h = acc.shape
    for t in prange(n):
        s = sigmoid(gate[t * gs0])
        for j in range(h):
            acc[t, j] += s * y[t, j]


@njit(parallel=True, cache=True, fastmath=False)
def _add_inplace_kernel(acc, x):
    n, h = acc.shape
    for t in prange(n):
        for j in range(h):
            acc[t, j] += x[t, j]


def sigmoid_mul(x, gate, out) -> None:
    if x.size == 0:
        return
    xb, xs0, xs1 = rows3(x)
    gb, gs0, gs1 = rows3(gate)
    ob, os0, os1 = rows3(out)
    heads = 1 if x.ndim == 2 else x.shape[1]
    launch(_sigmoid_mul_kernel, 4 * x.size, xb, xs0, xs1, gb, gs0, gs1, ob, os0, os1, x.shape[0],
           heads, x.shape[-1])


def swiglu(gate_up, out) -> None:
    if out.size == 0:
        return
    launch(_swiglu_kernel, 4 * out.size, gate_up, out)


def sigmoid_scale_add(acc, y, gate) -> None:
    if acc.size == 0:
        return
    gb, gs0, _ = rows3(gate)
    launch(_sigmoid_scale_add_kernel, acc.size, acc, y, gb, gs0)


def add_inplace(acc, x) -> None:
    if acc.size == 0:
        return
    launch(_add_inplace_kernel, acc.size, acc, x)
