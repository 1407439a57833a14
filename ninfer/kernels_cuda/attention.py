"""Launchers for attention.cu: `kv_write` and `paged_attention` (docs/ops.md).

`paged_attention` cuts each row's context into chunks of `CHUNK` keys. With at most
`SPLIT_MAX_ROWS` rows (decode), chunks run in separate blocks (flash-decoding) and a second
launch merges their partials, which live in an `AttentionWorkspace` (pass one sized for the
largest decode batch and context; allocated per call when None, which is not capturable).
With more rows (prefill), each block loops over its row's chunks: no workspace. Both modes give
bitwise identical rows.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda._loader import KernelSource, get_function, launch

CHUNK = 256  # keys per split (ATTN_CHUNK in attention.cu)
SPLIT_MAX_ROWS = 64
_DPL = (1, 2, 4, 8)  # head_dim = 32 * DPL
_GW = (1, 2, 3, 4)
SOURCE = KernelSource("attention.cu", tuple(
    [f"kv_write_kernel<{k.ctype}>" for k in C.WKind]
    + [f"paged_attention_kernel<{k.ctype}, {gw}, {dpl}, {split}>"
       for k in C.WKind for gw in _GW for dpl in _DPL for split in (0, 1)]
    + ["paged_attention_combine_kernel"]))

_KVW = C.struct(("k", "ptr"), ("v", "ptr"), ("k_pages", "ptr"), ("v_pages", "ptr"),
                ("block_tables", "ptr"), ("row_seq", "ptr"), ("row_pos", "ptr"), ("k_rs", "i64"),
                ("k_hs", "i64"), ("v_rs", "i64"), ("v_hs", "i64"), ("bt_rs", "i64"),
                ("num_pages", "i32"), ("page_size", "i32"), ("kv_heads", "i32"),
                ("head_dim", "i32"), ("num_seqs", "i32"), ("bt_cols", "i32"))
assert _KVW.itemsize == 120
_ATTN = C.struct(("q", "ptr"), ("out", "ptr"), ("k_pages", "ptr"), ("v_pages", "ptr"),
                 ("block_tables", "ptr"), ("row_seq", "ptr"), ("row_pos", "ptr"),
                 ("part_o", "ptr"), ("part_ml", "ptr"), ("q_rs", "i64"), ("q_hs", "i64"),
                 ("out_rs", "i64"), ("out_hs", "i64"), ("bt_rs", "i64"), ("num_pages", "i32"),
                 ("page_size", "i32"), ("kv_heads", "i32"), ("q_heads", "i32"),
                 ("num_seqs", "i32"), ("bt_cols", "i32"), ("max_chunks", "i32"),
                 ("head_groups", "i32"), ("scale", "f32"), ("pad", "i32"))
assert _ATTN.itemsize == 152


@dataclasses.dataclass(frozen=True)
class AttentionWorkspace:
    """Chunk partials for `paged_attention`: o f32[N, A, chunks, D], ml f32[N, A, chunks, 2]."""

    part_o: object
    part_ml: object

    @classmethod
    def allocate(cls, max_rows: int, q_heads: int, head_dim: int, max_context: int):
        cp = C.cupy()
        chunks = max(1, -(-max_context // CHUNK))
        return cls(cp.empty((max_rows, q_heads, chunks, head_dim), dtype=np.float32),
                   cp.empty((max_rows, q_heads, chunks, 2), dtype=np.float32))

    @property
    def max_chunks(self) -> int:
        return int(self.part_o.shape[2])


def _pages(k_pages, v_pages):
    C.device_array(k_pages, "k_pages", ndim=4)
    C.device_array(v_pages, "v_pages", ndim=4, shape=k_pages.shape)
    kp, kind = C.kv_array(k_pages, "k_pages")
    vp, vkind = C.kv_array(v_pages, "v_pages")
    C.require(kind is vkind, "v_pages", "k_pages and v_pages must have the same dtype")
    C.contiguous(kp, "k_pages")
    C.contiguous(vp, "v_pages")
    return kp, vp, kind


def _rows_meta(block_tables, row_seq, row_pos, n: int):
    C.contiguous(C.device_array(row_seq, "row_seq", dtype=np.int32, shape=(n,)), "row_seq")
    C.contiguous(C.device_array(row_pos, "row_pos", dtype=np.int32, shape=(n,)), "row_pos")
    C.device_array(block_tables, "block_tables", dtype=np.int32, ndim=2)
    return C.row_stride(block_tables, "block_tables")


def _heads(x, name: str, n=None, heads=None, dim=None):
    C.device_array(x, name, dtype=np.float32, ndim=3, shape=(n, heads, dim))
    st = C.inner_contiguous(x, name, 1)
    return st[0], st[1]


def kv_write(k, v, k_pages, v_pages, block_tables, row_seq, row_pos) -> None:
    """Store row n's k/v f32[N,Hkv,D] at position row_pos[n] of block-table row row_seq[n]."""
    kp, vp, kind = _pages(k_pages, v_pages)
    num_pages, kv_heads, page_size, dim = kp.shape
    C.device_array(k, "k", ndim=3)
    n = k.shape[0]
    k_rs, k_hs = _heads(k, "k", n, kv_heads, dim)
    v_rs, v_hs = _heads(v, "v", n, kv_heads, dim)
    bt_rs = _rows_meta(block_tables, row_seq, row_pos, n)
    if n == 0:
        return
    params = C.pack(_KVW, k=C.ptr(k), v=C.ptr(v), k_pages=C.ptr(kp), v_pages=C.ptr(vp),
                    block_tables=C.ptr(block_tables), row_seq=C.ptr(row_seq),
                    row_pos=C.ptr(row_pos), k_rs=k_rs, k_hs=k_hs, v_rs=v_rs, v_hs=v_hs,
                    bt_rs=bt_rs, num_pages=num_pages, page_size=page_size, kv_heads=kv_heads,
                    head_dim=dim, num_seqs=block_tables.shape[0], bt_cols=block_tables.shape[1])
    launch(get_function(SOURCE, f"kv_write_kernel<{kind.ctype}>"), (n,), (256,), (params,),
           name="kv_write")


