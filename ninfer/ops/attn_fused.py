"""CUDA-only gated-attention op (a fast path of the CUDA backend).

- `attn_prep`: the layer's inputs in one launch: the zero-centred RMSNorm of each query and key
  head, partial MRoPE of both, the key and value written into their KV page slot, and the gate
  halves copied out of the fused projection. Bit for bit the same as rms_norm -> rope (q and k)
  -> kv_write plus the gate copy (tests/cuda/test_cuda_attn_prep.py).

The CPU backend has no such kernel (`supports` says so); its Program uses the unfused ops.
"""
from __future__ import annotations

from ninfer.ops import _checks as check
from ninfer.ops._backend import Backend, backend_of

_ROWS = check.Layout.ROWS


def supports(backend: Backend) -> bool:
    return backend is Backend.CUDA


def attn_prep(q_and_gate, k, v, q_norm, k_norm, eps: float, positions, inv_freq, freq_axis,
              q_out, gate_out, k_pages, v_pages, block_tables, row_seq, row_pos) -> None:
    """q_and_gate f32[N, A, 2D] (per head [q_h | gate_h]), k, v f32[N, Hkv, D]; q_norm, k_norm
    [D]; positions i32[3, N], inv_freq f32[R/2], freq_axis i32[R/2] (as `rope`); writes q_out and
    gate_out f32[N, A, D] and row n's key/value at position row_pos[n] of block-table row
    row_seq[n] (as `kv_write`)."""
    backend = backend_of(q_and_gate, k, v, positions, q_out, gate_out, k_pages, v_pages,
                         block_tables, row_seq, row_pos)
    if backend is not Backend.CUDA:
        raise TypeError("attn_prep is a CUDA-only op (the CPU backend uses the unfused ops)")
    n, a, d2 = check.array("attn_prep", "q_and_gate", q_and_gate, check.F32, (None, None, None),
                           _ROWS)
    _, hkv, d = check.array("attn_prep", "k", k, check.F32, (n, None, d2 // 2), _ROWS)
    check.array("attn_prep", "v", v, check.F32, (n, hkv, d), _ROWS)
    check.array("attn_prep", "q_out", q_out, check.F32, (n, a, d), _ROWS)
    check.array("attn_prep", "gate_out", gate_out, check.F32, (n, a, d), _ROWS)
    check.kernels(backend, "attn_prep").attn_prep(
        q_and_gate, k, v, q_norm, k_norm, eps, positions, inv_freq, freq_axis, q_out, gate_out,
        k_pages, v_pages, block_tables, row_seq, row_pos)
