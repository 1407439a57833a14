"""Every NINFER_* environment variable is read here and nowhere else."""
from __future__ import annotations

import os
from pathlib import Path


def _int_or_none(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw)
    except ValueError as exc:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from exc


def _flag(name: str, default: bool) -> bool:
    """A boolean switch: unset or empty gives `default`, "0" off, anything else on."""
    raw = os.environ.get(name, "")
    return default if raw == "" else raw != "0"


def cache_dir() -> Path:
    """Directory for built artifacts (the demo model) and compiled kernels.

    NINFER_CACHE_DIR overrides the default ~/.cache/ninfer.
    """
    raw = os.environ.get("NINFER_CACHE_DIR")
    if raw:
        return Path(raw).expanduser()
    return Path.home() / ".cache" / "ninfer"


def vram_budget_mib() -> int | None:
    """NINFER_VRAM_BUDGET_MIB: cap on the engine's device memory budget, in MiB."""
    return _int_or_none("NINFER_VRAM_BUDGET_MIB")


def host_snapshot_budget_mib() -> int | None:
    """NINFER_HOST_SNAPSHOT_MIB: host memory that paused Snapshots may hold, in MiB."""
    return _int_or_none("NINFER_HOST_SNAPSHOT_MIB")


def cuda_debug_sync() -> bool:
    """NINFER_CUDA_SYNC=1: synchronize and check errors after every CUDA launch."""
    return _flag("NINFER_CUDA_SYNC", False)


def gemv_rows() -> bool:
    """NINFER_GEMV_ROWS (default on; "0" turns it off): bf16 decode GEMVs use
    linear_mma_rows_kernel (row-contiguous weight reads staged through shared memory) instead of
    linear_mma_kernel; the results are bitwise the same. Read once, at import of the launcher."""
    return _flag("NINFER_GEMV_ROWS", True)


def gemv_persist() -> bool:
    """NINFER_GEMV_PERSIST (default on; "0" turns it off): the 16-warp linear_mma_rows_kernel
    launches run as many blocks as fit on the SMs, which walk the row tiles, instead of one
    block per tile (bitwise the same results). Read once, at import of the launcher."""
    return _flag("NINFER_GEMV_PERSIST", True)


def moe_fused() -> bool:
    """NINFER_MOE_FUSED (default on; "0" turns it off): moe_block at decode runs the routed
    experts in two launches (routing + grouping + gate_up, then down + combine) instead of four;
    bitwise the same results. Read once, at import of the launcher."""
    return _flag("NINFER_MOE_FUSED", True)


def moe_tma() -> bool:
    """NINFER_MOE_TMA (default on; "0" turns it off): the MoE decode path's expert gate_up +
    SwiGLU stage (bf16 experts, hidden % 16 == 0, sm_90) runs moe_tma_gate_up_kernel (weights
    streamed by bulk copies into a shared-memory ring) instead of the register-staged rows
    kernels; act is bitwise the same. H200 35B-A3B decode B=1 / B=8 ms, same machine, with
    NINFER_MOE_ROUTE_FIRST: 3.066 / 7.720 on, 3.122 / 7.748 route-first off, 3.115 / 7.863 both
    off. Read once, at import of the launcher."""
    return _flag("NINFER_MOE_TMA", True)


def moe_tma_pairs() -> bool:
    """NINFER_MOE_TMA_PAIRS (default on; "0" turns it off): moe_tma_gate_up_kernel's consumer
    warps take two work items at a time (independent mma chains that overlap; each item's
    arithmetic unchanged, so the same bits). Read once, at import of the launcher."""
    return _flag("NINFER_MOE_TMA_PAIRS", True)


def moe_tma_sk() -> int:
    """NINFER_MOE_TMA_SK (default 1024; 512, 1024 or 2048): the k per ring stage that
    moe_tma_gate_up_kernel's plan aims at (bytes / 2 of each weight row's bulk copy; the same
    bits for every plan). Read once, at import of the launcher."""
    return _choice("NINFER_MOE_TMA_SK", 1024, MOE_TMA_STAGE_K)