def head_layout(group: int) -> tuple[int, int, int]:
    """(GW heads per warp, HG head groups, KW key lanes) for `group` query heads per KV head."""
    for gw in (4, 3, 2, 1):
        if group % gw == 0 and group // gw <= 8:
            hg = group // gw
            return gw, hg, max(1, 4 // hg)
    raise ValueError(f"unsupported GQA group size {group} (query heads per KV head)")


def paged_attention(q, k_pages, v_pages, block_tables, row_seq, row_pos, scale: float, out, *,
                    workspace: AttentionWorkspace | None = None) -> None:
    """Causal paged attention: row n attends keys 0..row_pos[n] of sequence row_seq[n].

    q f32[N,A,D] (rows/heads strided), out f32[N,A,D]; pages [P,Hkv,page_size,D] f32 or bf16.
    Query head h uses KV head h // (A // Hkv). D must be 32, 64, 128 or 256.
    """
    kp, vp, kind = _pages(k_pages, v_pages)
    num_pages, kv_heads, page_size, dim = kp.shape
    C.device_array(q, "q", ndim=3)
    n, q_heads = q.shape[0], q.shape[1]
    q_rs, q_hs = _heads(q, "q", n, q_heads, dim)
    o_rs, o_hs = _heads(out, "out", n, q_heads, dim)
    bt_rs = _rows_meta(block_tables, row_seq, row_pos, n)
    C.require(dim % 32 == 0 and dim // 32 in _DPL, "q", f"head dim {dim} not in 32/64/128/256")
    C.require(q_heads % kv_heads == 0, "q", f"{q_heads} query heads not a multiple of {kv_heads}")
    if dim // 32 == 8:
        C.require(C.aligned(kp) and C.aligned(vp), "k_pages", "pages must be 16-byte aligned")
    if n == 0:
        return
    C.require(n <= 65535, "q", f"{n} rows > 65535 per call")
    gw, hg, kw = head_layout(q_heads // kv_heads)
    group = q_heads // kv_heads
    max_context = block_tables.shape[1] * page_size
    chunks = max(1, -(-max_context // CHUNK))
    split = n <= SPLIT_MAX_ROWS
    part_o = part_ml = 0
    max_chunks = 1
    if split:
        if workspace is None:
            workspace = AttentionWorkspace.allocate(n, q_heads, dim, max_context)
        C.require(workspace.part_o.shape[0] >= n and workspace.part_o.shape[1] == q_heads
                  and workspace.part_o.shape[3] == dim and workspace.max_chunks >= chunks,
                  "workspace",
                  f"too small for {n} rows x {q_heads} heads x {chunks} chunks x {dim}")
        part_o, part_ml = C.ptr(workspace.part_o), C.ptr(workspace.part_ml)
        max_chunks = workspace.max_chunks
    params = C.pack(_ATTN, q=C.ptr(q), out=C.ptr(out), k_pages=C.ptr(kp), v_pages=C.ptr(vp),
                    block_tables=C.ptr(block_tables), row_seq=C.ptr(row_seq),
                    row_pos=C.ptr(row_pos), part_o=part_o, part_ml=part_ml, q_rs=q_rs,
                    q_hs=q_hs, out_rs=o_rs, out_hs=o_hs, bt_rs=bt_rs, num_pages=num_pages,
                    page_size=page_size, kv_heads=kv_heads, q_heads=q_heads,
                    num_seqs=block_tables.shape[0], bt_cols=block_tables.shape[1],
                    max_chunks=max_chunks, head_groups=hg, scale=scale)
    smem = (2 * kw * group + kw * group * dim + (0 if split else 3 * group * dim)) * 4
    fn = get_function(SOURCE, f"paged_attention_kernel<{kind.ctype}, {gw}, {dim // 32}, "
                              f"{int(split)}>")
    if smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    launch(fn, (chunks if split else 1, kv_heads, n), (32 * hg * kw,), (params,),
           shared_mem=smem, name="paged_attention")
    if split and chunks > 1:
        launch(get_function(SOURCE, "paged_attention_combine_kernel"), (q_heads, n),
               (min(256, dim),), (params, np.int32(dim)), name="paged_attention_combine")
