"""Launcher for attention_prefill.cu: `paged_prefill_attention`, causal GQA attention of a prompt
chunk over the bf16 paged KV cache on bf16 tensor cores (flash attention, query tiles).

Accuracy: q and the softmax weights are split into bf16 hi + lo parts (K and V are exact in
bf16), so the result is within ~1e-5 relative of fp32 attention. Row invariance: a row's result
depends only on its position and the KV contents (not on L, pos0 or the other rows of its tile),
so running a prompt whole or in chunks gives bitwise identical rows. f32 pages are not supported
(`attention.paged_attention` handles them).
"""
from __future__ import annotations

import math
import operator

import numpy as np

from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda._loader import KernelSource, get_function, launch

# head dim -> (BM rows (query, head) pairs per block = 2*BM threads, BN keys per step).
# D=256: 128 x 64 tiles, 198 KiB shared memory, 255 registers: one block (8 warps) per SM.
# D=128 / 64: 64 x 64 tiles, 68 / 36 KiB, 168 / 128 registers: 3 / 4 blocks per SM.
# BN fixes the key blocks, hence the rounding of a row: keep it fixed per head dim.
TILES = {64: (64, 64), 128: (64, 64), 256: (128, 64)}
LOG2E = 1.4426950408889634
SOURCE = KernelSource("attention_prefill.cu", tuple(
    f"paged_prefill_attention_kernel<{d}, {bm}, {bn}>" for d, (bm, bn) in TILES.items()))

_PARAMS = C.struct(("q", "ptr"), ("out", "ptr"), ("k_pages", "ptr"), ("v_pages", "ptr"),
                   ("bt", "ptr"), ("q_rs", "i64"), ("q_hs", "i64"), ("out_rs", "i64"),
                   ("out_hs", "i64"), ("rows", "i32"), ("group", "i32"), ("kv_heads", "i32"),
                   ("num_pages", "i32"), ("page_size", "i32"), ("pos0", "i32"),
                   ("num_tiles", "i32"), ("qscale", "f32"), ("segment", "ptr"),
                   ("bt_rs", "i64"))
assert _PARAMS.itemsize == 120


def smem_bytes(dim: int) -> int:
    """Dynamic shared memory of the kernel for head dim `dim`: Q hi/lo [BM], K, V [BN] rows."""
    bm, bn = TILES[dim]
    return (2 * bm + 2 * bn) * (dim + 8) * 2


def _int(value, name: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        C.fail(name, f"expected an int, got {type(value).__name__}")


def supports(page_dtype, head_dim: int, page_size: int) -> bool:
    """Whether pages of this storage dtype, head dim and page size are taken by
    `paged_prefill_attention` (bf16 pages, D in TILES, page_size a multiple of 16)."""
    return (str(page_dtype) in ("uint16", "bfloat16") and head_dim in TILES
            and page_size > 0 and page_size % 16 == 0)


def paged_prefill_attention(q, k_pages, v_pages, block_tables, seq: int, pos0: int,
                            scale: float, out, *, segment=None) -> None:
    """Causal attention of one sequence's rows at positions pos0 .. pos0+L-1.

    q f32[L, A, D] (rows/heads strided, inner dim contiguous); out f32[L, A, D] likewise.
    k_pages, v_pages: bf16 [P, Hkv, page_size, D] (uint16 or bfloat16 storage, contiguous,
    16-byte aligned), page_size a multiple of 16, D in 64/128/256. block_tables int32 [S, cols]
    on the device; `seq` (host int) picks its row. Row i attends keys 0 .. pos0+i, which must
    already be in the pages (the chunk's own keys included); query head h reads KV head
    h // (A // Hkv). Rows whose keys reach an invalid page id (outside [0, P)) come out NaN.

    `segment`: optional int32[3] device array {seq, pos0, live}; the kernel then reads the row,
    the first position and the live row count from it when it runs (a CUDA graph replays one
    capture for chunks of any sequence, position and length up to L): rows >= live are padding,
    neither computed nor written. `seq` and `pos0` are still checked here, against the
    capture's values; whoever rewrites `segment` before a replay checks the new ones.
    """
    kp, vp, kind = C.kv_pages(k_pages, v_pages)
    C.require(kind is C.WKind.BF16, "k_pages",
              "f32 pages are not supported by the prefill kernel (use paged_attention)")
    C.require(C.aligned(kp) and C.aligned(vp), "k_pages", "pages must be 16-byte aligned")
    num_pages, kv_heads, page_size, dim = kp.shape
    C.require(dim in TILES, "k_pages", f"head dim {dim} not in {'/'.join(map(str, TILES))}")
    C.require(page_size > 0 and page_size % 16 == 0, "k_pages",
              f"page size {page_size} is not a multiple of 16")
    C.require(kv_heads > 0, "k_pages", "no KV heads")
    C.require(num_pages * kv_heads * page_size < 2**31, "k_pages",
              "more than 2^31 - 1 page rows (the kernel indexes them with int32)")
    C.device_array(q, "q", ndim=3)
    n, q_heads = q.shape[0], q.shape[1]
    q_rs, q_hs = C.per_head(q, "q", n, q_heads, dim)
    o_rs, o_hs = C.per_head(out, "out", n, q_heads, dim)
    C.require(q_heads > 0 and q_heads % kv_heads == 0, "q",
              f"{q_heads} query heads not a multiple of {kv_heads} KV heads")
    C.device_array(block_tables, "block_tables", dtype=np.int32, ndim=2)
    bt_rs = C.row_stride(block_tables, "block_tables")
    seq, pos0 = _int(seq, "seq"), _int(pos0, "pos0")
    num_seqs, bt_cols = block_tables.shape
    C.require(0 <= seq < num_seqs, "seq", f"{seq} not in [0, {num_seqs})")
    C.require(pos0 >= 0, "pos0", f"{pos0} < 0")
    C.require(pos0 + n <= bt_cols * page_size, "pos0",
              f"positions up to {pos0 + n - 1} exceed the block table's {bt_cols} pages "
              f"of {page_size}")
    C.require(isinstance(scale, (int, float, np.floating)) and math.isfinite(scale), "scale",
              f"{scale!r} is not a finite number")
    if segment is not None:
        C.contiguous(C.device_array(segment, "segment", dtype=np.int32, shape=(3,)), "segment")
    if n == 0:
        return
    group = q_heads // kv_heads
    bm, bn = TILES[dim]
    tiles = -(-n * group // bm)
    C.require(tiles * kv_heads < 2**31 and n * group + bm < 2**31, "q",
              f"{n} rows x {group} heads is too many for one call")
    params = C.pack(_PARAMS, q=C.ptr(q), out=C.ptr(out), k_pages=C.ptr(kp), v_pages=C.ptr(vp),
                    bt=C.ptr(block_tables) + (0 if segment is not None else seq * bt_rs * 4),
                    segment=C.ptr(segment) if segment is not None else 0, bt_rs=bt_rs,
                    q_rs=q_rs, q_hs=q_hs,
                    out_rs=o_rs, out_hs=o_hs, rows=n, group=group, kv_heads=kv_heads,
                    num_pages=num_pages, page_size=page_size, pos0=pos0, num_tiles=tiles,
                    qscale=float(scale) * LOG2E)
    smem = smem_bytes(dim)
    fn = get_function(SOURCE, f"paged_prefill_attention_kernel<{dim}, {bm}, {bn}>")
    if smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    launch(fn, (tiles * kv_heads,), (2 * bm,), (params,), shared_mem=smem,
           name="paged_prefill_attention")