def moe_tma_x_regs() -> bool:
    """NINFER_MOE_TMA_XREGS (default on; "0" turns it off): where every pair reads one x row
    (B = 1) and each consumer warp's K range is short enough, moe_tma_gate_up_kernel's
    consumers hold their x values in registers, split once, instead of loading them per work
    item (the same bits either way). Read once, at import of the launcher."""
    return _flag("NINFER_MOE_TMA_XREGS", True)


def moe_tma_xpipe() -> bool:
    """NINFER_MOE_TMA_XPIPE (default on; "0" turns it off): where moe_tma_gate_up_kernel's
    consumers do not hold x in registers (B > 1), each batch's x loads are issued before the
    previous batch's mmas (two batches in flight; the same bits). Measured: 35B-A3B B=8 7.30-7.31
    ms against 7.38-7.39, B=1 unchanged. Read once, at import of the launcher."""
    return _flag("NINFER_MOE_TMA_XPIPE", True)


def moe_route_swiglu() -> bool:
    """NINFER_MOE_ROUTE_SWIGLU (default on; "0" turns it off): at decode a Qwen3.5 MoE layer's
    routing runs on an extra block of its shared expert's gate_up + SwiGLU GEMV (one launch,
    kernels_cuda.moe.route_with_swiglu) instead of a launch of its own before it; bitwise the
    same. H200 35B-A3B decode B=1 / B=8 ms, same machine: 2.80 / 7.63 on, 2.90 / 7.71 off.
    Read when a backend is built."""
    return _flag("NINFER_MOE_ROUTE_SWIGLU", True)


def moe_down_prewait() -> bool:
    """NINFER_MOE_DOWN_PREWAIT (default on; "0" turns it off): the fused MoE down kernel
    prefetches its blocks' down-weight rows into the L2 before its PDL wait, where the group
    tables were written before the gate_up stage (a hint: the same bits either way). Read once,
    at import of the launcher."""
    return _flag("NINFER_MOE_DOWN_PREWAIT", True)


def moe_fold_shared() -> bool:
    """NINFER_MOE_FOLD_SHARED (default on; "0" turns it off): at decode a Qwen3.5 MoE layer's
    shared expert down projection runs inside the fused MoE down launch (an extra team of warps,
    kernels_cuda.moe.shared_down_folds) instead of as a GEMV launch of its own; bitwise the same.
    Read when a backend is built."""
    return _flag("NINFER_MOE_FOLD_SHARED", True)


def moe_shared_early() -> bool:
    """NINFER_MOE_SHARED_EARLY (default on; "0" turns it off): the shared down projection folded
    into the fused MoE down launch (NINFER_MOE_FOLD_SHARED) is computed before that kernel's PDL
    wait where the bulk-copy gate_up stage runs before it (the same bits either way). Read once,
    at import of the launcher."""
    return _flag("NINFER_MOE_SHARED_EARLY", True)


def moe_tma_down() -> bool:
    """NINFER_MOE_TMA_DOWN (default off; "1" turns it on): after the bulk-copy gate_up stage, the
    MoE decode's fused down stage runs moe_tma_down_kernel (weights bulk-copied and tables read
    before its PDL wait, act after it); bitwise moe_fused_down_kernel. Opt-in: measured slower
    at 35B-A3B B=1. Read once, at import of the launcher."""
    return _flag("NINFER_MOE_TMA_DOWN", False)


def moe_persist() -> bool:
    """NINFER_MOE_PERSIST (default off; "1" turns it on): the MoE decode's fused path with the
    bulk-copy gate_up runs both expert stages, the folded shared down and the combine as one
    persistent launch (the down weights stream behind the gate_up stage; a grid barrier on the
    activations); bitwise the two launches. Off: measured 2-4% slower at 35B-A3B B=1 on the
    H200 (docs/performance.md). Read once, at import of the launcher."""
    return _flag("NINFER_MOE_PERSIST", False)


def attn_prewait() -> bool:
    """NINFER_ATTN_PREWAIT (default on; "0" turns it off): the decode paged_attention (FMA
    kernel, callers passing past_kv_ready) reads its row, page ids and first K / V tiles before
    its PDL wait (the same bits either way). Read once, at import of the launcher."""
    return _flag("NINFER_ATTN_PREWAIT", True)


