"""Launchers for attention.cu: `kv_write` and `paged_attention` (docs/ops.md).

`paged_attention` cuts each row's context into chunks whose size depends only on the row's
own length (`chunk_keys`): 64 keys up to a context of 4096, then ceil(len / 64) rounded up to a
multiple of 64, so a row never has more than `MAX_CHUNKS` = 64 chunks. A block computes one
chunk of one KV head (all its query heads) with <= 4 warps that keep their next tile of keys in
flight (a cp.async double buffer per warp; deeper rings of 3 and 4 buffers measured slower on
the H200 in every decode case and were removed, docs/performance.md). With at
most `SPLIT_MAX_ROWS` rows (decode), every chunk runs in its own block (flash-decoding): the
chunk partials go to an `AttentionWorkspace` and are merged by a second kernel, attn_merge_kernel
(NINFER_ATTN_MERGE_KERNEL, default 2: a thread per output column and group of 8 chunks, then
one lane per column over the groups), or, with NINFER_ATTN_MERGE_KERNEL=0, inside the same
launch by the last block of each group of 8 chunks and then the last group (atomic counters);
the same arithmetic in the same order, so the same bits.
Pass a workspace sized for the largest decode batch and context (allocated per call when None,
which is not capturable). With more rows (prefill), each block loops over its row's chunks: no
workspace. Both modes give bitwise identical rows. Both kernels are launched with programmatic
dependent launch allowed (`_loader.launch(..., pdl=True)`).

bf16 pages with D in 64..256 and <= 8 query heads per KV head use the MMA variant (`use_mma`;
NINFER_ATTN_MMA=0 forces the FMA kernel for A/B timing): one warp computes 16 keys of all the
group's heads with mma.sync (keys as M, heads as the 8 N columns; q and p split into bf16
hi + lo terms), K and V of a tile in flight together; chunking, the warp / chunk merges and
both launch modes are shared with the FMA kernel, so the same invariances hold. The choice
depends only on (dtype, D, group), never on N.

NINFER_ATTN_TMA=1 (`use_tma`; default off): split-mode calls over bf16 pages with
page_size % 16 == 0, D in 64 / 128 / 256 and <= 8 query heads per KV head, on sm_90, run
paged_attention_tma_kernel instead: per block a producer warp streams the chunk's 16-key K / V
tiles by tensor copies (one per 16 keys of K or of V; _tensor_map.py) into a ring of
`TMA_STAGES` shared-memory stages and 4 consumer warps run the MMA variant's math on them;
same chunk plan, workspace, merges and gate. Its rows are batch invariant among split-mode
calls, but differ in the last bits from the other kernels, hence from the same row in a
loop-mode call (N > SPLIT_MAX_ROWS).
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from ninfer import envs
from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda._loader import KernelSource, current_device, get_function, launch
from ninfer.kernels_cuda._tensor_map import kv_maps_arg

MAX_CHUNKS = 64   # chunks per row at most (ATTN_MAX_CHUNKS in attention.cu)
# chunk sizes are multiples of this (ATTN_CHUNK_GRAIN, passed to attention.cu)
CHUNK_GRAIN = envs.attention_chunk_grain()
# rows longer than MAX_CHUNKS chunks of the grain take chunks of at least this many keys
# (NINFER_ATTN_CHUNK_GRAIN_LONG; ATTN_CHUNK_GRAIN_LONG; 0 or not a larger multiple: off)
CHUNK_GRAIN_LONG = envs.attention_chunk_grain_long()
GROUP = 8         # chunks per merge group (ATTN_GROUP)
SPLIT_MAX_ROWS = 64
_BUF_FLOATS = 2048  # per warp and pipeline buffer (ATTN_BUF_FLOATS)
_DPL = (1, 2, 4, 8)  # head_dim = 32 * DPL
_GW = (1, 2, 3, 4)
PIPELINE_BUFFERS = 2  # K/V buffers per warp (NST in attention.cu): one tile in flight
_MMA_DPL = (2, 4, 8)  # head dims of the MMA variant (bf16 pages; 64, 128, 256)
_MMA_GW = 8  # the MMA variant's GW: one head group of up to 8 heads (G = q_heads / kv_heads)
MMA = envs.attention_mma()
# NINFER_ATTN_PREWAIT (read once at import): honour past_kv_ready (see paged_attention)
PREWAIT = envs.attn_prewait()
# NINFER_ATTN_WIDE (read once at import): the FMA kernel's blocks of GW >= 2 heads per warp take
# 8 warps (twice the key warps, one block per SM) instead of 4 (`wide_blocks`); other bits than
# the 4-warp blocks (another key-warp split), the same for every call of a model. None (unset):
# for the groups in WIDE_AUTO_GROUPS, whose 4-warp blocks hold two head groups of only two key
# warps each. H200, same machine, 35B-A3B (G = 8) decode B=1 / B=8 ms: wide 2.997 / 7.705,
# 4 warps 3.059 / 7.682.
WIDE = envs.attention_wide()
WIDE_AUTO_GROUPS = (8,)
TMA = envs.attention_tma()  # NINFER_ATTN_TMA: paged_attention_tma_kernel for split-mode calls
TMA_STAGES = envs.attention_tma_stages()  # its ring stages (16-key K + V tiles) per block
TMA_BLOCKS = envs.attention_tma_blocks()  # blocks per SM its registers are capped for (0: auto)
TMA_MINB = (2, 3)  # the instances' register caps: 2 or 3 blocks per SM
# NINFER_ATTN_TMA_BLOCKS=0: calls of at least this many rows take the 3-blocks-per-SM instance.
# H200, 9B shape, graph us, 2 / 3 blocks per SM: B=1 ctx 8192 19.8 / 23.6, ctx 32768 45.1 /
# 56.6; B=8 ctx 8192 117.8 / 101.4, ctx 1024 28.8 / 28.3.
TMA_BLOCKS_AUTO_ROWS = 4
TMA_DIMS = (64, 128, 256)  # head dims of paged_attention_tma_kernel
TMA_CONSUMERS = 4  # consumer warps (+ 1 producer warp; ATTN_TMA_CONS in attention.cu)
TMA_TILE = 16  # keys per ring stage (ATTN_TMA_TILE)
TMA_MAX_STAGES = 16  # ATTN_TMA_MAX_STAGES
TMA_RING_ALIGN = 1024  # ATTN_TMA_ALIGN: the ring's alignment (the 128-byte swizzle's period)


def long_grain_on(grain: int, grain_long: int) -> bool:
    """Whether NINFER_ATTN_CHUNK_GRAIN_LONG changes the chunking: a larger multiple of the grain."""
    return grain_long > grain and grain_long % grain == 0


def chunk_options(grain: int, grain_long: int) -> tuple[str, ...]:
    """attention.cu's chunking defines (the long grain only where it changes the chunking, so
    the default build's options, hence its kernel cache entries, stay as they were)."""
    long = (f"-DATTN_CHUNK_GRAIN_LONG={grain_long}",) if long_grain_on(grain, grain_long) else ()
    return (f"-DATTN_CHUNK_GRAIN={grain}",) + long


