"""Launcher for gdn_decode.cu: `gdn_decode_fused`, one GDN layer's decode step in one kernel.

CUDA-only op (the unfused equivalent is gdn_conv -> split -> l2norm_heads (q scaled by
dk^-1/2) -> gdn_gates -> gdn_recurrence -> gated_rms_norm, one token per row).

One kernel, gdn_decode_fused_head2_kernel: grid (Hv, N), one block of 512 threads per head at
64 registers (2 blocks per SM for kc <= 4), one reduction round for the 4 column groups. Three
other bitwise-equal kernels were measured against it and removed: "cluster4" and "cluster2"
(sm_90 thread-block clusters of 4 / 2 blocks per head, the RMSNorm sums exchanged through
distributed shared memory) and "head" (one block per head at ~105 registers, a reduction round
per column group). 9B shape (Hv = 32), us per launch in a graph (`ninfer-bench kernels --op
gdn_decode_fused`, H200, 2026-11-30):

    B    head2  cluster4  cluster2  head
    1     4.8     5.7       5.9      6.7
    2     5.3    10.9       6.8      7.3
    3     6.1    12.3       9.0      8.2
    4     7.4    16.9      10.0      9.5
    8    11.9    29.9      19.8     18.2

(Variants that staged the state through shared memory by cp.async were measured earlier at
5.6 / 8.1 / 10.6 / 11.8 / 18.9 us at their best and were removed before.)
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ninfer import envs
from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda import _gdn_operands as O
from ninfer.kernels_cuda._loader import KernelSource, get_function, launch

_MAXK = (3, 7)  # instances: register windows for kc <= 4 and kc <= 8
KERNEL = "gdn_decode_fused_head2_kernel"
SOURCE = KernelSource("gdn_decode.cu", tuple(f"{KERNEL}<{m}>" for m in _MAXK))
# NINFER_GDN_STATE_L2_LAST (read once at import): the state's loads and stores carry an L2
# evict-last policy (SOURCE_L2_LAST: compile-time DEC_STATE_L2_LAST; the same bits)
STATE_L2_LAST = envs.gdn_state_l2_last()
SOURCE_L2_LAST = dataclasses.replace(SOURCE, options=("-DDEC_STATE_L2_LAST=1",))
_PARAMS = C.struct(*[(f, "ptr") for f in (
    "qkv", "conv_w", "conv_state", "a", "b", "a_log", "dt_bias", "state", "slots", "z",
    "norm_w", "out", "counters")],
    *[(f, "i64") for f in ("qkv_rs", "conv_w_rs", "conv_ss", "a_rs", "b_rs", "state_ss", "z_rs",
                           "z_hs", "out_rs", "out_hs")],
    *[(f, "i32") for f in ("key_heads", "value_heads", "dk", "dv", "kc", "channels")],
    ("eps", "f32"), ("l2_eps", "f32"), ("q_scale", "f32"), ("bf16_flags", "i32"))
assert _PARAMS.itemsize == 224
MAX_DIM = 128
OUT_BF16 = 16  # DEC_OUT_BF16 of bf16_flags
THREADS = 512


def decode_counters(max_rows: int, key_heads: int):
    """The zeroed int32 counter workspace gdn_decode_fused needs (keep it across launches)."""
    return C.cupy().zeros(max_rows * key_heads, dtype=np.int32)


def gdn_decode_fused(qkv, conv_weight, conv_state, a, b, a_log, dt_bias, state, slots, z,
                     norm_weight, eps: float, out, *, l2_eps: float = 1e-6,
                     counters=None) -> None:
    """One decode step of a GDN layer for N rows (one token each).

    qkv f32[N,C] (pre-conv [q|k|v] projection, rows strided), C = 2*Hk*dk + Hv*dv;
    conv_weight [C,Kc]; conv_state f32[S,Kc-1,C] and state f32[S,Hv,dk,dv] slot-strided and
    updated in place at slots[n]; a, b f32[N,Hv] rows strided; a_log, dt_bias [Hv];
    z f32[N,Hv,dv] rows strided; norm_weight [dv]; out f32[N,Hv,dv] = gated RMSNorm of the
    delta-rule output, or uint16 (bf16 bits of that f32 value, rounded to nearest even; the x
    of a bf16-x GEMV), rows and heads strided, last axis contiguous. `counters`: int32[>= N*Hk]
    zeros (decode_counters); allocated per call when None (not capturable). Rows must use
    distinct slots. dk, dv <= 128.
    Launched with programmatic dependent launch (the kernel waits before reading qkv, a, b, z,
    the conv state or the counters and before any write; it reads slots, state and weights
    before): the kernel just before it in the stream must not write `state` or `slots` (two
    launches back to back must use different slots, or have another kernel or a copy between).
    """
    C.device_array(qkv, "qkv", dtype=np.float32, ndim=2)
    n, channels = qkv.shape
    C.device_array(state, "state", dtype=np.float32, ndim=4)
    value_heads, dk, dv = state.shape[1:]
    ss = O.slot_strided(state, "state", (value_heads, dk, dv))
    C.require(dk <= MAX_DIM and dv <= MAX_DIM, "state", f"dk, dv must be <= {MAX_DIM}")
    C.require((channels - value_heads * dv) % (2 * dk) == 0 and channels > value_heads * dv,
              "qkv", f"width {channels} is not 2*Hk*{dk} + {value_heads}*{dv}")
    key_heads = (channels - value_heads * dv) // (2 * dk)
    C.require(value_heads % key_heads == 0, "qkv",
              f"Hv {value_heads} not a multiple of Hk {key_heads}")
    w, wk, w_rs = O.conv_weight(conv_weight, channels)
    kc = w.shape[1]
    css = O.slot_strided(conv_state, "conv_state", (kc - 1, channels))
    a_rs = O.matrix_rs(a, "a", n, value_heads)
    b_rs = O.matrix_rs(b, "b", n, value_heads)
    z_rs, z_hs = O.heads_view(z, "z", n, value_heads, dv)
    out_bf16 = C.is_bf16_bits(out)
    o_rs, o_hs = O.heads_view(out, "out", n, value_heads, dv,
                              dtype=np.uint16 if out_bf16 else np.float32)
    C.contiguous(C.device_array(slots, "slots", dtype=np.int32, shape=(n,)), "slots")
    small = []
    for arr, name, size in ((a_log, "a_log", value_heads), (dt_bias, "dt_bias", value_heads),
                            (norm_weight, "norm_weight", dv)):
        data, kind = C.weight_array(arr, name)
        C.require(data.shape == (size,) and data.flags.c_contiguous, name, f"expected [{size}]")
        small.append((data, kind))
    if n == 0:
        return
    if counters is None:
        counters = decode_counters(n, key_heads)
    C.device_array(counters, "counters", dtype=np.int32, ndim=1)
    C.require(counters.size >= n * key_heads, "counters", f"needs >= {n * key_heads} entries")
    flags = sum(1 << i for i, kind in enumerate([wk] + [k for _, k in small])
                if kind is C.WKind.BF16) | (OUT_BF16 if out_bf16 else 0)
    params = C.pack(_PARAMS, qkv=C.ptr(qkv), conv_w=C.ptr(w), conv_state=C.ptr(conv_state),
                    a=C.ptr(a), b=C.ptr(b), a_log=C.ptr(small[0][0]), dt_bias=C.ptr(small[1][0]),
                    state=C.ptr(state), slots=C.ptr(slots), z=C.ptr(z),
                    norm_w=C.ptr(small[2][0]), out=C.ptr(out), counters=C.ptr(counters),
                    qkv_rs=C.row_stride(qkv, "qkv"), conv_w_rs=w_rs, conv_ss=css, a_rs=a_rs,
                    b_rs=b_rs, state_ss=ss, z_rs=z_rs, z_hs=z_hs, out_rs=o_rs, out_hs=o_hs,
                    key_heads=key_heads, value_heads=value_heads, dk=dk, dv=dv, kc=kc,
                    channels=channels, eps=eps, l2_eps=l2_eps, q_scale=float(dk) ** -0.5,
                    bf16_flags=flags)
    maxk = next(m for m in _MAXK if kc - 1 <= m)
    fn = get_function(SOURCE_L2_LAST if STATE_L2_LAST else SOURCE, f"{KERNEL}<{maxk}>")
    launch(fn, (value_heads, n), (THREADS,), (params,),
           name="gdn_decode_fused", pdl=True)