def moe_route_first() -> bool:
    """NINFER_MOE_ROUTE_FIRST (default on; "0" turns it off): a Qwen3.5 MoE layer runs the
    routing (moe_route with the MoE workspace: weights, ids and the expert group tables) right
    after the router linear, before the shared expert, and moe_block(routed=True) then runs only
    the expert stages; bitwise the same results. H200 35B-A3B decode B=1 / B=8 ms, same machine:
    3.066 / 7.720 on, 3.122 / 7.748 off. Read when a backend is built."""
    return _flag("NINFER_MOE_ROUTE_FIRST", True)


def gemv_tma() -> bool:
    """NINFER_GEMV_TMA (default on; "0" turns it off): bf16 decode GEMVs with K % 16 == 0 on an
    sm_90 device use linear_tma_kernel (weights streamed by bulk copies into a shared-memory ring)
    instead of linear_mma_rows_kernel. Batch invariant, but not bitwise equal to the other
    tensor-core kernels (another k pairing). Read once, at import of the launcher."""
    return _flag("NINFER_GEMV_TMA", True)


def _choice(name: str, default: int | None, allowed: tuple[int, ...]) -> int | None:
    """An integer switch restricted to `allowed` (unset or empty: `default`)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) not in allowed:
        raise ValueError(f"{name}={raw!r}: expected one of {allowed}")
    return int(raw)


TMA_STAGE_K = (1024, 2048)
MOE_TMA_STAGE_K = (512, 1024, 2048)
TMA_CONSUMERS = (8, 16)
TMA_RING_KIB = (64, 96, 128, 160, 192)
TMA_X_STAGES = (0, 4, 5)
TMA_TILE_GROUPS = (1, 2, 4)


def gemv_bf16_x() -> bool:
    """NINFER_GEMV_BF16_X (default on; "0" turns it off): the decode GEMVs that run
    linear_tma_kernel read x as bf16 bits, written so by the op before them (the norms, the GDN
    decode, the paged attention, the fused SwiGLU): half the bytes of x, one mma per k16 step.
    Rounds the decode activations that feed GEMVs to bf16, as the prefill GEMMs round theirs;
    "0" keeps them f32 (split into bf16 hi + lo terms). Read once, at import of the launcher."""
    return _flag("NINFER_GEMV_BF16_X", True)


def moe_bf16_x() -> bool:
    """NINFER_MOE_BF16_X (default on; "0" turns it off): an MoE layer's input (the router, the
    shared expert and the routed experts read it) is written as bf16 bits where those readers
    take them (ops.moe_reads_bf16_x: CUDA, bf16 weights, the bf16-x GEMV): as the dense GEMVs'
    inputs since NINFER_GEMV_BF16_X, and as the prefill GEMMs and transformers in bf16 round
    theirs. The bulk-copy expert gate_up then runs one mma per k16 step and, at B > 1, reads
    half the x bytes. "0" keeps it f32 (split into bf16 hi + lo terms). Read at each call."""
    return _flag("NINFER_MOE_BF16_X", True)


def moe_bf16_act() -> bool:
    """NINFER_MOE_BF16_ACT (default on; "0" turns it off): where an MoE layer's input is bf16
    bits (NINFER_MOE_BF16_X), the experts' activations silu(g) * u are rounded to bf16 too (as
    the dense decode's fused SwiGLU writes them, as the MoE prefill path and transformers in
    bf16 keep them): the gate_up stage stores them as bf16 bits and the down stage runs one
    mma per k16 step on half the bytes. Read at each call."""
    return _flag("NINFER_MOE_BF16_ACT", True)


def norm_fold() -> bool:
    """NINFER_NORM_FOLD (default on; "0" turns it off): in decode, a dense layer's RMSNorms ride
    on the GEMVs around them instead of a norm launch each (ops.linear_residual_norm, RowNorm):
    the block's output projection adds into the residual stream and writes bf16(r * (1 + w))
    with its blocks' sums of r^2, and the next block's input projections divide their rows by
    the rms. Other numerics (x is rounded to bf16 before the division, not after). Read when
    the CUDA backend builds its decode workspaces. H200, same machine, B = 1 / 8 ms, off / on:
    9B 4.491 / 4.430, 5.101 / 4.966; 27B 14.268 / 14.000, 15.931 / 15.713; 0.8B 0.834 / 0.769,
    1.014 / 0.986."""
    return _flag("NINFER_NORM_FOLD", True)


def gemv_x_vec() -> bool:
    """NINFER_GEMV_X_VEC (default on; "0" turns it off; read once at import): linear_tma_kernel
    calls of more than one row load the bf16 x they keep in registers 16 bytes per lane and
    hand the fragments out by two 4 x 4 transposes per quad of lanes (instances with
    TMA_IO_X_VEC), instead of 4-byte loads that read every 32-byte sector of x twice (the same
    bits). For the N = 8 GEMVs, whose blocks each read all of x (64 KB at K = 4096) after their
    PDL wait. H200, same call, B = 8 ms off / on: 0.8B 0.981, 0.980 / 0.932, 0.928; 9B 4.902 /
    4.780; 27B 15.445 / 15.157. One row keeps the 4-byte loads' instances: the build where every
    instance carried the 16-byte path made 0.8B B = 1 1.5% slower, even where one row took the
    4-byte loads."""
    return _flag("NINFER_GEMV_X_VEC", True)


def gemv_x_vec_stages() -> bool:
    """NINFER_GEMV_X_VEC_STAGES (default on; "0" turns it off; read once at import): with
    NINFER_GEMV_X_VEC, the GEMVs of more than one row that read a bf16 x per stage (K above 5
    stages of 1024, e.g. the down projections) load it 16 bytes per lane too (the same bits).
    H200, same call, B = 8 ms off / on: 0.8B 0.932 / 0.925; 9B 4.774 / 4.741; 27B 15.220 /
    14.998 (B = 1 unchanged); the 9B mlp down GEMV at N = 8, 0.89 -> 0.92 of the copy rate."""
    return _flag("NINFER_GEMV_X_VEC_STAGES", True)


def norm_fold_prefetch() -> bool:
    """NINFER_NORM_FOLD_PREFETCH (default on; "0" turns it off; read once at import): the norm
    fold's producers (linear_residual_norm) load their residual and gain elements right after
    their PDL wait instead of in the epilogue (a dependent load less at the end of each block's
    output projection; the same bits). H200, same call, B = 1 / 8 ms off / on: 9B 4.383 /
    4.939 against 4.363-4.374 / 4.894-4.916, 27B 13.855 / 15.541 against 13.737 / 15.437, 0.8B
    0.771-0.776 / 0.991-0.997 against 0.765-0.770 / 0.981-0.988."""
    return _flag("NINFER_NORM_FOLD_PREFETCH", True)


def moe_norm_fold() -> bool:
    """NINFER_MOE_NORM_FOLD (default off; "1" turns it on): with NINFER_NORM_FOLD, an MoE
    block's last launch (the fused down kernel or the combine) carries the next layer's input
    norm as the dense layers' output projections do (ops.moe_block norm_fold): one norm launch
    less per MoE layer in decode. Read when the CUDA backend builds its decode workspaces.
    Measured slower, so off: H200 35B-A3B B = 1 / 8, off / on, 2.714 / 2.770, 6.947 / 6.944 ms
    (a fused down block leaves no room for the next GEMV's blocks, and the fold lengthens its
    epilogue by a dependent residual load)."""
    return _flag("NINFER_MOE_NORM_FOLD", False)


def moe_router_norm() -> bool:
    """NINFER_MOE_ROUTER_NORM (default on; "0" turns it off): with NINFER_NORM_FOLD, an MoE
    layer's post-attention norm rides on the mixer's output projection (ops.linear_residual_norm)
    and the router GEMV (`linear(..., row_norm=, normed_out=)`: its logits divided by the rms,
    and x / rms written for the shared expert and the experts): one norm launch less per MoE
    layer in decode; x is rounded twice (r * (1 + w), then x / rms). Read when the CUDA backend
    builds its decode workspaces. H200 35B-A3B, same calls, B = 1 / 8 ms, off / on: 2.729 /
    6.956, 2.712 / 6.955, 2.734 / 6.975, 2.701 / 6.938 against 2.720 / 6.969, 2.700 / 6.943,
    2.702 / 6.942, 2.696 / 6.927 (the timeline: 40 norm links of ~3.1 us gone, the GEMVs
    around them ~1 us longer each)."""
    return _flag("NINFER_MOE_ROUTER_NORM", True)


def gemv_pdl() -> bool:
    """NINFER_GEMV_PDL (default on; "0" turns it off): linear_tma_kernel is launched with
    programmatic dependent launch, so its weight stream starts while the previous kernel finishes.
    Read once, at import of the launcher."""
    return _flag("NINFER_GEMV_PDL", True)


def attention_mma() -> bool:
    """NINFER_ATTN_MMA (default off; "1" turns it on): decode paged_attention over bf16 KV pages
    with head_dim 64..256 and <= 8 query heads per KV head runs its q.K and P.V on the tensor
    cores (mma.sync, q and p split into bf16 hi + lo terms) instead of f32 FMAs. Both paths are
    batch invariant; they differ from each other in the last bits. Off by default: on the H200
    it was no faster (9B graph us, MMA vs FMA: B=1 ctx 1024 14.4 vs 12.9, B=8 ctx 1024 30.6 vs
    30.6, B=8 ctx 8192 105.9 vs 109.0, B=1 ctx 32768 64.4 vs 60.3). Read once, at import of
    the launcher."""
    return _flag("NINFER_ATTN_MMA", False)


def attention_tma() -> bool:
    """NINFER_ATTN_TMA (default off; "1" turns it on): decode (split mode) paged_attention over
    bf16 KV pages with page_size % 16 == 0, head_dim 64 / 128 / 256 and <= 8 query heads per KV
    head, on an sm_90 device, runs paged_attention_tma_kernel (a producer warp streams 16-key K / V
    tiles by tensor copies into a shared-memory ring; tensor-core math as NINFER_ATTN_MMA). Batch
    invariant among split-mode calls, but not bitwise equal to the other kernels, so a row of a
    call with more than SPLIT_MAX_ROWS rows (loop mode) differs from it in the last bits. Read
    once, at import of the launcher."""
    return _flag("NINFER_ATTN_TMA", False)


NORM_MAX_NV = (4, 8, 16)


def norm_max_nv() -> int:
    """NINFER_NORM_MAX_NV (4, 8 or 16; default 8): at most this many elements per thread in a
    norm_kernel block of one row with D <= 4096 (more threads per block, up to 1024, below it):
    D = 4096 runs 256 threads x 16 at 16, 512 x 8 at 8, 1024 x 4 at 4; D = 5120 runs 640 x 8
    at 4 and 8, 1024 x 8 at 16 (16: the shapes before this switch). The reduction order is a
    function of D and this switch only (rows stay batch invariant). Read once, at import of the
    launcher."""
    return _choice("NINFER_NORM_MAX_NV", 8, NORM_MAX_NV)


ATTN_TMA_STAGES = (4, 8, 12)


def attention_tma_stages() -> int:
    """NINFER_ATTN_TMA_STAGES (4, 8 or 12; default 4): ring stages (16-key K + V tiles) of
    paged_attention_tma_kernel per block (16.25 KiB each for head_dim 256: 4 stages fit 2
    blocks per SM, 8 and 12 one). A multiple of the kernel's 4 consumer warps, so that each
    slot has one consumer (attention.cu). Read once, at import of the launcher."""
    return _choice("NINFER_ATTN_TMA_STAGES", 4, ATTN_TMA_STAGES)


def attention_acq_rel() -> bool:
    """NINFER_ATTN_ACQ_REL (default on; "0" turns it off): decode (split mode) paged_attention
    counts each block's finished chunk partial with one acquire-release atomic by one thread
    after a block barrier, instead of a sequentially consistent fence in every thread before
    and after a relaxed atomic (attention.cu attn_count_last; a second build of the module).
    The same bits either way. H200, 9B shape, graph us per launch with past_kv_ready, fenced /
    acq_rel: B=1 ctx 1024 11.2 / 10.4, B=8 ctx 1024 26.0 / 25.2, B=8 ctx 8192 100.5 / 98.3;
    the decode steps moved within their noise. Read once, at import of the launcher."""
    return _flag("NINFER_ATTN_ACQ_REL", True)


ATTN_MERGE_KERNEL = (0, 1, 2, 3)


def attention_merge_kernel() -> int:
    """NINFER_ATTN_MERGE_KERNEL (2, the default; 1; 3; 0 = off): decode (split mode)
    paged_attention stores every chunk partial and a second kernel (attn_merge_kernel, a thread
    per output column and merge group) merges the rows of several chunks; 0: the last block of
    each group and then of the row merges them (atomic counts; no second kernel). The same
    bits. 2: the attention blocks let the merge kernel launch at their PDL wait; 1: as they
    exit; 3: once their keys are done (before they fold and store their partials). H200, B=1 / B=8 ms, off / 2 (3 and 2 interleaved runs): 35B-A3B 2.721-2.727 /
    2.648-2.669, 6.858-6.930 / 6.804-6.842; 27B 13.911-13.952 / 13.784-13.822; 9B 4.394-4.416
    / 4.371-4.373; 0.8B 0.767-0.770 / 0.748-0.754, 0.924-0.926 / 0.909-0.913; 9B at context
    32768 unchanged. Read once, at import of the launcher."""
    return _choice("NINFER_ATTN_MERGE_KERNEL", 2, ATTN_MERGE_KERNEL)


ATTN_TMA_BLOCKS = (0, 2, 3)
ATTN_CHUNK_GRAINS = (64, 128, 256)
ATTN_CHUNK_GRAINS_LONG = (0, 128, 256, 512)


def attention_tma_blocks() -> int:
    """NINFER_ATTN_TMA_BLOCKS (0, 2 or 3; default 0): blocks per SM paged_attention_tma_kernel's
    registers are capped for (3: 128 registers with a small spill, so a third block fits; 0:
    3 for calls of at least attention.py TMA_BLOCKS_AUTO_ROWS rows, else 2; both instances run
    the same code, so a row's bits do not depend on the choice). Read once, at import of the
    launcher."""
    return _choice("NINFER_ATTN_TMA_BLOCKS", 0, ATTN_TMA_BLOCKS)


def attention_wide() -> bool | None:
    """NINFER_ATTN_WIDE (unset: auto, attention.py WIDE_AUTO_GROUPS; "1": on for every GQA group
    of 2, 3, 4, 6, 8, ... query heads per KV head; "0": off): paged_attention's FMA kernel runs
    blocks of 8 warps (twice the key warps per head group, one block per SM) instead of 4.
    Another split of a chunk's keys over warps, so other last bits, but a function of the
    model's head counts only: the same for every call (batch invariant). H200, same machine,
    35B-A3B (G = 8) decode B=1 / B=8 ms: on 2.997 / 7.705, off 3.059 / 7.682. Read once, at
    import of the launcher."""
    choice = _choice("NINFER_ATTN_WIDE", None, (0, 1))
    return None if choice is None else choice == 1


def attention_chunk_grain() -> int:
    """NINFER_ATTN_CHUNK_GRAIN (64, 128 or 256; default 64): paged decode attention's chunk
    sizes are multiples of this and at least this (ATTN_CHUNK_GRAIN in attention.cu). Larger
    grains give short rows fewer chunks and so fewer merge levels (a row of <= 8 chunks merges
    once). A row's chunking depends on its length and this grain only, never on the batch.
    H200, 9B shape, graph us of one call at grain 64 / 128 / 256: B=1 ctx 1024 13.1 / 14.9 /
    19.6, B=8 ctx 1024 30.7 / 24.5 / 20.2; 9B decode B=1 / B=8 ms 4.531 / 5.550, 4.562 / 5.523,
    4.570 / 5.483: larger grains trade B=1 latency for B=8 throughput. Read once, at import of
    the launcher."""
    return _choice("NINFER_ATTN_CHUNK_GRAIN", 64, ATTN_CHUNK_GRAINS)


def attention_chunk_grain_long() -> int:
    """NINFER_ATTN_CHUNK_GRAIN_LONG (0, 128, 256 or 512; default 0 = off): rows longer than 64
    chunks of NINFER_ATTN_CHUNK_GRAIN keys take chunks of at least this many keys (at grain 64
    and 256: rows of 4097-12288 keys get 256-key chunks instead of 128 or 192 keys, so fewer
    chunks and blocks; other rows are unchanged). Ignored unless it is a larger multiple of
    the grain. A row's chunking still depends only on its length. H200, 9B shape, the default
    (FMA) kernel, graph us per call off / 256: B=8 ctx 8192 99.2 / 92.4, but B=1 ctx 8192
    21.2 / 27.3 (half the blocks), ctx 1024 unchanged: a B=8 throughput setting, off by
    default. Read once, at import of the launcher."""
    return _choice("NINFER_ATTN_CHUNK_GRAIN_LONG", 0, ATTN_CHUNK_GRAINS_LONG)


def attn_gate_fused() -> bool:
    """NINFER_ATTN_GATE_FUSED (default on; "0" turns it off): CUDA decode steps apply the gated
    attention's output gate inside paged_attention (bitwise paged_attention then sigmoid_mul,
    one launch less per full-attention layer). Read when a backend is built."""
    return _flag("NINFER_ATTN_GATE_FUSED", True)


def gdn_state_l2_last() -> bool:
    """NINFER_GDN_STATE_L2_LAST (default on; "0" turns it off): the CUDA GDN decode kernel loads
    and stores the recurrent state with an L2 evict-last policy (the same bits; 0.3-1% faster
    decode steps on the H200, twentieth session). Read once, at import of the launcher."""
    return _flag("NINFER_GDN_STATE_L2_LAST", True)


def kernel_timeline() -> bool:
    """NINFER_KERNEL_TIMELINE (default off; "1" turns it on): a diagnostic build of every CUDA
    module in which each block's pdl_wait records the global timer before and after the wait
    (common.cuh, bench/timeline.py); launches are logged by name and geometry. Slower; for
    measurement only. Read once, at import of the loader."""
    return _flag("NINFER_KERNEL_TIMELINE", False)


def pdl() -> bool:
    """NINFER_PDL (default on; "0" turns it off): the decode step's small kernels (norms, GDN
    decode, attention, elementwise, MoE routing) are launched with programmatic dependent launch
    on sm_90, so each starts while its predecessor drains and lets its successor start early.
    The GEMV has its own switch (NINFER_GEMV_PDL). Read once, at import of the loader."""
    return _flag("NINFER_PDL", True)


def pdl_trigger_first() -> bool:
    """NINFER_PDL_TRIGGER_FIRST (default off; "1" turns it on): `pdl_enter` (the prologue of the
    small PDL kernels) lets the next kernel launch before it waits for the previous one, instead
    of after. The next kernel's pre-wait part (a GEMV's weight stream) then starts as soon as an
    SM has room, not after the previous kernel completes. Compiled in (-D): read once, at import
    of the loader."""
    return _flag("NINFER_PDL_TRIGGER_FIRST", False)


def gemv_tma_tile_group() -> int:
    """NINFER_GEMV_TMA_TILE_GROUP (1, 2 or 4; default 4): row tiles linear_tma_kernel walks in
    lockstep over the stages when it reads x per stage, reading each stage's x once per group
    (bitwise the same results). Read once, at import of the launcher."""
    return _choice("NINFER_GEMV_TMA_TILE_GROUP", 4, TMA_TILE_GROUPS)


def gemv_tma_sk() -> int:
    """NINFER_GEMV_TMA_SK (default 1024; 1024 or 2048): k per ring stage of linear_tma_kernel,
    i.e. bytes / 2 of each row's bulk copy. Read once, at import of the launcher."""
    return _choice("NINFER_GEMV_TMA_SK", 1024, TMA_STAGE_K)


