"""Operand checks shared by the GDN launchers (gdn.py, gdn_chunk.py, gdn_decode.py)."""
from __future__ import annotations

import numpy as np

from ninfer.kernels_cuda import _checks as C

MAX_KC = 8


def segments(seg_starts, seg_slots, n: int) -> int:
    """Check the segment arrays; return G."""
    C.contiguous(C.device_array(seg_slots, "seg_slots", dtype=np.int32, ndim=1), "seg_slots")
    g = seg_slots.shape[0]
    C.contiguous(C.device_array(seg_starts, "seg_starts", dtype=np.int32, shape=(g + 1,)),
                 "seg_starts")
    return g


def slot_strided(state, name: str, inner_shape: tuple) -> int:
    """Check a slot-strided state view [S, *inner] (inner axes contiguous); return slot stride."""
    C.device_array(state, name, dtype=np.float32, ndim=1 + len(inner_shape))
    C.require(tuple(state.shape[1:]) == tuple(inner_shape), name,
              f"shape {tuple(state.shape)}, expected [S, {', '.join(map(str, inner_shape))}]")
    st = C.inner_contiguous(state, name, len(inner_shape))
    return st[0]


def conv_weight(weight, channels=None):
    """(storage [C, Kc] view, WKind, row stride) of a depthwise conv weight [C, Kc] or [C,1,Kc]."""
    w, kind = C.weight_array(weight, "conv_weight")
    if w.ndim == 3 and w.shape[1] == 1:
        w = w.reshape(w.shape[0], w.shape[2])
    C.require(w.ndim == 2, "conv_weight", f"expected [C, Kc], got shape {w.shape}")
    if channels is not None:
        C.require(w.shape[0] == channels, "conv_weight", f"{w.shape[0]} channels != {channels}")
    C.require(1 <= w.shape[1] <= MAX_KC, "conv_weight", f"kernel width {w.shape[1]} > {MAX_KC}")
    return w, kind, C.row_stride(w, "conv_weight")


def matrix_rs(x, name, n, m) -> int:
    C.device_array(x, name, dtype=np.float32, shape=(n, m))
    return C.row_stride(x, name)


def heads_view(x, name: str, n: int, heads=None, dim=None,
               dtype=np.float32) -> tuple[int, int]:
    """Check `dtype`[N, heads, dim] (default f32) with a contiguous last axis; return (row,
    head) strides (`_checks.per_head` with N required)."""
    return C.per_head(x, name, n, heads, dim, dtype=dtype)


def recurrence_operands(q, k, v, g, beta, state, seg_starts, seg_slots, out) -> dict:
    """Shared checks of gdn_recurrence / gdn_chunk_prefill; returns the params fields."""
    C.device_array(q, "q", dtype=np.float32, ndim=3)
    n, key_heads, dk = q.shape
    C.device_array(v, "v", dtype=np.float32, ndim=3)
    value_heads, dv = v.shape[1], v.shape[2]
    q_rs, q_hs = heads_view(q, "q", n)
    k_rs, k_hs = heads_view(k, "k", n, key_heads, dk)
    v_rs, v_hs = heads_view(v, "v", n, value_heads, dv)
    o_rs, o_hs = heads_view(out, "out", n, value_heads, dv)
    g_rs = matrix_rs(g, "g", n, value_heads)
    b_rs = matrix_rs(beta, "beta", n, value_heads)
    C.require(value_heads % key_heads == 0, "v",
              f"{value_heads} value heads not a multiple of {key_heads} key heads")
    ss = slot_strided(state, "state", (value_heads, dk, dv))
    num_segs = segments(seg_starts, seg_slots, n)
    return dict(q=C.ptr(q), k=C.ptr(k), v=C.ptr(v), g=C.ptr(g), beta=C.ptr(beta),
                state=C.ptr(state), seg_starts=C.ptr(seg_starts), seg_slots=C.ptr(seg_slots),
                out=C.ptr(out), q_rs=q_rs, q_hs=q_hs, k_rs=k_rs, k_hs=k_hs, v_rs=v_rs, v_hs=v_hs,
                g_rs=g_rs, beta_rs=b_rs, out_rs=o_rs, out_hs=o_hs, state_ss=ss,
                key_heads=key_heads, value_heads=value_heads, dk=dk, dv=dv, num_segs=num_segs,
                n=n)
