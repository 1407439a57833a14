"""CPU kernels for `rms_norm`, `add_rms_norm`, `gated_rms_norm` and `l2norm_heads`.

Each normalised vector is one "row" addressed by (token n, head i) offsets into a flat buffer.
Sums of squares are sequential fp32 over the last axis; 1/sqrt is taken in fp32.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ninfer.kernels_numba_cpu._layout import rows3
from ninfer.kernels_numba_cpu._prim import F0, F1, silu, widen
from ninfer.kernels_numba_cpu._threads import launch


@njit(inline="always")
def _inv_rms(x, xo, d, eps):
    ss = F0
    for j in range(d):
        v = x[xo + j]
        ss += v * v
    return F1 / np.sqrt(ss / np.float32(d) + eps)


@njit(parallel=True, cache=True, fastmath=False)
def _rms_norm_kernel(x, xs0, xs1, w, eps, out, os0, os1, n, heads, d, zero_centered):
    for r in prange(n * heads):
        t = r // heads
        i = r - t * heads
        xo = t * xs0 + i * xs1
        oo = t * os0 + i * os1
        inv = _inv_rms(x, xo, d, eps)
        if zero_centered:
            for j in range(d):
                out[oo + j] = (x[xo + j] * inv) * (F1 + widen(w[j]))
        else:
            for j in range(d):
                out[oo + j] = (x[xo + j] * inv) * widen(w[j])


@njit(parallel=True, cache=True, fastmath=False)
def _add_rms_norm_kernel(res, x, w, eps, out):
    n, h = res.shape
    for t in prange(n):
        for j in range(h):
            res[t, j] += x[t, j]
        ss = F0
        for j in range(h):
            v = res[t, j]
            ss += v * v
        inv = F1 / np.sqrt(ss / np.float32(h) + eps)
        for j in range(h):
            out[t, j] = (res[t, j] * inv) * (F1 + widen(w[j]))


@njit(parallel=True, cache=True, fastmath=False)
def _gated_rms_norm_kernel(x, w, eps, z, zs0, zs1, out):
    n, heads, d = x.shape
    for r in prange(n * heads):
        t = r // heads
        i = r - t * heads
        zo = t * zs0 + i * zs1
        ss = F0
        for j in range(d):
            v = x[t, i, j]
            ss += v * v
        inv = F1 / np.sqrt(ss / np.float32(d) + eps)
        for j in range(d):
            out[t, i, j] = (widen(w[j]) * (x[t, i, j] * inv)) * silu(z[zo + j])


@njit(parallel=True, cache=True, fastmath=False)
def _l2norm_kernel(x, xs0, xs1, eps, scale, out):
    n, heads, d = out.shape
    for r in prange(n * heads):
        t = r // heads
        i = r - t * heads
        xo = t * xs0 + i * xs1
        ss = F0
        for j in range(d):
            v = x[xo + j]
            ss += v * v
        inv = F1 / np.sqrt(ss + eps)
        for j in range(d):
            out[t, i, j] = (x[xo + j] * inv) * scale


def rms_norm(x, weight, eps, out, *, zero_centered) -> None:
    if x.size == 0:
        return
    xb, xs0, xs1 = rows3(x)
    ob, os0, os1 = rows3(out)
    heads = 1 if x.ndim == 2 else x.shape[1]
    launch(_rms_norm_kernel, x.size, xb, xs0, xs1, weight.data, np.float32(eps), ob, os0, os1,
           x.shape[0], heads, x.shape[-1], bool(zero_centered))


def add_rms_norm(residual, x, weight, eps, out) -> None:
    if residual.size == 0:
        return
    launch(_add_rms_norm_kernel, 2 * x.size, residual, x, weight.data, np.float32(eps), out)


def gated_rms_norm(x, z, weight, eps, out) -> None:
    if x.size == 0:
        return
    zb, zs0, zs1 = rows3(z)
    launch(_gated_rms_norm_kernel, 4 * x.size, x, weight.data, np.float32(eps), zb, zs0, zs1, out)


def l2norm_heads(x, eps, scale, out) -> None:
    if x.size == 0:
        return
    xb, xs0, xs1 = rows3(x)
    launch(_l2norm_kernel, x.size, xb, xs0, xs1, np.float32(eps), np.float32(scale), out)
