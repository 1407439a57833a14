"""CUDA-only gated-attention ops (fast paths of the CUDA backend).

- `attn_prep`: the layer's inputs in one launch: the zero-centred RMSNorm of each query and key
  head, partial MRoPE of both, the key and value written into their KV page slot, and the gate
  halves copied out of the fused projection. Bit for bit the same as rms_norm -> rope (q and k)
  -> kv_write plus the gate copy (tests/cuda/test_cuda_attn_prep.py).
- `paged_prefill_attention`: a prompt chunk's causal attention over the bf16 pages on tensor
  cores (query tiles of one sequence; kernels_cuda/attention_prefill.cu).

The CPU backend has no such kernels (`supports` says so); its Program uses the unfused ops.
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


def prefill_attention_supported(kv_dtype, head_dim: int, page_size: int) -> bool:
    """Whether `paged_prefill_attention` takes KV pages of this storage dtype, head dim and page
    size (the kernel module's own rule); otherwise use `paged_attention`."""
    return check.kernels(Backend.CUDA, "attention_prefill").supports(kv_dtype, head_dim,
                                                                     page_size)


def paged_prefill_attention(q, k_pages, v_pages, block_tables, seq: int, pos0: int,
                            scale: float, out, *, segment=None) -> None:
    """Causal attention of one prompt chunk on tensor cores: row i of q f32[L, A, D] is the
    query at position pos0 + i of block-table row `seq` and attends keys 0..pos0+i (already in
    the bf16 pages). Within ~1e-5 of `paged_attention` (q and p enter the bf16 mma as hi + lo
    terms); each row's result depends only on its position and the keys (chunking invariant).
    `segment`: optional int32[3] device copy of (seq, pos0, live rows) that the kernel reads
    when it runs (graph-replayed prompt chunks; rows >= live are padding, left unwritten)."""
    backend = backend_of(q, k_pages, v_pages, block_tables, out)
    if backend is not Backend.CUDA:
        raise TypeError("paged_prefill_attention is a CUDA-only op (use paged_attention)")
    n, a, d = check.array("paged_prefill_attention", "q", q, check.F32, (None, None, None),
                          _ROWS)
    check.array("paged_prefill_attention", "out", out, check.F32, (n, a, d), _ROWS)
    if segment is not None:
        check.array("paged_prefill_attention", "segment", segment, check.I32, (3,))
    check.kernels(backend, "attention_prefill").paged_prefill_attention(
        q, k_pages, v_pages, block_tables, seq, pos0, scale, out, segment=segment)