def _attention_instances(splits: tuple[int, ...]) -> list[str]:
    """The paged_attention instances (FMA, MMA, TMA, WIDE) of the launch modes `splits`."""
    return ([f"paged_attention_kernel<{k.ctype}, {gw}, {dpl}, {split}, {PIPELINE_BUFFERS}, 0>"
             for k in C.WKind for gw in _GW for dpl in _DPL for split in splits]
            + [f"paged_attention_kernel<{C.WKind.BF16.ctype}, {_MMA_GW}, {dpl}, {split}, "
               f"{PIPELINE_BUFFERS}, 1>" for dpl in _MMA_DPL for split in splits]
            + [f"paged_attention_tma_kernel<{d}, {b}>" for d in TMA_DIMS for b in TMA_MINB
               if 1 in splits]
            + [f"paged_attention_kernel<{k.ctype}, {gw}, {dpl}, {split}, {PIPELINE_BUFFERS}, "
               "0, 1>" for k in C.WKind
               for gw in ((2, 3, 4) if WIDE else (4,) if WIDE is None else ())
               for dpl in _DPL for split in splits])


SOURCE = KernelSource("attention.cu", tuple(
    [f"kv_write_kernel<{k.ctype}>" for k in C.WKind] + _attention_instances((0, 1))),
    options=chunk_options(CHUNK_GRAIN, CHUNK_GRAIN_LONG))

