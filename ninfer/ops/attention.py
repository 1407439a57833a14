"""Paged KV ops: `kv_write` and causal GQA `paged_attention` (docs/ops.md, "Paged KV")."""
from __future__ import annotations

import numpy as np

from ninfer.core.dtypes import DType
from ninfer.ops import _checks as check
from ninfer.ops._backend import backend_of

PAGE_DTYPES = {np.dtype(np.float32): DType.FLOAT32, np.dtype(np.uint16): DType.BFLOAT16}


def supports(page_dtype: DType) -> bool:
    return page_dtype in (DType.FLOAT32, DType.BFLOAT16)


def _pages(op: str, k_pages, v_pages) -> tuple[int, ...]:
    for name, pages in (("k_pages", k_pages), ("v_pages", v_pages)):
        if getattr(pages, "dtype", None) not in PAGE_DTYPES:
            raise TypeError(f"{op}: {name} must be float32 or uint16 (bf16) pages, "
                            f"got {getattr(pages, 'dtype', type(pages).__name__)}")
    shape = check.array(op, "k_pages", k_pages, k_pages.dtype, (None,) * 4)
    check.array(op, "v_pages", v_pages, k_pages.dtype, shape)
    return shape


def _rows(op: str, block_tables, row_seq, row_pos, n: int) -> None:
    check.array(op, "block_tables", block_tables, check.I32, (None, None))
    check.array(op, "row_seq", row_seq, check.I32, (n,))
    check.array(op, "row_pos", row_pos, check.I32, (n,))


def kv_write(k, v, k_pages, v_pages, block_tables, row_seq, row_pos) -> None:
    """Store k[n], v[n] (f32[N, Hkv, D], rows strided) at position row_pos[n] of the sequence in
    block-table row row_seq[n]; pages are [num_pages, Hkv, page_size, D], f32 or bf16 (rounded to
    nearest even). Positions and page ids are range-checked on the CPU."""
    backend = backend_of(k, v, k_pages, v_pages, block_tables, row_seq, row_pos)
    _, hkv, _, d = _pages("kv_write", k_pages, v_pages)
    n, _, _ = check.array("kv_write", "k", k, check.F32, (None, hkv, d), check.Layout.ROWS)
    check.array("kv_write", "v", v, check.F32, (n, hkv, d), check.Layout.ROWS)
    _rows("kv_write", block_tables, row_seq, row_pos, n)
    check.kernels(backend, "attention").kv_write(k, v, k_pages, v_pages, block_tables,
                                                 row_seq, row_pos)


def paged_attention(q, k_pages, v_pages, block_tables, row_seq, row_pos, scale, out, *,
                    workspace=None, gate=None, past_kv_ready: bool = False) -> None:
    """Causal attention of q[n] (f32[N, A, D], rows/heads strided) over keys 0..row_pos[n] of
    its sequence; query head h reads KV head h // (A // Hkv). out: f32[N, A, D] C-contiguous,
    or on CUDA its bf16 bits (uint16: each value rounded to nearest even; the x of a bf16-x
    GEMV, `ops.linear.reads_bf16_x`).

    gate: optional f32[N, A, D] (rows/heads strided, last axis contiguous, e.g. the gate half
    of an interleaved per-head [q_h | gate_h] projection): out = attention * sigmoid(gate),
    bitwise `paged_attention` then `sigmoid_mul` on either backend (one launch less).

    past_kv_ready (CUDA; ignored on the CPU): the caller promises that each row's keys before
    its own position and the index arrays were complete before the previous kernel started
    (decode steps: one row per sequence), so the kernel may read them early (same results)."""
    backend = backend_of(q, k_pages, v_pages, block_tables, row_seq, row_pos, out,
                         *(() if gate is None else (gate,)))
    _, hkv, _, d = _pages("paged_attention", k_pages, v_pages)
    n, heads, _ = check.array("paged_attention", "q", q, check.F32, (None, None, d),
                              check.Layout.ROWS)
    if heads % hkv:
        raise ValueError(f"paged_attention: {heads} query heads are not a multiple of "
                         f"{hkv} KV heads")
    _rows("paged_attention", block_tables, row_seq, row_pos, n)
    check.scalar("paged_attention", "scale", scale)
    check.f32_or_bf16("paged_attention", "out", out, backend, (n, heads, d))
    if gate is not None:
        check.array("paged_attention", "gate", gate, check.F32, (n, heads, d), check.Layout.ROWS)
    check.kernels(backend, "attention").paged_attention(
        q, k_pages, v_pages, block_tables, row_seq, row_pos, scale, out, gate=gate,
        **check.scratch(backend, workspace=workspace, past_kv_ready=past_kv_ready or None))