def gemv_tma_consumers() -> int:
    """NINFER_GEMV_TMA_CONSUMERS (default 16; 8 or 16): consumer warps of linear_tma_kernel.
    Read once, at import of the launcher."""
    return _choice("NINFER_GEMV_TMA_CONSUMERS", 16, TMA_CONSUMERS)


def gemv_tma_x_stages() -> int:
    """NINFER_GEMV_TMA_X_STAGES (default 4; 0, 4 or 5): linear_tma_kernel keeps the activation
    fragments of an f32 x in registers when K needs at most this many 1024-k stages (0: never,
    for a bf16 x too; a bf16 x otherwise takes up to 5, see linear.tma_x_stages). 5 covers
    27B's K = 5120, but the f32 instances spill at the 96-register cap of 17 warps; with 4 they
    read x per stage in tile groups instead (H200, same machine, 27B B=1 / B=8 14.834 / 17.221
    ms against 15.047 / 17.273 with 5). Read once, at import of the launcher."""
    return _choice("NINFER_GEMV_TMA_X_STAGES", 4, TMA_X_STAGES)


def gemv_tma_ring_kib() -> int:
    """NINFER_GEMV_TMA_RING_KIB (default 192; 64, 96, 128, 160 or 192): shared memory for the
    weight ring of linear_tma_kernel, in KiB (the rest of the SM's 256 KiB is L1, which holds
    the activations). Read once, at import of the launcher."""
    return _choice("NINFER_GEMV_TMA_RING_KIB", 192, TMA_RING_KIB)


