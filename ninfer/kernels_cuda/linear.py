"""Launchers for linear.cu: `linear(x, weight, out)` = x @ w^T (docs/ops.md).

Two paths:
- GEMV / skinny GEMM (our kernels: the tensor-core `linear_mma_kernel` for bf16 weights with
  16-byte aligned rows, the f32-FMA `linear_gemv_kernel` otherwise) for N <= GEMV_MAX_ROWS and
  whenever `batch_invariant=True`: one fixed split of K per output element (chosen from K
  alone), so a row's result never depends on the other rows. The bf16 tensor-core GEMV is
  `linear_tma_kernel` on sm_90 when K % 16 == 0 (weights streamed by bulk copies into a shared
  ring; NINFER_GEMV_TMA=0 turns it off), else `linear_mma_rows_kernel` (row-contiguous weight
  reads staged through shared memory); NINFER_GEMV_ROWS=0 (read at import) selects
  `linear_mma_kernel` (fragment-direct reads), bitwise equal to the rows kernel. The TMA kernel
  pairs k differently: batch invariant too, but not bitwise equal to the other two.
- cuBLAS (`_cublas`, capturable in a CUDA graph) for N > GEMV_MAX_ROWS: bf16 weights multiply a
  bf16 copy of x (written into `workspace`, uint16[>= N*K], or a pool allocation when None,
  which a graph capture does not allow) with fp32 accumulation and fp32 output; f32 weights use
  fp32 gemmEx (no TF32). Its results depend on cuBLAS's algorithm choice for the shape and on
  x's rounding to bf16. x may also arrive as that bf16 copy already (uint16 [N, K] C-contiguous,
  written by the kernel that produced x): then nothing is converted, and the GEMM reads the same
  operand bits at the same leading dimension K, so `out` is bitwise what the f32 x gives.
- bf16 x on the GEMV (NINFER_GEMV_BF16_X, default on; `gemv_takes_bf16`): `linear_tma_kernel`
  reads x as bf16 bits (IO flags) with one mma per k16 step, bitwise the result of the f32 x
  holding the same values; `linear_swiglu` may also write its output as bf16 bits. The decode
  forward feeds every GEMV this way (half the x bytes every block reads).
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ninfer import envs
from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda import _cublas
from ninfer.kernels_cuda._loader import (KernelSource, current_device, get_function, launch,
                                         launch_dependent)

GEMV_MAX_ROWS = 8
TMA_MAX_X_STAGES = 5  # linear_tma_kernel instances with x in registers: K <= 5 * 1024
TMA_X_STAGES = envs.gemv_tma_x_stages()  # NINFER_GEMV_TMA_X_STAGES: the largest XS used
TMA_ROUTE_CONSUMERS = 16  # linear_tma_swiglu_route_kernel's instances (the default consumers)
MAX_SPLITS = 8
# linear_tma_kernel's IO flags (linear.cu): x as bf16 bits; out as bf16 bits; the norm fold's
# producer (residual add, bf16(r * gain), sums of r^2) and consumer (rows divided by their rms)
TMA_IO_X_BF16, TMA_IO_OUT_BF16, TMA_IO_RESID_NORM, TMA_IO_ROW_NORM = 1, 2, 4, 8
TMA_IO_NORM_X = 16  # with TMA_IO_ROW_NORM: also x / rms as bf16 bits (an MoE layer's router)
TMA_IO_X_VEC = 32  # a bf16 x in registers loaded 16 bytes per lane (NINFER_GEMV_X_VEC, N > 1)
# the (SWIGLU, IO) pairs with bf16 operands that have instances (default geometry only): bf16 x
# into an f32 out, and the fused SwiGLU's bf16 x into a bf16 activation
TMA_BF16_IO = ((0, TMA_IO_X_BF16), (1, TMA_IO_X_BF16), (1, TMA_IO_X_BF16 | TMA_IO_OUT_BF16))
# NINFER_GEMV_BF16_X (read once at import): decode GEMVs on linear_tma_kernel take x as bf16 bits
GEMV_BF16_X = envs.gemv_bf16_x()
ROWS_PER_BLOCK = {1: 2, 2: 2, 4: 4, 8: 8}  # NT -> R (weight rows per block)
# NINFER_GEMV_X_VEC (read once at import; default on): calls of N > 1 rows whose bf16 x sits in
# registers (tma_x_stages) take the TMA_IO_X_VEC instances (16-byte x loads; the same bits); one
# row keeps the 4-byte loads' instances
GEMV_X_VEC = envs.gemv_x_vec()
# NINFER_GEMV_X_VEC_STAGES (read once at import; default on): with GEMV_X_VEC, calls whose x is
# read per stage (K > 5 stages, or tile groups) take the TMA_IO_X_VEC instances too
GEMV_X_VEC_STAGES = envs.gemv_x_vec_stages()

SOURCE = KernelSource("linear.cu", tuple(
    [f"linear_gemv_kernel<{k.ctype}, {nt}, {r}, {al}>"
     for k in C.WKind for nt, r in ROWS_PER_BLOCK.items() for al in (0, 1)]
    + ["linear_mma_kernel<0>", "linear_mma_kernel<1>", "f32_to_bf16_kernel"]
    + [f"linear_mma_rows_kernel<{sw}, {mode}>" for mode in (0, 1) for sw in (0, 1)]
    + [f"linear_tma_kernel<{sw}, {sk}, {cons}, 0, 1, 0>" for sk in envs.TMA_STAGE_K
       for cons in envs.TMA_CONSUMERS for sw in (0, 1)]
    + [f"linear_tma_kernel<{sw}, 1024, 16, 0, {tg}, {io | xv}>" for tg in envs.TMA_TILE_GROUPS
       for sw, io in ((0, 0), (1, 0), *TMA_BF16_IO) if tg > 1 or io
       for xv in ((0, TMA_IO_X_VEC) if io else (0,))]
    + [f"linear_tma_kernel<{sw}, 1024, 16, {xs}, 1, {io}>" for xs in range(1, TMA_MAX_X_STAGES + 1)
       for sw, io in ((0, 0), (1, 0), *TMA_BF16_IO)]
    + [f"linear_tma_kernel<{sw}, 1024, 16, {xs}, 1, {io | TMA_IO_X_VEC}>"
       for xs in range(1, TMA_MAX_X_STAGES + 1) for sw, io in TMA_BF16_IO]
    + [f"linear_tma_swiglu_route_kernel<1024, {TMA_ROUTE_CONSUMERS}, {xs}, {j}, {io}>"
       for xs in range(TMA_MAX_X_STAGES + 1) for j in (8, 16) for io in (0, TMA_IO_X_BF16)]))
# The norm fold (NINFER_NORM_FOLD; linear.cu TMA_IO_RESID_NORM / TMA_IO_ROW_NORM): its own
# module build, so that its instances compile beside SOURCE's (bench.precompile: a process per
# KernelSource) instead of after them. (SWIGLU, IO) pairs: the producer (a linear), the consumer
# linear and the consumer SwiGLU with its bf16 activation.
TMA_FOLD_IO = ((0, TMA_IO_X_BF16 | TMA_IO_RESID_NORM), (0, TMA_IO_X_BF16 | TMA_IO_ROW_NORM),
               (1, TMA_IO_X_BF16 | TMA_IO_OUT_BF16 | TMA_IO_ROW_NORM),
               (0, TMA_IO_X_BF16 | TMA_IO_ROW_NORM | TMA_IO_NORM_X))
NORM_FOLD_MAX_PARTS = 256  # linear.cu: the producer's row blocks, the consumer's parts per row
SOURCE_FOLD = KernelSource("linear.cu", tuple(
    [f"linear_tma_kernel<{sw}, 1024, 16, {xs}, 1, {io | xv}>"
     for xs in range(1, TMA_MAX_X_STAGES + 1) for sw, io in TMA_FOLD_IO for xv in (0, TMA_IO_X_VEC)]
    + [f"linear_tma_kernel<{sw}, 1024, 16, 0, {tg}, {io | xv}>" for tg in envs.TMA_TILE_GROUPS
       for sw, io in TMA_FOLD_IO for xv in (0, TMA_IO_X_VEC)]))
# NINFER_NORM_FOLD_PREFETCH (read once at import; default on, 0.2-1% faster decode): the norm
# fold's producers load their residual and gain elements right after the PDL wait (linear.cu
# NORM_FOLD_PREFETCH; the same bits), a build of the producer instances of their own
NORM_FOLD_PREFETCH = envs.norm_fold_prefetch()


@functools.cache
def fold_prefetch_source() -> KernelSource:
    """The NORM_FOLD_PREFETCH build of SOURCE_FOLD's producer instances (4 tiles ahead); one
    object per process (KernelSource hashes by identity: a new one would be a module of its own,
    loaded again at every launch)."""
    return dataclasses.replace(
        SOURCE_FOLD, options=("-DNORM_FOLD_PREFETCH=4",),
        name_expressions=tuple(n for n in SOURCE_FOLD.name_expressions
                               if _instance_io(n) & TMA_IO_RESID_NORM))


def _instance_io(name: str) -> int:
    """The IO flags of a `linear_tma_kernel<..., IO>` instance name."""
    return int(name.rsplit(",", 1)[1].rstrip(">"))


# (None where the flag is off: bench.precompile then does not compile it)
SOURCE_FOLD_PREFETCH = fold_prefetch_source() if NORM_FOLD_PREFETCH else None
_GEMV_FIELDS = (("w", "ptr"), ("x", "ptr"), ("out", "ptr"), ("w_rs", "i64"), ("x_rs", "i64"),
                ("out_rs", "i64"), ("m", "i32"), ("k", "i32"), ("n", "i32"), ("splits", "i32"))
GEMV_PARAMS = C.struct(*_GEMV_FIELDS)
assert GEMV_PARAMS.itemsize == 64
# linear_tma_kernel's TmaParams: GemvParams, then NormFoldParams
TMA_PARAMS = C.struct(*_GEMV_FIELDS, ("res", "ptr"), ("gain", "ptr"), ("parts", "ptr"),
                      ("res_rs", "i64"), ("parts_rs", "i64"), ("parts_n", "i32"),
                      ("dim", "i32"), ("eps", "f32"), ("pad", "i32"))
assert TMA_PARAMS.itemsize == 120
ROUTE_PARAMS = C.struct(*_GEMV_FIELDS, ("logits", "ptr"), ("w_out", "ptr"), ("ids_out", "ptr"),
                        ("group_expert", "ptr"), ("group_pairs", "ptr"), ("num_groups", "ptr"),
                        ("logits_rs", "i64"), ("w_out_rs", "i64"), ("experts", "i32"),
                        ("top_k", "i32"), ("chunk", "i32"), ("pad", "i32"))
assert ROUTE_PARAMS.itemsize == 144
# linear_tma_swiglu_route_kernel (moe.route_with_swiglu, NINFER_MOE_ROUTE_SWIGLU): the MoE
# routing on an extra block of the shared expert's gate_up launch. H200 35B-A3B decode, same
# machine, 3 rounds, B = 1 / 8 ms: 2.799-2.820 / 7.613-7.640 with it, 2.896-2.899 / 7.705-7.713
# with the routing launch of its own. The routing block must run the routing kernel's geometry:
# with moe_route_row<16> and the grouping over all 17 warps it was neutral (2.894-2.902).
ROUTE_MAX_ROWS = 8  # one column tile
ROUTE_MAX_EXPERTS = 512  # moe_route_row<8> up to 256 experts, <16> up to 512
ROUTE_MAX_PAIRS = 32 * (TMA_ROUTE_CONSUMERS + 1)  # moe_group_block over the routing block

def k_splits(k: int) -> int:
    """Warps (K ranges) per output element: a function of K only (batch invariance)."""
    units = (k + 7) // 8
    return max(1, min(MAX_SPLITS, units // 128))


MMA_MAX_SPLITS = 16  # linear_mma_kernel's warps per block (K ranges)


def mma_splits(k: int, limit: int = MMA_MAX_SPLITS) -> int:
    """Warps (K ranges of >= 8 whole 32-element steps) per output of the tensor-core kernel: a
    function of K only. 16 for K = 4096 puts 2 x 16 warps on every SM for 4096-row matrices."""
    steps = (k + 31) // 32
    return max(1, min(limit, steps // 8))


def rows_tile(n: int) -> int:
    """Activation rows per block (NT) for a call with n rows."""
    for nt in (1, 2, 4, 8):
        if n <= nt:
            return nt
    return 8


def _gemv_aligned(w, kind: C.WKind, w_rs: int, x, x_rs: int, k: int) -> bool:
    w_vec = 8 if kind is C.WKind.BF16 else 4
    return (k % 8 == 0 and C.aligned(w) and w_rs % w_vec == 0 and C.aligned(x)
            and x_rs % 4 == 0)


def launch_gemv(x, x_rs: int, w, kind: C.WKind, w_rs: int, out, out_rs: int, m: int, k: int,
                n: int) -> None:
    """The GEMV kernel on already-checked operands (also used by other launchers)."""
    aligned = int(_gemv_aligned(w, kind, w_rs, x, x_rs, k))
    if _mma_ok(w, kind, w_rs, x, x_rs):
        _launch_mma(x, x_rs, w, w_rs, out, out_rs, m, k, n, swiglu=False)
        return
    nt = rows_tile(n)
    r = ROWS_PER_BLOCK[nt]
    splits = k_splits(k)
    params = C.pack(GEMV_PARAMS, w=C.ptr(w), x=C.ptr(x), out=C.ptr(out), w_rs=w_rs, x_rs=x_rs,
                    out_rs=out_rs, m=m, k=k, n=n, splits=splits)
    fn = get_function(SOURCE, f"linear_gemv_kernel<{kind.ctype}, {nt}, {r}, {aligned}>")
    launch(fn, ((m + r - 1) // r, (n + nt - 1) // nt), (32 * splits,), (params,),
           name="linear_gemv")


def _mma_ok(w, kind: C.WKind, w_rs: int, x, x_rs: int) -> bool:
    return (kind is C.WKind.BF16 and C.aligned(w) and w_rs % 8 == 0 and C.aligned(x)
            and x_rs % 4 == 0)


# NINFER_GEMV_ROWS (read once at import; default on): the tensor-core GEMV reads each weight tile
# row-contiguously and stages it through shared memory (linear_mma_rows_kernel), bitwise equal to
# linear_mma_kernel. Measured on the H200 (9B decode graph, B = 1 / 8): 6.41 / 7.23 ms against
# 6.45 / 7.56 ms with linear_mma_kernel.
GEMV_ROWS = envs.gemv_rows()
# NINFER_GEMV_PERSIST (read once at import; default on): linear_mma_rows_kernel runs as many
# blocks as fit on the SMs at once (32 warps per SM), which walk the row tiles, loading the next
# tile's first batch during the current tile's last one (no block ramp-up per tile); bitwise the
# same results. H200, 9B decode graph (B = 1 / 8): 5.87 / 6.78 ms against 5.99 / 6.87 ms with
# one block per tile (NINFER_GEMV_PERSIST=0). Only GEMVs with 16-warp blocks (K >= 4096) run
# persistent: the 8-split K = 2048 GEMVs of 35B-A3B were slower that way (B = 1 / 8: 4.75 /
# 9.10 ms against 4.64 / 8.83 ms). An L2 bulk prefetch of each warp's part of the next tile was
# slower (6.94 / 7.92 ms) and is gone.
GEMV_PERSIST = envs.gemv_persist()
PERSIST_WARPS_PER_SM = 32  # 64 registers per thread: 32 resident warps fill the register file
MMA_ROWS_WARP_SMEM = 16 * 16 * 16  # linear_mma_rows_kernel: staging bytes per warp (MMA_ROWS_UNITS)
MMA_PARTIALS_SMEM = 16 * 16 * 8 * 4  # one MmaPartials<16>
MMA_ROWS_ALIGN = 256  # and slack to align the buffers (MMA_ROWS_ALIGN in mma_gemv.cuh)


def mma_rows_smem(splits: int) -> int:
    """Dynamic shared memory of linear_mma_rows_kernel with `splits` warps (80.25 KiB at 16):
    the staging buffers, two partials buffers and the alignment slack."""
    return splits * MMA_ROWS_WARP_SMEM + 2 * MMA_PARTIALS_SMEM + MMA_ROWS_ALIGN


def _persist_blocks(splits: int) -> int:
    """Row-tile blocks of a persistent launch (per column tile): all that are resident at once,
    PERSIST_WARPS_PER_SM // splits per SM (2 at 16 splits, whose 2 x 80.25 KiB of shared memory
    fit an SM too)."""
    return max(1, PERSIST_WARPS_PER_SM // splits) * current_device().sm_count


# NINFER_GEMV_TMA (read once at import; default on): GEMVs with K % 16 == 0 on sm_90 run
# linear_tma_kernel: the weights are streamed by bulk copies (one per weight row of a stage of
# 16 rows x TMA_SK k) into a shared-memory ring, one persistent block per SM, so the bytes in
# flight are not capped by registers; batch invariant, not bitwise equal to the kernels above.
# H200, 9B decode graph (B = 1 / 8 ms; rows kernel 5.83 / 6.71): 8 consumer warps and a 195 KiB
# ring with TMA_SK = 256 (512-byte copies) 10.86 / 11.23, 512: 6.31 / 7.31, 1024: 5.33 / 7.51,
# 2048: 5.35 / 8.09; 16 consumers, 1024: 5.13 / 7.06; and with x's fragments in registers for
# K <= 4096 (at N = 8 the per-tile x reads cost as much L2 traffic as the weights): 5.07 / 6.16.
GEMV_TMA = envs.gemv_tma()
TMA_SK = envs.gemv_tma_sk()  # k per ring stage
TMA_CONSUMERS = envs.gemv_tma_consumers()  # consumer warps (+ 1 producer warp)
TMA_RING_KIB = envs.gemv_tma_ring_kib()
TMA_MAX_STAGES = 16  # linear.cu
# NINFER_GEMV_PDL (read once at import; default on): linear_tma_kernel launches with
# programmatic dependent launch allowed (launch_dependent): each GEMV's producer streams weights
# while the previous kernel finishes. H200 decode graph, same machine, B = 1 / 8 ms: 9B 4.99 /
# 6.02 against 5.09 / 6.12 without; 27B 15.67 / 18.95 against 15.94 / 19.23.
GEMV_PDL = envs.gemv_pdl()
# NINFER_GEMV_TMA_TILE_GROUP (read once at import): linear_tma_kernel instances that read x per
# stage (XS = 0: K > 5 stages, or x_regs off) walk their row tiles in groups of this many in
# lockstep over the stages, reading each stage's x once per group (bitwise the same results;
# 1024-k stages and 16 consumers only, else 1). H200 decode graph, B = 1 / 8 ms: 27B 14.84 /
# 17.57 with groups of 4, 15.04 / 18.32 with 2, 14.93 / 18.67 with 1; 9B 4.69 / 5.88, 4.68 /
# 5.86, 4.66 / 6.01.
TMA_TILE_GROUP = envs.gemv_tma_tile_group()


def tma_plan(sk: int, consumers: int, ring_kib: int) -> tuple[int, int]:
    """(ring stages, dynamic shared memory bytes) of linear_tma_kernel<*, sk, consumers>: the
    barriers (256 bytes), two partials buffers, as many 16-row stages as fit `ring_kib` KiB
    (2..TMA_MAX_STAGES)."""
    stage = 16 * (2 * sk + 16)
    stages = max(2, min(TMA_MAX_STAGES, ring_kib * 1024 // stage))
    return stages, 256 + 2 * consumers * 16 * 8 * 4 + stages * stage


def tma_x_stages(k: int, sk: int, consumers: int, *, bf16_x: bool = False) -> int:
    """XS of the linear_tma_kernel instance for K: the stages per tile when the x fragments fit
    in registers (instances for sk = 1024 with 16 consumers, K <= 5120), else 0. Up to
    TMA_X_STAGES stages for an f32 x; a bf16 x holds half the fragment registers, so it takes
    every instance (5 stages: 72 registers, no spills) unless TMA_X_STAGES is 0. H200, 27B
    decode with bf16 x, B=1 / B=8 ms, 5 vs 4 stages, two rounds on one machine: 14.354 / 16.107
    vs 14.504 / 16.346, 14.344 / 16.100 vs 14.477 / 16.308."""
    stages = -(-k // sk)
    limit = (TMA_MAX_X_STAGES if TMA_X_STAGES else 0) if bf16_x else TMA_X_STAGES
    return stages if sk == 1024 and consumers == 16 and stages <= limit else 0


def tma_ok(k: int) -> bool:
    """Whether linear_tma_kernel takes a call whose operands passed `_mma_ok` (bf16 weights,
    16-byte aligned rows of w and x): K a multiple of 16 and an sm_90+ device."""
    return k % 16 == 0 and current_device().compute_capability >= (9, 0)


def _launch_tma(x, x_rs, w, w_rs, out, out_rs, m, k, n, *, swiglu: bool,
                row_blocks: int | None = None, sk: int | None = None,
                consumers: int | None = None, ring_kib: int | None = None,
                x_regs: bool = True, pdl: bool | None = None,
                tile_group: int | None = None, io: int = 0, fold: dict | None = None,
                x_vec: bool | None = None) -> None:
    """linear_tma_kernel with stages of `sk` k, `consumers` warps and a `ring_kib` KiB ring
    (None: TMA_SK, TMA_CONSUMERS, TMA_RING_KIB): `row_blocks` persistent blocks along the row
    tiles (None: one per SM, at most one per tile) per column tile of 8 activation rows.
    `x_regs`: the x fragments in registers where an instance exists (tma_x_stages; bitwise the
    same results). `pdl`: launch with programmatic dependent launch (None: GEMV_PDL).
    `tile_group`: row tiles walked in lockstep when x is read per stage (None: TMA_TILE_GROUP;
    bitwise the same results). `io`: linear_tma_kernel's IO flags (TMA_IO_X_BF16: x holds bf16
    bits; TMA_IO_OUT_BF16: out does); nonzero needs the default geometry. `fold`: the
    NormFoldParams fields (TMA_PARAMS) of a norm-fold `io` (TMA_FOLD_IO; SOURCE_FOLD). `x_vec`:
    a bf16 x in registers loaded 16 bytes per lane (TMA_IO_X_VEC; None: GEMV_X_VEC where
    N > 1; bitwise the same results)."""
    tiles, col_tiles = -(-m // (8 if swiglu else 16)), (n + 7) // 8
    row_blocks = tma_row_blocks(m, n, swiglu=swiglu) if row_blocks is None else max(
        1, min(tiles, row_blocks))
    sk = TMA_SK if sk is None else sk
    consumers = TMA_CONSUMERS if consumers is None else consumers
    stages, smem = tma_plan(sk, consumers, TMA_RING_KIB if ring_kib is None else ring_kib)
    params = C.pack(TMA_PARAMS, w=C.ptr(w), x=C.ptr(x), out=C.ptr(out), w_rs=w_rs, x_rs=x_rs,
                    out_rs=out_rs, m=m, k=k, n=n, splits=stages, **(fold or {}))
    xs = tma_x_stages(k, sk, consumers, bf16_x=bool(io & TMA_IO_X_BF16)) if x_regs else 0
    tg = TMA_TILE_GROUP if tile_group is None else tile_group
    if xs or sk != 1024 or consumers != 16:
        tg = 1
    source = SOURCE_FOLD if (int(swiglu), io) in TMA_FOLD_IO else SOURCE
    if NORM_FOLD_PREFETCH and io & TMA_IO_RESID_NORM:
        source = fold_prefetch_source()
    if io:
        assert sk == 1024 and consumers == 16, (sk, consumers, io)
        assert (int(swiglu), io) in TMA_BF16_IO + TMA_FOLD_IO, (swiglu, io)
        assert (fold is not None) == (source.name_expressions[0] in
                                      SOURCE_FOLD.name_expressions), io
    io = tma_vec_io(io, xs, n, x_vec)
    _start_tma(f"linear_tma_kernel<{int(swiglu)}, {sk}, {consumers}, {xs}, {tg}, {io}>",
               (row_blocks, col_tiles), consumers, params, smem,
               "linear_swiglu_tma" if swiglu else "linear_tma", pdl, source=source)


def tma_vec_io(io: int, xs: int, n: int, x_vec: bool | None = None) -> int:
    """`io` with TMA_IO_X_VEC where a call of `n` rows with `xs` x stages in registers (0: x read
    per stage) takes the 16-byte x loads: a bf16 x and `x_vec` (None: GEMV_X_VEC, n > 1, and x
    in registers or GEMV_X_VEC_STAGES)."""
    if x_vec is None:
        x_vec = GEMV_X_VEC and n > 1 and (xs > 0 or GEMV_X_VEC_STAGES)
    return io | TMA_IO_X_VEC if io & TMA_IO_X_BF16 and x_vec else io


def tma_row_blocks(m: int, n: int, *, swiglu: bool = False) -> int:
    """linear_tma_kernel's default persistent blocks per column tile of 8 rows: one per SM
    (shared among the column tiles), at most one per row tile (16 rows; SwiGLU: 8)."""
    tiles, col_tiles = -(-m // (8 if swiglu else 16)), (n + 7) // 8
    return max(1, min(tiles, current_device().sm_count // col_tiles))


def _start_tma(instance: str, grid, consumers: int, params, smem: int, name: str,
               pdl: bool | None = None, source: KernelSource = SOURCE) -> None:
    """Launch a bulk-copy GEMV instance of `source` (consumers + 1 warps per block, `smem` bytes
    of dynamic shared memory, opted into once) with PDL where `pdl` (None: GEMV_PDL)."""
    fn = get_function(source, instance)
    if fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    start = launch_dependent if (GEMV_PDL if pdl is None else pdl) else launch
    start(fn, grid, (32 * (consumers + 1),), (params,), shared_mem=smem, name=name)


def tma_swiglu_route_ok(x, gate_up, experts: int, top_k: int) -> bool:
    """Whether `launch_tma_swiglu_route` takes these operands: what `linear_swiglu` runs on
    linear_tma_kernel with the default geometry (bf16 [2I, K] with 16-byte aligned rows, K a
    multiple of 16, sm_90, TMA_SK = 1024 and 16 consumers: the instances), 1..ROUTE_MAX_ROWS rows,
    E <= ROUTE_MAX_EXPERTS and N * top_k <= ROUTE_MAX_PAIRS. A bf16 x (uint16) where
    `gemv_takes_bf16(gate_up)`, as `linear_swiglu` takes it."""
    n, k = x.shape
    w, kind = C.weight_array(gate_up, "gate_up")
    if C.is_bf16_bits(x) and not gemv_takes_bf16(gate_up):
        return False
    return (1 <= n <= ROUTE_MAX_ROWS and w.ndim == 2 and w.shape[1] == k and w.shape[0] % 2 == 0
            and w.shape[0] > 0 and GEMV_TMA and tma_ok(k) and TMA_SK == 1024
            and TMA_CONSUMERS == TMA_ROUTE_CONSUMERS and 1 <= experts <= ROUTE_MAX_EXPERTS
            and n * top_k <= ROUTE_MAX_PAIRS
            and _mma_ok(w, kind, C.row_stride(w, "gate_up"), x, C.row_stride(x, "x")))


def launch_tma_swiglu_route(x, gate_up, act_out, logits, top_k: int, weights_out, ids_out,
                            group_expert, group_pairs, num_groups, chunk: int) -> None:
    """linear_tma_swiglu_route_kernel on operands that passed `tma_swiglu_route_ok`: act_out
    f32 [N, I] = silu(x @ gate^T) * (x @ up^T) (gate_up = [gate; up]) on all blocks but the last,
    which routes logits f32 [N, E] (rows strided) into weights_out f32 [N, top_k] (rows strided)
    and ids_out i32 [N, top_k] (contiguous) and groups them (groups of <= chunk pairs) into the
    group tables; bitwise linear_swiglu and moe.moe_route(..., workspace=). x f32, or bf16 bits
    (uint16): then act_out is that of the f32 x holding the same values."""
    n, k = x.shape
    io = TMA_IO_X_BF16 if C.is_bf16_bits(x) else 0
    w, _ = C.weight_array(gate_up, "gate_up")
    inner = w.shape[0] // 2
    stages, smem = tma_plan(TMA_SK, TMA_CONSUMERS, TMA_RING_KIB)
    params = C.pack(ROUTE_PARAMS, w=C.ptr(w), x=C.ptr(x), out=C.ptr(act_out),
                    w_rs=C.row_stride(w, "gate_up"), x_rs=C.row_stride(x, "x"),
                    out_rs=C.row_stride(act_out, "act_out"), m=inner, k=k, n=n, splits=stages,
                    logits=C.ptr(logits), w_out=C.ptr(weights_out), ids_out=C.ptr(ids_out),
                    group_expert=C.ptr(group_expert), group_pairs=C.ptr(group_pairs),
                    num_groups=C.ptr(num_groups), logits_rs=C.row_stride(logits, "logits"),
                    w_out_rs=C.row_stride(weights_out, "weights_out"),
                    experts=logits.shape[1], top_k=top_k, chunk=chunk)
    xs = tma_x_stages(k, TMA_SK, TMA_CONSUMERS, bf16_x=bool(io))
    j = 8 if logits.shape[1] <= 256 else 16  # moe_route_row<J>: any 32 J >= E, the same bits
    gemv_blocks = max(1, min(-(-inner // 8), current_device().sm_count - 1))
    _start_tma(f"linear_tma_swiglu_route_kernel<{TMA_SK}, {TMA_CONSUMERS}, {xs}, {j}, {io}>",
               (gemv_blocks + 1, 1), TMA_CONSUMERS, params, smem, "linear_swiglu_route")


def _launch_mma(x, x_rs, w, w_rs, out, out_rs, m, k, n, *, swiglu: bool,
                rows: bool | None = None, row_blocks: int | None = None,
                tma: bool | None = None) -> None:
    """`tma`: linear_tma_kernel where `tma_ok` (None: GEMV_TMA). Otherwise `rows`:
    linear_mma_rows_kernel (True) or linear_mma_kernel (False); None: GEMV_ROWS.
    Rows kernel only: `row_blocks` blocks along the row tiles (None: all that fit at once when
    GEMV_PERSIST and the blocks have MMA_MAX_SPLITS warps, else one per tile); fewer blocks than
    tiles make the launch persistent."""
    if (GEMV_TMA if tma is None else tma) and tma_ok(k):
        _launch_tma(x, x_rs, w, w_rs, out, out_rs, m, k, n, swiglu=swiglu)
        return
    rows = GEMV_ROWS if rows is None else rows
    splits = mma_splits(k)
    params = C.pack(GEMV_PARAMS, w=C.ptr(w), x=C.ptr(x), out=C.ptr(out), w_rs=w_rs, x_rs=x_rs,
                    out_rs=out_rs, m=m, k=k, n=n, splits=splits)
    tile = 8 if swiglu else 16
    tiles, col_tiles = (m + tile - 1) // tile, (n + 7) // 8
    name = "linear_swiglu" if swiglu else "linear_mma"
    if not rows:
        launch(get_function(SOURCE, f"linear_mma_kernel<{int(swiglu)}>"), (tiles, col_tiles),
               (32 * splits,), (params,), name=name)
        return
    if row_blocks is None:
        persistent = GEMV_PERSIST and splits == MMA_MAX_SPLITS
        row_blocks = max(1, _persist_blocks(splits) // col_tiles) if persistent else tiles
    row_blocks = max(1, min(tiles, row_blocks))
    persist = int(row_blocks < tiles)
    fn = get_function(SOURCE, f"linear_mma_rows_kernel<{int(swiglu)}, {persist}>")
    smem = mma_rows_smem(splits)  # above 48 KiB from 10 splits: needs the opt-in
    if smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    launch(fn, (row_blocks, col_tiles), (32 * splits,), (params,), shared_mem=smem,
           name=name + "_rows")


def linear_swiglu(x, gate_up, out, row_norm=None) -> None:
    """out f32[N, I] = silu(x @ gate^T) * (x @ up^T), gate_up bf16 [2I, K] = [gate; up].

    One tensor-core launch, bitwise equal to `linear` into [N, 2I] then `swiglu` (any N; batch
    invariant). Needs bf16 weights and 16-byte aligned rows of gate_up and x. Where
    `gemv_takes_bf16(gate_up)`: x may be bf16 bits (uint16, the same alignment; the result of
    the f32 x holding those values) and so may `out` (uint16: the f32 result rounded to nearest
    even). `row_norm` (`linear` has it): gate and up rows divided by their row's rms before the
    silu; needs a bf16 x and a bf16 out.
    """
    bf16_x, bf16_out = C.is_bf16_bits(x), C.is_bf16_bits(out)
    C.device_array(x, "x", dtype=np.uint16 if bf16_x else np.float32, ndim=2)
    n, k = x.shape
    w, kind = C.weight_array(gate_up, "gate_up")
    C.require(w.ndim == 2 and w.shape[1] == k and w.shape[0] % 2 == 0, "gate_up",
              f"shape {w.shape}, expected [2I, {k}]")
    inner = w.shape[0] // 2
    C.device_array(out, "out", dtype=np.uint16 if bf16_out else np.float32, ndim=2,
                   shape=(n, inner))
    x_rs, w_rs, out_rs = C.row_stride(x, "x"), C.row_stride(w, "gate_up"), C.row_stride(out, "out")
    C.require(_mma_ok(w, kind, w_rs, x, x_rs), "gate_up",
              "needs bf16 weights and 16-byte aligned rows of gate_up and x")
    if bf16_x or bf16_out:
        C.require(gemv_takes_bf16(gate_up), "x" if bf16_x else "out",
                  "bf16 operands need the bf16-x GEMV (NINFER_GEMV_BF16_X=1, sm_90, K % 16 == 0)")
        C.require(bf16_x, "out", "a bf16 SwiGLU output needs a bf16 x")
    if row_norm is not None:
        C.require(bf16_x and bf16_out, "row_norm", "the fused SwiGLU's row norm needs a bf16 x "
                  "and a bf16 out")
        fold = _row_norm_fold(row_norm, n)
    if n == 0 or inner == 0:
        return
    if row_norm is not None:
        _launch_tma(x, x_rs, w, w_rs, out, out_rs, inner, k, n, swiglu=True,
                    io=TMA_IO_X_BF16 | TMA_IO_OUT_BF16 | TMA_IO_ROW_NORM, fold=fold)
        return
    if bf16_x:
        io = TMA_IO_X_BF16 | (TMA_IO_OUT_BF16 if bf16_out else 0)
        _launch_tma(x, x_rs, w, w_rs, out, out_rs, inner, k, n, swiglu=True, io=io)
        return
    _launch_mma(x, x_rs, w, w_rs, out, out_rs, inner, k, n, swiglu=True)


def gemv_takes_bf16(weight) -> bool:
    """Whether the GEMV (`linear` with few rows or batch invariant, `linear_swiglu`) takes x as
    bf16 bits for this weight: NINFER_GEMV_BF16_X, and linear_tma_kernel with its default
    geometry runs it (bf16 [M, K] weight with 16-byte aligned rows, K % 16 == 0, sm_90)."""
    w, kind = C.weight_array(weight, "weight")
    return (GEMV_BF16_X and GEMV_TMA and TMA_SK == 1024 and TMA_CONSUMERS == 16
            and kind is C.WKind.BF16 and w.ndim == 2 and tma_ok(w.shape[1]) and C.aligned(w)
            and w.strides[0] % 16 == 0)


def takes_bf16_x(n: int, weight, batch_invariant: bool = False) -> bool:
    """Whether `linear` with n rows accepts x as bf16 bits (uint16; see `linear` for the
    layouts): the cuBLAS path with bf16 weights (which rounds an f32 x to
    exactly those bits: the same `out`), or the bf16-x GEMV (`gemv_takes_bf16`: `out` is that
    of the f32 x holding the same values)."""
    if takes_cublas(n, batch_invariant):
        return C.weight_array(weight, "weight")[1] is C.WKind.BF16
    return gemv_takes_bf16(weight)


def takes_cublas(n: int, batch_invariant: bool) -> bool:
    """Whether `linear` with n rows runs the cuBLAS GEMM (else the batch-invariant GEMV)."""
    return n > GEMV_MAX_ROWS and not batch_invariant


def tma_geometry(x, weight, *, batch_invariant: bool = False) -> tuple[int, int] | None:
    """(k per stage, consumer warps) of the linear_tma_kernel that `linear(x, weight, out,
    batch_invariant=batch_invariant)` runs for an f32 x, or None where it runs another kernel
    (the GEMV path with bf16 weights and 16-byte aligned rows, NINFER_GEMV_TMA, `tma_ok`)."""
    if x.dtype != np.float32 or x.ndim != 2 or takes_cublas(x.shape[0], batch_invariant):
        return None
    w, kind = C.weight_array(weight, "weight")
    if w.ndim != 2 or w.shape[1] != x.shape[1] or x.shape[0] == 0 or w.shape[0] == 0:
        return None
    if not (_mma_ok(w, kind, C.row_stride(w, "weight"), x, C.row_stride(x, "x")) and GEMV_TMA
            and tma_ok(x.shape[1])):
        return None
    return TMA_SK, TMA_CONSUMERS


def linear(x, weight, out, *, workspace=None, batch_invariant: bool = False,
           row_norm=None, normed_out=None) -> None:
    """out f32[N,M] = x[N,K] @ weight[M,K]^T (f32 or bf16 weights).

    x: f32 (rows strided), or bf16 bits (uint16) where `takes_bf16_x`: C-contiguous on the
    cuBLAS path with bf16 weights (`takes_cublas`), which rounds an f32 x to exactly those
    bits; on the bf16-x GEMV a 16-byte aligned x with rows a multiple of 4 elements apart,
    and `out` is that of the f32 x holding the same values.
    `workspace`: uint16 CuPy array with >= N*K elements for the bf16 copy of an f32 x on the
    cuBLAS path (allocated from CuPy's pool when None). `batch_invariant=True` forces the GEMV
    kernel for any N.
    `row_norm` (the norm fold's consumer; `norm_fold_ok`): an object with `parts` (f32 [N, P],
    rows strided, P <= NORM_FOLD_MAX_PARTS: `linear_residual_norm`'s), `dim` and `eps`; x is
    bf16(r * gain) and row n of out is divided by sqrt(sum(parts[n]) / dim + eps).
    `normed_out` (with `row_norm`; bf16 bits [N, K], rows strided, apart from x): also written,
    bf16(x / that rms) elementwise (the norm finished for x's other readers).
    """
    bf16_x = C.is_bf16_bits(x)
    C.device_array(x, "x", dtype=np.uint16 if bf16_x else np.float32, ndim=2)
    n, k = x.shape
    w, kind = C.weight_array(weight, "weight")
    C.require(w.ndim == 2 and w.shape[1] == k, "weight", f"shape {w.shape}, expected [M, {k}]")
    m = w.shape[0]
    C.device_array(out, "out", dtype=np.float32, ndim=2, shape=(n, m))
    x_rs, w_rs, out_rs = C.row_stride(x, "x"), C.row_stride(w, "weight"), C.row_stride(out, "out")
    cublas = takes_cublas(n, batch_invariant)
    if bf16_x:
        C.require(takes_bf16_x(n, weight, batch_invariant), "x",
                  f"bf16 x is read only by the cuBLAS path (bf16 weights, N > {GEMV_MAX_ROWS}, "
                  f"not batch invariant) or the bf16-x GEMV (NINFER_GEMV_BF16_X=1, bf16 "
                  f"weights, K % 16 == 0, sm_90); got {kind.name} weights, N = {n}, "
                  f"batch_invariant={batch_invariant}")
        if cublas:
            C.contiguous(x, "x")
        else:
            C.require(_mma_ok(w, kind, w_rs, x, x_rs), "x",
                      "a bf16 x on the GEMV needs a 16-byte aligned base and rows a multiple "
                      "of 4 elements apart")
    if row_norm is not None:
        C.require(bf16_x and not cublas and n <= GEMV_MAX_ROWS, "row_norm",
                  "the row norm runs on the bf16-x GEMV (bf16 x, <= 8 rows)")
        fold, io = _row_norm_fold(row_norm, n), TMA_IO_X_BF16 | TMA_IO_ROW_NORM
    if normed_out is not None:
        C.require(row_norm is not None and m > 0, "normed_out", "needs row_norm (and M > 0)")
        C.device_array(normed_out, "normed_out", dtype=np.uint16, ndim=2, shape=(n, k))
        C.require(not C.cupy().may_share_memory(normed_out, x), "normed_out",
                  "must not overlap x")
        io |= TMA_IO_NORM_X
        # (TMA_IO_NORM_X: NormFoldParams.res / res_rs carry normed_out; no residual then)
        fold.update(res=C.ptr(normed_out), res_rs=C.row_stride(normed_out, "normed_out"))
    if n == 0 or m == 0:
        return
    if k == 0:
        out.fill(0)
        return
    if row_norm is not None:
        _launch_tma(x, x_rs, w, w_rs, out, out_rs, m, k, n, swiglu=False, io=io, fold=fold)
        return
    if not cublas and bf16_x:
        _launch_tma(x, x_rs, w, w_rs, out, out_rs, m, k, n, swiglu=False, io=TMA_IO_X_BF16)
        return
    if not cublas:
        launch_gemv(x, x_rs, w, kind, w_rs, out, out_rs, m, k, n)
        return
    _cublas_gemm(x, x_rs, w, kind, w_rs, out, out_rs, m, k, n, workspace)


def norm_fold_ok(n: int, weight) -> bool:
    """Whether the norm fold takes a GEMV of n rows with this weight, as the producer
    (`linear_residual_norm`) or a consumer (`linear` / `linear_swiglu` with `row_norm`): the
    bf16-x GEMV (`gemv_takes_bf16`) with 1..GEMV_MAX_ROWS rows (one column tile), and at most
    NORM_FOLD_MAX_PARTS row blocks."""
    return (1 <= n <= GEMV_MAX_ROWS and gemv_takes_bf16(weight)
            and current_device().sm_count <= NORM_FOLD_MAX_PARTS)


def residual_norm_parts(weight) -> int:
    """The columns of `parts` that `linear_residual_norm` writes for this weight: its row
    blocks (one per SM, at most one per 16-row tile; `_launch_tma` with one column tile)."""
    w, _ = C.weight_array(weight, "weight")
    return tma_row_blocks(w.shape[0], 1)


def linear_residual_norm(x, weight, residual, gain, out, parts) -> None:
    """The norm fold's producer: residual f32 [N, M] (rows strided) += x @ weight^T in place;
    out bf16 bits [N, M] (rows strided) = bf16(residual * gain), gain f32 [M] (a
    Qwen norm's 1 + w); parts f32 [N, >= P] (rows strided, P = `residual_norm_parts(weight)`):
    columns 0..P-1 = each row block's sum of residual^2 (fixed order: batch invariant). x: bf16
    bits [N, K] where `norm_fold_ok(N, weight)`."""
    C.device_array(x, "x", dtype=np.uint16, ndim=2)
    n, k = x.shape
    w, kind = C.weight_array(weight, "weight")
    C.require(w.ndim == 2 and w.shape[1] == k, "weight", f"shape {w.shape}, expected [M, {k}]")
    m = w.shape[0]
    C.require(norm_fold_ok(n, weight), "weight", "the norm fold runs on the bf16-x GEMV "
              f"(NINFER_GEMV_BF16_X=1, bf16 weights, K % 16 == 0, sm_90) with 1..{GEMV_MAX_ROWS} "
              f"rows; got N = {n}")
    C.norm_fold_operands(residual, gain, out, parts, n, m, residual_norm_parts(weight))
    x_rs, w_rs = C.row_stride(x, "x"), C.row_stride(w, "weight")
    C.require(_mma_ok(w, kind, w_rs, x, x_rs), "x", "needs 16-byte aligned rows of weight and x")
    fold = dict(res=C.ptr(residual), res_rs=C.row_stride(residual, "residual"), gain=C.ptr(gain),
                parts=C.ptr(parts), parts_rs=C.row_stride(parts, "parts"))
    _launch_tma(x, x_rs, w, w_rs, out, C.row_stride(out, "out"), m, k, n, swiglu=False,
                io=TMA_IO_X_BF16 | TMA_IO_RESID_NORM, fold=fold)


def _row_norm_fold(row_norm, n: int) -> dict:
    """The NormFoldParams fields of a consumer's `row_norm` (checked)."""
    parts = row_norm.parts
    C.device_array(parts, "row_norm.parts", dtype=np.float32, ndim=2)
    C.require(parts.shape[0] == n and 1 <= parts.shape[1] <= NORM_FOLD_MAX_PARTS,
              "row_norm.parts", f"shape {parts.shape}, expected [{n}, 1..{NORM_FOLD_MAX_PARTS}]")
    C.require(int(row_norm.dim) > 0, "row_norm.dim", f"must be positive, got {row_norm.dim}")
    return dict(parts=C.ptr(parts), parts_rs=C.row_stride(parts, "row_norm.parts"),
                parts_n=parts.shape[1], dim=int(row_norm.dim), eps=float(row_norm.eps))


def to_bf16(x, x_rs: int, n: int, k: int, out) -> None:
    """out uint16[>= N*K] = bf16 (round to nearest even) of x f32[N, K] (rows x_rs apart), rows
    packed K apart."""
    if n == 0 or k == 0:
        return
    col_blocks = min(64, -(-k // 1024))
    launch(get_function(SOURCE, "f32_to_bf16_kernel"), (col_blocks, min(n, 65535)), (256,),
           (x, np.int64(x_rs), np.int32(n), np.int32(k), out), name="f32_to_bf16")


def _bf16_operand(x, x_rs, n, k, workspace):
    """x as bf16 bits [N, K] rows K apart: x itself when it is bf16 already, else its RNE copy
    in `workspace` (or a pool allocation outside a capture)."""
    if x.dtype == np.uint16:
        return x
    if workspace is None:
        C.require(not C.cupy().cuda.get_current_stream().is_capturing(), "workspace",
                  "a bf16 linear with more than GEMV_MAX_ROWS rows inside a graph capture "
                  "needs a preallocated workspace")
        workspace = C.cupy().empty(n * k, dtype=np.uint16)
    C.device_array(workspace, "workspace", dtype=np.uint16)
    C.require(workspace.size >= n * k and workspace.flags.c_contiguous, "workspace",
              f"needs >= {n * k} contiguous uint16 elements")
    to_bf16(x, x_rs, n, k, workspace)
    return workspace


def _cublas_gemm(x, x_rs, w, kind, w_rs, out, out_rs, m, k, n, workspace) -> None:
    if kind is C.WKind.BF16:
        b_ptr, b_ld, dtype = C.ptr(_bf16_operand(x, x_rs, n, k, workspace)), k, _cublas.R_16BF
    else:
        b_ptr, b_ld, dtype = C.ptr(x), x_rs, _cublas.R_32F
    # Column-major view: out^T [M, N] = (w as K x M)^T @ (x as K x N).
    _cublas.gemm_ex(_cublas.OP_T, _cublas.OP_N, m, n, k, C.ptr(w), dtype, w_rs, b_ptr, dtype,
                    b_ld, C.ptr(out), out_rs)