# NINFER_ATTN_ACQ_REL (read once at import): the split mode counts its finished partials with
# one acquire-release atomic per block instead of fences in every thread (attention.cu
# attn_count_last; a second build of the module; the same bits)
ACQ_REL = envs.attention_acq_rel()


def acq_rel_source(source: KernelSource) -> KernelSource:
    """`source`'s NINFER_ATTN_ACQ_REL build (the same instances, -DATTN_ACQ_REL=1 added)."""
    return dataclasses.replace(source, options=source.options + ("-DATTN_ACQ_REL=1",))


SOURCE_ACQ_REL = acq_rel_source(SOURCE)

# NINFER_ATTN_MERGE_KERNEL (read once at import; 0 off, 1 or 2): split-mode launches store every
# chunk partial and attn_merge_kernel, launched next, merges them (the same bits); see
# merge_source
MERGE_KERNEL = envs.attention_merge_kernel()
MERGE_THREADS = 128  # attn_merge_kernel's block


def merge_kernel_name(dim: int) -> str:
    """The attn_merge_kernel instance for head dim `dim`."""
    return f"attn_merge_kernel<{dim}>"


@functools.lru_cache(maxsize=None)  # one object per build: the loader keys modules by identity
def merge_source(source: KernelSource, mode: int) -> KernelSource:
    """`source`'s NINFER_ATTN_MERGE_KERNEL build (mode 1: the attention blocks trigger their
    dependents by exiting; 2: at their PDL wait): the split-mode instances, whose blocks store
    their partials without counting, and attn_merge_kernel for every head dim."""
    return KernelSource(source.file, tuple(
        _attention_instances((1,)) + [merge_kernel_name(32 * dpl) for dpl in _DPL]),
        options=source.options + (f"-DATTN_MERGE_KERNEL={mode}",))


SOURCE_MERGE = merge_source(SOURCE, MERGE_KERNEL) if MERGE_KERNEL else None  # (precompile)


def split_source() -> KernelSource:
    """The build that split-mode launches take (NINFER_ATTN_MERGE_KERNEL, NINFER_ATTN_ACQ_REL)."""
    if MERGE_KERNEL:
        return merge_source(SOURCE, MERGE_KERNEL)
    return SOURCE_ACQ_REL if ACQ_REL else SOURCE


