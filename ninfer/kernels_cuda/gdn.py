"""Launchers for gdn.cu: gdn_conv, gdn_gates, gdn_recurrence (docs/ops.md); re-exports the
chunkwise prefill (`gdn_chunk.py`) and the fused decode step (`gdn_decode.py`).

Segments: rows seg_starts[g]..seg_starts[g+1]-1 are consecutive tokens of the sequence whose
state is slot seg_slots[g] (seg_starts i32[G+1] ascending, covering all N rows).
"""
from __future__ import annotations

import numpy as np

from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda import _gdn_operands as O
from ninfer.kernels_cuda._loader import KernelSource, get_function, launch
from ninfer.kernels_cuda.gdn_chunk import gdn_chunk_prefill
from ninfer.kernels_cuda.gdn_decode import gdn_decode_fused

_RPT = (2, 4, 8, 16, 32)  # recurrence: state rows per thread (dk <= 4 * RPT)
SOURCE = KernelSource("gdn.cu", tuple(
    [f"gdn_conv_kernel<{k.ctype}>" for k in C.WKind]
    + [f"gdn_conv_step_kernel<{k.ctype}>" for k in C.WKind]
    + ["gdn_conv_state_kernel"]
    + [f"gdn_gates_kernel<{a.ctype}, {d.ctype}>" for a in C.WKind for d in C.WKind]
    + [f"gdn_recurrence_kernel<{r}>" for r in _RPT]))

_CONV = C.struct(("x", "ptr"), ("w", "ptr"), ("state", "ptr"), ("seg_starts", "ptr"),
                 ("seg_slots", "ptr"), ("out", "ptr"), ("x_rs", "i64"), ("w_rs", "i64"),
                 ("state_ss", "i64"), ("out_rs", "i64"), ("n", "i32"), ("channels", "i32"),
                 ("kc", "i32"), ("num_segs", "i32"))
assert _CONV.itemsize == 96
_REC = C.struct(*[(f, "ptr") for f in ("q", "k", "v", "g", "beta", "state", "seg_starts",
                                         "seg_slots", "out")],
                *[(f, "i64") for f in ("q_rs", "q_hs", "k_rs", "k_hs", "v_rs", "v_hs", "g_rs",
                                       "beta_rs", "out_rs", "out_hs", "state_ss")],
                ("key_heads", "i32"), ("value_heads", "i32"), ("dk", "i32"), ("dv", "i32"),
                ("num_segs", "i32"), ("pad", "i32"))
assert _REC.itemsize == 184


def gdn_conv(x, weight, conv_state, seg_starts, seg_slots, out) -> None:
    """Causal depthwise conv + SiLU per segment, continuing from and updating conv_state.

    x f32[N,C] rows strided; weight [C,Kc]; conv_state f32[S,Kc-1,C] slot-strided; out f32[N,C].
    """
    C.device_array(x, "x", dtype=np.float32, ndim=2)
    n, channels = x.shape
    w, kind, w_rs = O.conv_weight(weight, channels)
    kc = w.shape[1]
    ss = O.slot_strided(conv_state, "conv_state", (kc - 1, channels))
    C.device_array(out, "out", dtype=np.float32, shape=(n, channels))
    g = O.segments(seg_starts, seg_slots, n)
    if n == 0 or g == 0 or channels == 0:
        return
    params = C.pack(_CONV, x=C.ptr(x), w=C.ptr(w), state=C.ptr(conv_state),
                    seg_starts=C.ptr(seg_starts), seg_slots=C.ptr(seg_slots), out=C.ptr(out),
                    x_rs=C.row_stride(x, "x"), w_rs=w_rs, state_ss=ss,
                    out_rs=C.row_stride(out, "out"), n=n, channels=channels, kc=kc, num_segs=g)
    cblocks = (channels + 127) // 128
    if n == g:  # decode-like: one thread per (segment, channel) walks its tokens
        launch(get_function(SOURCE, f"gdn_conv_step_kernel<{kind.ctype}>"), (cblocks, g),
               (128,), (params,), name="gdn_conv_step")
        return
    launch(get_function(SOURCE, f"gdn_conv_kernel<{kind.ctype}>"), (n, cblocks), (128,),
           (params,), name="gdn_conv")
    if kc > 1:
        launch(get_function(SOURCE, "gdn_conv_state_kernel"), (cblocks, g), (128,), (params,),
               name="gdn_conv_state")


def gdn_gates(a, b, a_log, dt_bias, g_out, beta_out) -> None:
    """g = -exp(a_log) * softplus(a + dt_bias); beta = sigmoid(b). a, b, outs f32[N,Hv]."""
    C.device_array(a, "a", dtype=np.float32, ndim=2)
    n, heads = a.shape
    rs = [O.matrix_rs(t, nm, n, heads) for t, nm in ((a, "a"), (b, "b"), (g_out, "g_out"),
                                                      (beta_out, "beta_out"))]
    al, ak = C.weight_array(a_log, "a_log")
    dt, dk = C.weight_array(dt_bias, "dt_bias")
    C.require(al.shape == (heads,) and al.flags.c_contiguous, "a_log", f"expected [{heads}]")
    C.require(dt.shape == (heads,) and dt.flags.c_contiguous, "dt_bias", f"expected [{heads}]")
    total = n * heads
    if total == 0:
        return
    launch(get_function(SOURCE, f"gdn_gates_kernel<{ak.ctype}, {dk.ctype}>"),
           ((total + 255) // 256,), (256,),
           (a, np.int64(rs[0]), b, np.int64(rs[1]), al, dt, np.int32(n), np.int32(heads),
            g_out, np.int64(rs[2]), beta_out, np.int64(rs[3])), name="gdn_gates")


def gdn_recurrence(q, k, v, g, beta, state, seg_starts, seg_slots, out) -> None:
    """The gated delta rule token by token (docs/ops.md); updates state in place.

    q, k f32[N,Hk,dk]; v f32[N,Hv,dv] (all rows strided); g, beta f32[N,Hv];
    state f32[S,Hv,dk,dv] slot-strided; out f32[N,Hv,dv]. dk <= 128.
    """
    f = O.recurrence_operands(q, k, v, g, beta, state, seg_starts, seg_slots, out)
    n = f.pop("n")
    C.require(f["dk"] <= 4 * _RPT[-1], "q", f"dk {f['dk']} > {4 * _RPT[-1]}")
    if n == 0 or f["num_segs"] == 0:
        return
    rpt = next(r for r in _RPT if 4 * r >= f["dk"])
    params = C.pack(_REC, **f)
    launch(get_function(SOURCE, f"gdn_recurrence_kernel<{rpt}>"),
           (f["num_segs"], f["value_heads"], (f["dv"] + 31) // 32), (128,), (params,),
           name="gdn_recurrence")


__all__ = ["gdn_conv", "gdn_gates", "gdn_recurrence", "gdn_chunk_prefill", "gdn_decode_fused"]
