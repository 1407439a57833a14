"""CUDA-only Gated DeltaNet ops (the fast paths of the CUDA backend).

- `gdn_chunk_prefill`: the chunkwise-parallel (WY) form of `gdn_recurrence` (same operands, same
  state update; not bitwise: within fp32 tolerance with 3xTF32 products, about 1e-2 relative
  with bf16 products, which the CUDA backend picks for bf16 models).
- `gdn_decode_fused`: one decode step of a GDN layer in one kernel: conv update + SiLU, q/k L2
  norm (q scaled by dk^-1/2), gates, recurrence and the gated RMSNorm, for N rows of one token
  each (distinct slots). Equivalent to gdn_conv -> l2norm_heads -> gdn_gates -> gdn_recurrence
  -> gated_rms_norm.

The CPU backend has no such kernels (`supports` says so); its Program uses the unfused ops.
"""
from __future__ import annotations

from ninfer.ops import _checks as check
from ninfer.ops._backend import Backend, backend_of

_ROWS = check.Layout.ROWS
_SLOTS = check.Layout.SLOTS


def supports(backend: Backend) -> bool:
    return backend is Backend.CUDA


def _cuda_only(op: str, backend: Backend) -> None:
    if backend is not Backend.CUDA:
        raise TypeError(f"{op} is a CUDA-only op (the CPU backend uses the unfused GDN ops)")


def gdn_chunk_prefill(q, k, v, g, beta, state, seg_starts, seg_slots, out, *,
                      workspace=None, precision=None) -> None:
    """Operands as `ninfer.ops.gdn_recurrence`; `workspace`: a kernels_cuda ChunkWorkspace;
    `precision`: kernels_cuda.gdn_chunk.Precision of the matrix products (None: the launcher's
    default)."""
    backend = backend_of(q, k, v, g, beta, state, seg_starts, seg_slots, out)
    _cuda_only("gdn_chunk_prefill", backend)
    n, hk, dk = check.array("gdn_chunk_prefill", "q", q, check.F32, (None, None, None), _ROWS)
    check.array("gdn_chunk_prefill", "k", k, check.F32, (n, hk, dk), _ROWS)
    _, hv, dv = check.array("gdn_chunk_prefill", "v", v, check.F32, (n, None, None), _ROWS)
    check.array("gdn_chunk_prefill", "state", state, check.F32, (None, hv, dk, dv), _SLOTS)
    check.array("gdn_chunk_prefill", "out", out, check.F32, (n, hv, dv))
    check.kernels(backend, "gdn_chunk").gdn_chunk_prefill(
        q, k, v, g, beta, state, seg_starts, seg_slots, out, workspace=workspace,
        precision=precision)


def gdn_decode_fused(qkv, conv_weight, conv_state, a, b, a_log, dt_bias, state, slots, z,
                     norm_weight, eps: float, out, *, counters=None) -> None:
    """qkv f32[N, C] (pre-conv projection, rows strided); conv_state f32[S, Kc-1, C] and state
    f32[S, Hv, dk, dv] slot-strided, updated in place at slots[n]; a, b f32[N, Hv]; z
    f32[N, Hv, dv]; out f32[N, Hv, dv] C-contiguous, or its bf16 bits (uint16: each value
    rounded to nearest even; the x of a bf16-x GEMV, `ops.linear.reads_bf16_x`). `counters`:
    kernels_cuda decode_counters workspace."""
    backend = backend_of(qkv, conv_weight, conv_state, a, b, a_log, dt_bias, state, slots, z,
                         norm_weight, out)
    _cuda_only("gdn_decode_fused", backend)
    n, c = check.array("gdn_decode_fused", "qkv", qkv, check.F32, (None, None), _ROWS)
    check.array("gdn_decode_fused", "slots", slots, check.I32, (n,))
    _, hv, dk, dv = check.array("gdn_decode_fused", "state", state, check.F32,
                                (None, None, None, None), _SLOTS)
    check.f32_or_bf16("gdn_decode_fused", "out", out, backend, (n, hv, dv))
    check.kernels(backend, "gdn_decode").gdn_decode_fused(
        qkv, conv_weight, conv_state, a, b, a_log, dt_bias, state, slots, z, norm_weight, eps,
        out, counters=counters)