def merge_grid(q_heads: int, dim: int, rows: int) -> tuple[int, int]:
    """attn_merge_kernel's grid: a thread per (row, head, 4 dims, merge group)."""
    return -(-q_heads * dim // 4 * GROUP // MERGE_THREADS), rows

_KVW = C.struct(("k", "ptr"), ("v", "ptr"), ("k_pages", "ptr"), ("v_pages", "ptr"),
                ("block_tables", "ptr"), ("row_seq", "ptr"), ("row_pos", "ptr"), ("k_rs", "i64"),
                ("k_hs", "i64"), ("v_rs", "i64"), ("v_hs", "i64"), ("bt_rs", "i64"),
                ("num_pages", "i32"), ("page_size", "i32"), ("kv_heads", "i32"),
                ("head_dim", "i32"), ("num_seqs", "i32"), ("bt_cols", "i32"))
assert _KVW.itemsize == 120
_ATTN = C.struct(("q", "ptr"), ("out", "ptr"), ("k_pages", "ptr"), ("v_pages", "ptr"),
                 ("block_tables", "ptr"), ("row_seq", "ptr"), ("row_pos", "ptr"),
                 ("part_o", "ptr"), ("part_ml", "ptr"), ("grp_o", "ptr"), ("grp_ml", "ptr"),
                 ("counters", "ptr"), ("gate", "ptr"), ("q_rs", "i64"),
                 ("q_hs", "i64"), ("out_rs", "i64"), ("out_hs", "i64"), ("gate_rs", "i64"),
                 ("gate_hs", "i64"), ("bt_rs", "i64"),
                 ("num_pages", "i32"), ("page_size", "i32"), ("kv_heads", "i32"),
                 ("q_heads", "i32"), ("num_seqs", "i32"), ("bt_cols", "i32"),
                 ("max_chunks", "i32"), ("head_groups", "i32"), ("scale_log2", "f32"),
                 ("hg_recip", "i32"), ("page_shift", "i32"), ("stages", "i32"),
                 ("prewait", "i32"), ("out_bf16", "i32"))
assert _ATTN.itemsize == 216


def chunk_keys(length: int) -> int:
    """Keys per chunk of a row attending `length` keys (attn_row in attention.cu)."""
    per = -(-max(1, length) // MAX_CHUNKS)
    keys = max(CHUNK_GRAIN, -(-per // CHUNK_GRAIN) * CHUNK_GRAIN)
    if long_grain_on(CHUNK_GRAIN, CHUNK_GRAIN_LONG) and length > MAX_CHUNKS * CHUNK_GRAIN:
        keys = max(keys, CHUNK_GRAIN_LONG)
    return keys


def num_chunks(length: int) -> int:
    """Chunks of a row attending `length` keys (<= MAX_CHUNKS)."""
    return -(-max(1, length) // chunk_keys(length))


def launch_chunks(max_context: int) -> int:
    """Chunk blocks per (row, KV head) of a split launch: the most chunks any length
    <= max_context can have (the chunk count is not monotonic in the length)."""
    return max(1, min(MAX_CHUNKS, -(-max_context // CHUNK_GRAIN)))


@dataclasses.dataclass(frozen=True)
class AttentionWorkspace:
    """Scratch of the split (decode) mode of `paged_attention`, for up to R rows and A heads.

    part_o f32[R, A, C, D], part_ml f32[R, A, C, 2]: chunk partials (o, then max and sum);
    group_o f32[R, A, GROUP, D], group_ml f32[R, A, GROUP, 2]: merge-group partials;
    counters i32[R, A, 1 + GROUP]: finished blocks per (row, KV head) and group (the group
    partials and counters serve the in-kernel merge, NINFER_ATTN_MERGE_KERNEL=0). The counters
    must be 0 before a launch: they are allocated zeroed and every launch leaves them 0, so one
    workspace serves any number of sequential launches and graph replays (never two launches
    at once). C = launch_chunks(max_context) <= MAX_CHUNKS whatever the context, so the size is
    at most R * A * (64 + 8) * (D + 2) * 4 bytes (+ counters): 9B (A 16, D 256), R = 8: 9.5 MB;
    R = 64: 76 MB.
    """

    part_o: object
    part_ml: object
    group_o: object
    group_ml: object
    counters: object

    @classmethod
    def allocate(cls, max_rows: int, q_heads: int, head_dim: int, max_context: int):
        """For calls with <= max_rows rows, q_heads heads of head_dim, and block tables covering
        <= max_context keys (block_tables.shape[1] * page_size)."""
        cp = C.cupy()
        chunks = launch_chunks(max_context)
        return cls(cp.empty((max_rows, q_heads, chunks, head_dim), dtype=np.float32),
                   cp.empty((max_rows, q_heads, chunks, 2), dtype=np.float32),
                   cp.empty((max_rows, q_heads, GROUP, head_dim), dtype=np.float32),
                   cp.empty((max_rows, q_heads, GROUP, 2), dtype=np.float32),
                   cp.zeros((max_rows, q_heads, 1 + GROUP), dtype=np.int32))

    @property
    def max_chunks(self) -> int:
        return int(self.part_o.shape[2])


def kv_write(k, v, k_pages, v_pages, block_tables, row_seq, row_pos) -> None:
    """Store row n's k/v f32[N,Hkv,D] at position row_pos[n] of block-table row row_seq[n]."""
    kp, vp, kind = C.kv_pages(k_pages, v_pages)
    num_pages, kv_heads, page_size, dim = kp.shape
    C.device_array(k, "k", ndim=3)
    n = k.shape[0]
    k_rs, k_hs = C.per_head(k, "k", n, kv_heads, dim)
    v_rs, v_hs = C.per_head(v, "v", n, kv_heads, dim)
    bt_rs = C.row_targets(block_tables, row_seq, row_pos, n)
    if n == 0:
        return
    params = C.pack(_KVW, k=C.ptr(k), v=C.ptr(v), k_pages=C.ptr(kp), v_pages=C.ptr(vp),
                    block_tables=C.ptr(block_tables), row_seq=C.ptr(row_seq),
                    row_pos=C.ptr(row_pos), k_rs=k_rs, k_hs=k_hs, v_rs=v_rs, v_hs=v_hs,
                    bt_rs=bt_rs, num_pages=num_pages, page_size=page_size, kv_heads=kv_heads,
                    head_dim=dim, num_seqs=block_tables.shape[0], bt_cols=block_tables.shape[1])
    launch(get_function(SOURCE, f"kv_write_kernel<{kind.ctype}>"), (n,), (256,), (params,),
           name="kv_write", pdl=True)


def head_layout(group: int, wide: bool = False) -> tuple[int, int, int]:
    """(GW heads per warp, HG head groups, KW key warps) for `group` query heads per KV head.

    Blocks have HG * KW <= 4 warps (the GW >= 2 kernels are built for 128 threads, 3 blocks per
    SM; `wide`: 8 warps, the WIDE instances), except GW = 1 for groups 5 and 7 (one warp per
    head). Groups 1..8, and 9..16 when a multiple of 2, 3 or 4 up to 4 warps, are supported."""
    for gw in (4, 3, 2):
        if group % gw == 0 and group // gw <= 4:
            hg = group // gw
            return gw, hg, (8 if wide else 4) // hg
    if group <= 8:
        return 1, group, max(1, 4 // group)
    raise ValueError(f"unsupported GQA group size {group} (query heads per KV head)")


def wide_blocks(group: int) -> bool:
    """Whether the FMA kernel runs 8-warp blocks for `group` query heads per KV head
    (NINFER_ATTN_WIDE; unset: the groups in WIDE_AUTO_GROUPS)."""
    return group in WIDE_AUTO_GROUPS if WIDE is None else WIDE


def use_mma(kind: C.WKind, group: int, dim: int) -> bool:
    """Whether paged_attention runs the MMA variant for these pages / heads (module doc)."""
    return MMA and kind is C.WKind.BF16 and group <= 8 and dim // 32 in _MMA_DPL


def tma_eligible(kind: C.WKind, group: int, dim: int, page_size: int) -> bool:
    """Whether paged_attention_tma_kernel supports these pages / heads (any device, any
    NINFER_ATTN_TMA): bf16 pages, page_size a multiple of 16, D in TMA_DIMS, group 1..8."""
    return (kind is C.WKind.BF16 and page_size % TMA_TILE == 0 and dim in TMA_DIMS
            and 1 <= group <= 8)


def use_tma(kind: C.WKind, group: int, dim: int, page_size: int) -> bool:
    """Whether a split-mode paged_attention call runs paged_attention_tma_kernel: TMA
    (NINFER_ATTN_TMA), `tma_eligible` and an sm_90+ device (bulk copies)."""
    return (TMA and tma_eligible(kind, group, dim, page_size)
            and current_device().compute_capability >= (9, 0))


def decode_path(kind: C.WKind, group: int, dim: int, page_size: int) -> str:
    """"tma", "mma" or "fma": the kernel a split-mode (decode) call runs (bench labels)."""
    if use_tma(kind, group, dim, page_size):
        return "tma"
    return "mma" if use_mma(kind, group, dim) else "fma"


def tma_blocks(rows: int) -> int:
    """The register cap (blocks per SM) of the paged_attention_tma_kernel instance a call of
    `rows` rows runs: TMA_BLOCKS, or by the row count when it is 0 (the same bits either way)."""
    if TMA_BLOCKS:
        return TMA_BLOCKS
    return 3 if rows >= TMA_BLOCKS_AUTO_ROWS else 2


def tma_kernel_name(dim: int, rows: int) -> str:
    """The paged_attention_tma_kernel instance for head dim `dim` and a call of `rows` rows."""
    return f"paged_attention_tma_kernel<{dim}, {tma_blocks(rows)}>"


def tma_stage_bytes(dim: int) -> int:
    """One ring stage of paged_attention_tma_kernel: 16 keys' K and V rows (bf16)."""
    return 2 * TMA_TILE * 2 * dim


def tma_smem_bytes(group: int, dim: int, stages: int) -> int:
    """Dynamic shared memory of paged_attention_tma_kernel<dim> (layout comment in
    attention.cu): barriers (256 B), up to 1 KiB of padding to the ring's 1024-byte alignment,
    `stages` stages (`tma_stage_bytes`), the q fragments, the warp states and the merge
    scratch."""
    floats = 3 * TMA_CONSUMERS * group + group + 3 * group * GROUP + group
    return (256 + TMA_RING_ALIGN + stages * tma_stage_bytes(dim) + dim // 16 * 32 * 16
            + 4 * floats)


def _smem_bytes(group: int, kw: int, nwarps: int, dim: int, split: bool,
                mma: bool = False) -> int:
    """Dynamic shared memory of paged_attention_kernel (layout comment in attention.cu)."""
    floats = nwarps * (PIPELINE_BUFFERS * _BUF_FLOATS + 64) + 3 * kw * group + group
    if mma:
        floats += dim // 16 * 32 * 4  # the q fragments
    floats += 3 * group * GROUP + group if split else 2 * group * dim + 8 * group
    return 4 * floats


def kernel_plan(kind: C.WKind, group: int, dim: int, split: bool) -> tuple[str, int, int, int]:
    """(instance name, dynamic shared bytes, HG, KW) of the paged_attention launch for pages of
    `kind`, `group` query heads per KV head and head dim `dim`, split or loop mode."""
    mma = use_mma(kind, group, dim)
    wide = not mma and wide_blocks(group)
    gw, hg, kw = (_MMA_GW, 1, 4) if mma else head_layout(group, wide)
    suffix = ", 0, 1" if wide and gw >= 2 else f", {int(mma)}"
    name = (f"paged_attention_kernel<{kind.ctype}, {gw}, {dim // 32}, {int(split)}, "
            f"{PIPELINE_BUFFERS}{suffix}>")
    return name, _smem_bytes(group, kw, hg * kw, dim, split, mma), hg, kw


def paged_attention(q, k_pages, v_pages, block_tables, row_seq, row_pos, scale: float, out, *,
                    workspace: AttentionWorkspace | None = None, gate=None,
                    past_kv_ready: bool = False) -> None:
    """Causal paged attention: row n attends keys 0..row_pos[n] of sequence row_seq[n].

    q f32[N,A,D] (rows/heads strided), out f32[N,A,D] (rows/heads strided) or its bf16 bits
    (uint16: each final value rounded to nearest even; the x of a bf16-x GEMV); pages
    [P,Hkv,page_size,D] f32 or bf16, 16-byte aligned. Query head h uses KV head h // (A // Hkv).
    D must be 32, 64, 128 or 256; A // Hkv in 1..8 (`head_layout`). An invalid row_seq /
    row_pos or page id makes that row's output NaN (other rows are unaffected).

    Rows are batch invariant: a row's output depends only on q[n], its position and its
    sequence's KV (bitwise), whatever N and the other rows, in both launch modes (with
    NINFER_ATTN_TMA, where `use_tma`: among split-mode calls, N <= SPLIT_MAX_ROWS). With
    N <= SPLIT_MAX_ROWS each chunk is its own block and the chunk partials go through a
    workspace (>= N rows, A heads, D, >= launch_chunks(block_tables.shape[1] * page_size)
    chunks; InvalidInput when smaller); the launch then allocates nothing and never
    synchronises (capturable). workspace=None allocates one per call. With more rows a block
    loops over its row's chunks and no workspace is used.

    gate: optional f32[N,A,D] (rows/heads strided, last axis contiguous; e.g. the gate half
    q_and_gate[:, :, D:] of Qwen3.5's interleaved [q_h | gate_h] projection): out is then
    attention * sigmoid(gate), with elementwise.cu SigmoidMul's expression in every write of a
    final output element, so bitwise `paged_attention` followed by `sigmoid_mul`. Every kernel
    variant (FMA, MMA, TMA) and both launch modes support it.

    past_kv_ready: the caller guarantees that every row's keys before its own position, its
    row_seq / row_pos and the block tables were written before the kernel launched just before
    this one started (decode: one row per sequence, only the row's own key written in this
    step, the index arrays copied from the host). The FMA kernel then reads them, and copies
    the first tiles of K / V, before its PDL wait (the same results; a wrong promise reads
    stale keys).
    """
    kp, vp, kind = C.kv_pages(k_pages, v_pages)
    num_pages, kv_heads, page_size, dim = kp.shape
    C.device_array(q, "q", ndim=3)
    n, q_heads = q.shape[0], q.shape[1]
    q_rs, q_hs = C.per_head(q, "q", n, q_heads, dim)
    out_bf16 = C.is_bf16_bits(out)
    o_rs, o_hs = C.per_head(out, "out", n, q_heads, dim,
                            dtype=np.uint16 if out_bf16 else np.float32)
    g_ptr = g_rs = g_hs = 0
    if gate is not None:
        g_rs, g_hs = C.per_head(gate, "gate", n, q_heads, dim)
        g_ptr = C.ptr(gate)
    bt_rs = C.row_targets(block_tables, row_seq, row_pos, n)
    C.require(dim % 32 == 0 and dim // 32 in _DPL, "q", f"head dim {dim} not in 32/64/128/256")
    C.require(q_heads % kv_heads == 0, "q", f"{q_heads} query heads not a multiple of {kv_heads}")
    C.require(C.aligned(kp) and C.aligned(vp), "k_pages", "pages must be 16-byte aligned")
    C.require(num_pages * kv_heads * page_size < 2 ** 31, "k_pages",
              "more than 2^31 - 1 key rows (num_pages * Hkv * page_size)")
    if n == 0:
        return
    C.require(n <= 65535, "q", f"{n} rows > 65535 per call")
    group = q_heads // kv_heads
    chunks = launch_chunks(block_tables.shape[1] * page_size)
    split = n <= SPLIT_MAX_ROWS
    tma = split and use_tma(kind, group, dim, page_size)
    if tma:
        C.require(2 <= TMA_STAGES <= TMA_MAX_STAGES and TMA_STAGES % TMA_CONSUMERS == 0,
                  "stages", f"{TMA_STAGES} not a multiple of {TMA_CONSUMERS} in 4..16")
        name, smem = tma_kernel_name(dim, n), tma_smem_bytes(group, dim, TMA_STAGES)
        hg, kw = 1, TMA_CONSUMERS
    else:
        name, smem, hg, kw = kernel_plan(kind, group, dim, split)
    part_o = part_ml = grp_o = grp_ml = counters = 0
    max_chunks = 1
    if split:
        if workspace is None:
            workspace = AttentionWorkspace.allocate(n, q_heads, dim,
                                                    block_tables.shape[1] * page_size)
        ws = workspace
        rows_heads = ws.part_o.shape[:2]
        C.require(rows_heads[0] >= n and rows_heads[1] == q_heads
                  and ws.part_o.shape[3] == dim and ws.max_chunks >= chunks
                  and ws.part_ml.shape == ws.part_o.shape[:3] + (2,)
                  and ws.group_o.shape == rows_heads + (GROUP, dim)
                  and ws.group_ml.shape == rows_heads + (GROUP, 2)
                  and ws.counters.shape == rows_heads + (1 + GROUP,),
                  "workspace",
                  f"too small for {n} rows x {q_heads} heads x {chunks} chunks x {dim} "
                  f"(has {tuple(ws.part_o.shape)})")
        part_o, part_ml, counters = C.ptr(ws.part_o), C.ptr(ws.part_ml), C.ptr(ws.counters)
        grp_o, grp_ml = C.ptr(ws.group_o), C.ptr(ws.group_ml)
        max_chunks = ws.max_chunks
    params = C.pack(_ATTN, q=C.ptr(q), out=C.ptr(out), k_pages=C.ptr(kp), v_pages=C.ptr(vp),
                    block_tables=C.ptr(block_tables), row_seq=C.ptr(row_seq),
                    row_pos=C.ptr(row_pos), part_o=part_o, part_ml=part_ml, grp_o=grp_o,
                    grp_ml=grp_ml, counters=counters, gate=g_ptr,
                    q_rs=q_rs, q_hs=q_hs, out_rs=o_rs, out_hs=o_hs, gate_rs=g_rs,
                    gate_hs=g_hs, bt_rs=bt_rs,
                    num_pages=num_pages, page_size=page_size, kv_heads=kv_heads,
                    q_heads=q_heads, num_seqs=block_tables.shape[0],
                    bt_cols=block_tables.shape[1], max_chunks=max_chunks, head_groups=hg,
                    scale_log2=scale * math.log2(math.e), hg_recip=-(-65536 // hg),
                    page_shift=page_size.bit_length() - 1 if page_size & (page_size - 1) == 0
                    else -1, stages=TMA_STAGES if tma else 0,
                    prewait=int(past_kv_ready and PREWAIT), out_bf16=int(out_bf16))
    source = split_source() if split else SOURCE_ACQ_REL if ACQ_REL else SOURCE
    fn = get_function(source, name)
    if smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
        # ~70 KiB per 4-warp block: prefer the largest
        # shared-memory carveout so that 3 (2) blocks fit on an SM (K/V go through cp.async,
        # L1 matters little); only a hint
        try:
            fn.preferred_shared_memory_carveout = 100
        except (AttributeError, TypeError):
            pass
    threads = 32 * (TMA_CONSUMERS + 1) if tma else 32 * hg * kw
    args = (params, kv_maps_arg(kp, vp)) if tma else (params,)
    launch(fn, (chunks if split else 1, kv_heads, n), (threads,), args,
           shared_mem=smem, name="paged_attention", pdl=True)
    if split and MERGE_KERNEL and chunks > 1:
        launch(get_function(source, merge_kernel_name(dim)),
               merge_grid(q_heads, dim, n), (MERGE_THREADS,), (params,),
               name="attn_merge", pdl=True)