def prefill_overlap() -> bool:
    """NINFER_PREFILL_OVERLAP (default on; "0" turns it off): a step's prompt chunk, when it
    replays a prefill graph, runs on a second CUDA stream beside the decode graph. Read when a
    CUDA backend is built."""
    return _flag("NINFER_PREFILL_OVERLAP", True)


GDN_CHUNK_BF16_COLS = (0, 32, 64)


def gdn_chunk_bf16_cols() -> int:
    """NINFER_GDN_CHUNK_BF16_COLS (0, 32 or 64; default 32): the chunked GDN prefill in bf16
    precision runs its bf16-tile kernels (bf16 workspaces and shared-memory tiles,
    double-buffered state pass) with that many state columns per block; 0 keeps the fp32-tile
    kernels (the same results bit for bit). H200, T = 8192, Hv = 32: 32 columns
    1.195 ms, 64 columns 1.365, fp32 tiles 1.365. Read once, at import of the launcher."""
    return _choice("NINFER_GDN_CHUNK_BF16_COLS", 32, GDN_CHUNK_BF16_COLS)


GDN_CHUNK_PRECISIONS = ("tf32x3", "bf16")


def gdn_chunk_local_pair() -> bool:
    """NINFER_GDN_CHUNK_LOCAL_PAIR (default on; "0" off): the bf16-tile chunked GDN prefill's
    local kernel is gdn_chunk_localpair_kernel (one block per chunk and value-head pair of a key
    head: Q K^T, K K^T once per pair, (I + A)^-1 by 16 x 16 blocks applied with 3xTF32 mma)
    instead of gdn_chunk_local16_kernel (per-column forward substitution; results equal to the
    fp32-tile bf16 kernels bit for bit). Read once, at import of the launcher."""
    return _flag("NINFER_GDN_CHUNK_LOCAL_PAIR", True)


def gdn_chunk_precision() -> str | None:
    """NINFER_GDN_CHUNK_PRECISION ("tf32x3" or "bf16"; unset or empty: None): how the chunked
    GDN prefill forms its matrix products, overriding the model's choice (bf16 for bf16 weights,
    tf32x3 for fp32 ones) and the launcher's default (tf32x3). Read once, at import of the
    launcher."""
    raw = os.environ.get("NINFER_GDN_CHUNK_PRECISION", "").strip().lower()
    if raw == "":
        return None
    if raw not in GDN_CHUNK_PRECISIONS:
        raise ValueError(f"NINFER_GDN_CHUNK_PRECISION must be one of {GDN_CHUNK_PRECISIONS}, "
                         f"got {raw!r}")
    return raw


def kernel_cache_dir() -> Path:
    """NINFER_KERNEL_CACHE: where compiled CUDA modules are cached (default:
    <cache_dir>/kernels)."""
    raw = os.environ.get("NINFER_KERNEL_CACHE")
    return Path(raw).expanduser() if raw else cache_dir() / "kernels"
