"""Launchers for moe.cu: `moe_route`, `moe_experts` and `moe_block` (docs/ops.md).

`moe_experts` (and `moe_block`, which adds the routing and the gated shared expert) has two
paths:
- grouped GEMV (capturable, batch invariant, reads each selected expert's weights once per
  group of <= 8 rows): N <= GEMV_MAX_ROWS, or while capturing, or `batch_invariant=True`;
  intermediates live in a `MoeWorkspace` (allocated per call when None); bf16 weights with
  16-byte aligned rows run the tensor-core `moe_mma_rows_kernel` (groups of up to 8 pairs;
  NINFER_GEMV_ROWS=0: `moe_mma_kernel`, bitwise the same), others the f32-FMA
  `moe_gemv_kernel`; `moe_block` at decode (`fused_applies`) runs routing + gate_up and
  down + combine as two launches (FUSED, NINFER_MOE_FUSED), bitwise the four-launch results;
  with MOE_TMA (NINFER_MOE_TMA, sm_90, K % 16 == 0) the gate_up stage is
  `moe_tma_gate_up_kernel` (bulk-copy ring; bitwise the rows kernel), and the fused path
  route_group -> TMA gate_up -> fused down (`moe_block(..., shared_down=)`: the gated shared
  expert's down projection inside the fused down launch, where `shared_down_folds`; TMA_DOWN:
  that launch as moe_tma_down_kernel, where `tma_down_applies`; PERSIST: TMA gate_up + fused
  down as one persistent launch, where `persist_plan`);
  `moe_route(..., workspace=)` writes the group tables too and `moe_block(..., routed=True)`
  then runs only the expert stages (routing done earlier);
- prefill (eager): the (row, slot) pairs are grouped by expert on the host (one device->host
  copy of ids), each expert's rows are padded to the largest group, and two cuBLAS
  strided-batched GEMMs (fp32 accumulation; bf16 operands for bf16 weights) do all experts.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ninfer import envs
from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda import _cublas
from ninfer.kernels_cuda._loader import KernelSource, current_device, get_function, launch
from ninfer.kernels_cuda.linear import (
    MMA_ROWS_ALIGN,
    MMA_ROWS_WARP_SMEM,
    NORM_FOLD_MAX_PARTS,
    ROWS_PER_BLOCK,
    k_splits,
    launch_tma_swiglu_route,
    linear_swiglu,
    mma_splits,
    rows_tile,
    tma_geometry,
    tma_ok,
    tma_swiglu_route_ok,
)

GEMV_MAX_ROWS = 32
MAX_PAIRS = 1024  # moe_group_kernel: one block
GROUP_STRIDE = 8
ROUTE_J = (1, 2, 4, 8, 16, 32)  # moe_route_kernel<J>: experts per lane (E <= 32 J)
ROUTE_GROUP_J = (1, 2, 4, 8, 16)  # moe_route_group_kernel<J> (1024 threads: <= 64 registers)
ROUTE_ROWS_PER_BLOCK = 8  # moe_route_kernel: one warp per row
MMA_SPLITS = 8  # moe_mma(_rows)_kernel: at most 8 warps (K ranges) per block
# NINFER_GEMV_ROWS (read once at import; default on; the same switch as linear.GEMV_ROWS): the
# tensor-core expert GEMVs run moe_mma_rows_kernel (row-contiguous weight reads staged through
# shared memory), bitwise equal to moe_mma_kernel. H200, 35B-A3B decode graph, B = 1 / 8:
# 4.43 / 8.96 ms, against 4.64 / 8.83 ms with moe_mma_kernel (measured on another machine).
GEMV_ROWS = envs.gemv_rows()
# NINFER_MOE_FUSED (read once at import; default on): moe_block at decode (N <= FUSED_MAX_ROWS,
# N * K <= FUSED_MAX_PAIRS, bf16 experts on the tensor-core path, E <= 32 * FUSED_J[-1]) runs
# the routed experts in two launches instead of four: moe_fused_gate_up_kernel (routing,
# grouping and gate_up + SwiGLU) and moe_fused_down_kernel (down and the combine with the gated
# shared add); bitwise the same weights, ids and output. "0": the four-launch path (A/B timing).
# By default only while N * K <= FUSED_DEFAULT_PAIRS (an explicit fused=True takes any pairs up to
# FUSED_MAX_PAIRS): H200 35B-A3B decode graph, same machine, B = 1 / 8 ms: 3.149 / 9.933 fused
# for every N against 3.245 / 7.816 unfused (the down kernel's 128 blocks walk up to 64 expert
# groups one after another at B = 8).
FUSED = envs.moe_fused()
FUSED_DEFAULT_PAIRS = 8
FUSED_MAX_ROWS = 8
FUSED_MAX_PAIRS = 64  # moe.cu MOE_FUSED_PAIRS
FUSED_J = (1, 2, 4, 8, 16)  # moe_fused_gate_up_kernel<J>: experts per lane (E <= 32 J)
FUSED_DOWN_WARPS = 16  # moe_fused_down_kernel: warps per block (the experts' teams)
FUSED_DOWN_SLOTS = 8  # moe.cu MOE_DOWN_SLOTS
FUSED_DOWN_SHARED_WARPS = 4  # moe.cu MOE_DOWN_SHARED_WARPS: the folded shared down's team
DOWN_PREFETCH, DOWN_SHARED_EARLY = 1, 2  # moe.cu moe_fused_down_kernel's prewait flags
FOLD_MAX_K = 2048  # shared_down_folds: Is bound (~99 KiB of staged tile, x rows and partials)
# NINFER_MOE_TMA (read once at import; default on): the gate_up + SwiGLU stage
# of the grouped decode path (bf16 tensor-core experts, K = hidden % 16 == 0, sm_90) runs
# moe_tma_gate_up_kernel (weights streamed by bulk copies into a shared-memory ring, one
# persistent block per SM) instead of moe_mma_rows_kernel<1> / moe_fused_gate_up_kernel; act is
# bitwise the same. moe_block's fused path then runs moe_route_group_kernel ->
# moe_tma_gate_up_kernel -> moe_fused_down_kernel (three launches, the same outputs; with
# NINFER_MOE_ROUTE_FIRST the routing launch runs before the shared expert). H200 35B-A3B decode
# B = 1 / 8, same machine: 3.066 / 7.720 ms with both on, 3.115 / 7.863 ms with both off.
MOE_TMA = envs.moe_tma()
# NINFER_MOE_TMA_PAIRS (read once at import): moe_tma_gate_up_kernel's consumers take two work
# items at a time when the ring holds two (their mma chains overlap; the same bits).
MOE_TMA_PAIRS = envs.moe_tma_pairs()
# NINFER_MOE_DOWN_PREWAIT (read once at import): moe_fused_down_kernel prefetches its down rows
# into the L2 before its PDL wait where the group tables predate the gate_up stage (a hint).
DOWN_PREWAIT = envs.moe_down_prewait()
# NINFER_MOE_TMA_XREGS (read once at import): moe_tma_gate_up_kernel<1> (x in registers) wherever
# it can run, unless a caller says otherwise (the same bits either way).
TMA_X_REGS = envs.moe_tma_x_regs()
# NINFER_MOE_TMA_XPIPE (read once at import; default on, 35B-A3B B=8 -1.0%): where x is not in
# registers (B > 1), moe_tma_gate_up_kernel's consumers keep two batches of x loads in flight
# (SOURCE_XPIPE; the same bits)
TMA_XPIPE = envs.moe_tma_xpipe()
# NINFER_MOE_PERSIST (read once at import; default off): moe_block's fused decode path with the
# bulk-copy gate_up runs both expert stages and the combine as one persistent launch
# (moe_tma_experts_kernel: the down tiles stream through the gate_up ring behind the block's
# last items, a grid barrier on act) where `persist_plan` fits; bitwise the two launches.
# Off by default: slower than the two launches at 35B-A3B B=1 (docs/performance.md).
PERSIST = envs.moe_persist()
PERSIST_GROUPS = 8  # moe.cu MOE_EXPERTS_GROUPS: the pairs (so groups) whose down tiles it stages
# NINFER_MOE_TMA_DOWN (read once at import; default off): after the bulk-copy gate_up stage, the
# fused down stage runs moe_tma_down_kernel where `tma_down_smem` fits: its weight tiles are
# bulk-copied and its tables read before its PDL wait, act after it; bitwise
# moe_fused_down_kernel. Off by default: 1.2% slower at 35B-A3B B=1 (docs/performance.md).
TMA_DOWN = envs.moe_tma_down()
TMA_DOWN_WARPS = 8    # moe.cu MOE_TMA_DOWN_WARPS
TMA_DOWN_HEAD = 128   # moe.cu MOE_TMA_DOWN_HEAD: its two mbarriers
TMA_DOWN_TEAMS = 4    # moe.cu MOE_EXPERTS_TEAMS: its teams' MmaPartials<8>
TMA_DOWN_STATIC = 2048  # bound on its static shared memory (MoeDownBlock: 1408 bytes; marks)
# NINFER_MOE_SHARED_EARLY (read once at import; default on): the folded shared down projection
# is computed before moe_fused_down_kernel's PDL wait where the gate_up stage before it is
# moe_tma_gate_up_kernel (the same bits either way).
SHARED_EARLY = envs.moe_shared_early()
TMA_TARGET_SK = envs.moe_tma_sk()  # k per ring stage aimed at (2 sk bytes per row's copy)
TMA_MAX_STAGES = 16  # moe.cu MOE_TMA_MAX_STAGES
TMA_PAD = 64  # moe.cu MOE_TMA_PAD (tma_pitch)
TMA_XR_STEPS = 8  # moe.cu MOE_TMA_XR_STEPS
TMA_BAR_BYTES = 256  # moe.cu MOE_TMA_BAR_BYTES
TMA_SMEM_LIMIT = 227 * 1024  # sm_90 dynamic shared memory per block (opt-in)


@dataclasses.dataclass(frozen=True)
class TmaPlan:
    """Geometry of moe_tma_gate_up_kernel for a reduction length K: `splits` consumer warps (the
    rows kernel's K split), ring stages of `sk` k holding the K ranges of `stage_warps` warps
    each (`per_item` = splits / stage_warps stages per work item), `stages` ring slots (a
    multiple of per_item) and `smem` bytes of dynamic shared memory."""

    splits: int
    sk: int
    stage_warps: int
    stages: int
    smem: int

    @property
    def per_item(self) -> int:
        return self.splits // self.stage_warps


def tma_pitch(sk: int) -> int:
    """moe.cu moe_tma_pitch: bytes between the ring's rows, 2 sk rounded up to 64 mod 128."""
    return 2 * sk + TMA_PAD - ((2 * sk) & TMA_PAD)


def tma_gate_up_plan(k: int, smem_limit: int = TMA_SMEM_LIMIT,
                     target_sk: int = TMA_TARGET_SK) -> TmaPlan | None:
    """The ring of moe_tma_gate_up_kernel for K (pure; None when no ring fits `smem_limit`).
    splits = mma_splits(K, MMA_SPLITS) and the warps' K ranges of mma_warp_k_range (ceil(steps
    / splits) 32-k steps each, none empty); a stage holds stage_warps consecutive ranges, the
    divisor of splits that leaves room for two items in flight and whose stage k is nearest
    `target_sk` (2 KiB copies; ties: the shorter), else one item in flight. Every plan gives
    the same bits (tests take other limits and targets to exercise the ring)."""
    if k <= 0 or k % 16:
        return None
    splits = mma_splits(k, MMA_SPLITS)
    per_k = -(-(-(-k // 32)) // splits) * 32
    if (splits - 1) * per_k >= k:  # an empty K range (not with splits <= 8 >= 8 steps each)
        return None
    fixed = TMA_BAR_BYTES + 4 * MMA_SPLITS * 16 * 8 * 4  # barriers, four MmaPartials<8>
    best = None
    for sw in (d for d in range(1, splits + 1) if splits % d == 0):
        ns, sk = splits // sw, sw * per_k
        stage = 16 * tma_pitch(sk)
        stages = min(TMA_MAX_STAGES, max(0, smem_limit - fixed) // stage) // ns * ns
        if stages < ns:
            continue
        key = (stages >= 2 * ns, -abs(sk - target_sk), -sk)
        if best is None or key > best[0]:
            best = (key, TmaPlan(splits, sk, sw, stages, fixed + stages * stage))
    return None if best is None else best[1]


def _swiglu_rows(nt: int) -> int:
    return max(1, ROWS_PER_BLOCK[nt] // 2)


SOURCE = KernelSource("moe.cu", tuple(
    [f"moe_route_kernel<{j}>" for j in ROUTE_J]
    + [f"moe_route_group_kernel<{j}>" for j in ROUTE_GROUP_J]
    + ["moe_group_kernel", "moe_combine_kernel<0>", "moe_combine_kernel<1>"]
    + [f"moe_gemv_kernel<{k.ctype}, {nt}, {_swiglu_rows(nt) if sw else r}, {al}, {sw}>"
       for k in C.WKind for nt, r in ROWS_PER_BLOCK.items() for al in (0, 1) for sw in (0, 1)]
    + ["moe_mma_kernel<0>", "moe_mma_kernel<1>", "moe_mma_rows_kernel<0, 0>",
       "moe_mma_rows_kernel<0, 1>", "moe_mma_rows_kernel<1, 0>"]
    + [f"moe_fused_gate_up_kernel<{j}>" for j in FUSED_J]
    + [f"moe_fused_down_kernel<{xb}, {nf}>" for xb in (0, 1) for nf in (0, 1)]
    + [f"moe_tma_gate_up_kernel<{xr}, {xb}>" for xr in (0, 1) for xb in (0, 1)]
    + ["moe_tma_experts_kernel<0>", "moe_tma_experts_kernel<1>", "moe_tma_down_kernel"]
    + [f"moe_gather_kernel<{k.ctype}>" for k in C.WKind]
    + [f"moe_swiglu_kernel<{k.ctype}>" for k in C.WKind] + ["moe_x_f32_kernel"]))
# moe_tma_gate_up_kernel<0> with each batch's x loads issued before the previous batch's mmas
# (moe.cu MOE_TMA_XPIPE; the same bits), used under TMA_XPIPE
SOURCE_XPIPE = dataclasses.replace(SOURCE, name_expressions=("moe_tma_gate_up_kernel<0, 0>",
                                                             "moe_tma_gate_up_kernel<0, 1>"),
                                   options=("-DMOE_TMA_XPIPE=1",))
_GEMV_FIELDS = (("w", "ptr"), ("x", "ptr"), ("out", "ptr"), ("group_expert", "ptr"),
                ("group_pairs", "ptr"), ("num_groups", "ptr"), ("w_es", "i64"), ("w_rs", "i64"),
                ("x_rs", "i64"), ("out_rs", "i64"), ("m", "i32"), ("k", "i32"),
                ("splits", "i32"), ("top_k", "i32"), ("up_offset", "i32"), ("x_by_pair", "i32"),
                ("experts", "i32"), ("out_mode", "i32"))
_GEMV = C.struct(*_GEMV_FIELDS)
assert _GEMV.itemsize == 112
# moe.cu MOE_ACT_*: how a gate_up stage stores act (MoeGemvParams.out_mode): f32; its bf16
# rounding as bf16 bits (read by the down stages' rows tiles, moe_mma_rows_kernel<0, 1> and
# moe_fused_down_kernel<1>: one mma per k16 step); that rounding as f32 (the down stages that
# read f32: the same down results)
ACT_F32, ACT_BF16_BITS, ACT_BF16_F32 = 0, 1, 2


def _stage_fields(w, w_rs: int, w_es: int, x, x_rs: int, x_by_pair: int, out, m: int, k: int,
                  *, splits: int, top_k: int, up_offset: int, experts: int,
                  ws: "MoeWorkspace", out_mode: int = ACT_F32) -> dict:
    """The MoeGemvParams fields of one expert stage over the group tables in `ws`: weights w
    (strides w_es, w_rs), x rows (x_rs apart; by pair or by token), out rows (None: unused;
    uint16 where out_mode is ACT_BF16_BITS)."""
    C.require(out is None or C.is_bf16_bits(out) == (out_mode == ACT_BF16_BITS), "out",
              "bf16 bits exactly where out_mode is ACT_BF16_BITS")
    return dict(w=C.ptr(w), x=C.ptr(x), out=0 if out is None else C.ptr(out),
                group_expert=C.ptr(ws.group_expert), group_pairs=C.ptr(ws.group_pairs),
                num_groups=C.ptr(ws.num_groups), w_es=w_es, w_rs=w_rs, x_rs=x_rs,
                out_rs=0 if out is None else out.shape[1], m=m, k=k, splits=splits,
                top_k=top_k, up_offset=up_offset, x_by_pair=x_by_pair, experts=experts,
                out_mode=out_mode)


def _act_bits(ws: "MoeWorkspace"):
    """ws.act's storage as uint16 [pairs, Im] (rows Im elements apart): act stored as
    ACT_BF16_BITS."""
    return ws.act.reshape(-1).view(np.uint16)[: ws.act.size].reshape(ws.act.shape)


def _act_out(ws: "MoeWorkspace", act_mode: int):
    """Where a gate_up stage with this act_mode writes act (the down stages read it there)."""
    return _act_bits(ws) if act_mode == ACT_BF16_BITS else ws.act


def _act_mode(bf16_act: bool, kind, bits: bool) -> int:
    """act_mode of a call: f32 unless `bf16_act` with bf16 expert weights, then bf16 bits where
    the down stage reads them (`bits`), else the rounding stored as f32."""
    if not bf16_act or kind is not C.WKind.BF16:
        return ACT_F32
    return ACT_BF16_BITS if bits else ACT_BF16_F32


def _down_fields(dn, hidden: int, inter: int, top_k: int, experts: int,
                 ws: "MoeWorkspace") -> dict:
    """The fused down stage's fields: down [E, H, Im] times ws.act by pair (its out unused;
    the same fields whether act holds f32 or bf16 bits: rows Im elements apart)."""
    return _stage_fields(dn, inter, hidden * inter, ws.act, ws.act.shape[1], 1, None, hidden,
                         inter, splits=mma_splits(inter, MMA_SPLITS), top_k=top_k,
                         up_offset=inter, experts=experts, ws=ws)
_SHARED_DOWN_FIELDS = (("w", "ptr"), ("x", "ptr"), ("w_rs", "i64"), ("x_rs", "i64"),
                       ("m", "i32"), ("k", "i32"), ("sk", "i32"), ("cons", "i32"))
_SHARED_DOWN = C.struct(*_SHARED_DOWN_FIELDS)
assert _SHARED_DOWN.itemsize == 48  # moe.cu MoeSharedDown
# moe.cu MoeCombine: the combine's operands (c_* in the records below)
_COMBINE_FIELDS = (("w", "ptr"), ("ids", "ptr"), ("shared", "ptr"), ("gate", "ptr"),
                   ("out", "ptr"), ("w_rs", "i64"), ("shared_rs", "i64"), ("gate_rs", "i64"),
                   ("out_rs", "i64"))


def _nested(prefix: str, fields) -> list:
    """A nested record's (name, type) fields under its prefix in a packed launch record."""
    return [(prefix + n, t) for n, t in fields]


# moe.cu MoeTmaExpertsParams: two MoeGemvParams (gu_*, dn_*), a MoeSharedDown (sd_*), a
# MoeCombine (c_*), then the barrier and the ring's geometry
_EXPERTS = C.struct(*_nested("gu_", _GEMV_FIELDS), *_nested("dn_", _GEMV_FIELDS),
                    *_nested("sd_", _SHARED_DOWN_FIELDS), *_nested("c_", _COMBINE_FIELDS),
                    ("barrier", "ptr"), ("n_rows", "i32"), ("sk", "i32"), ("sw", "i32"),
                    ("stages", "i32"), ("pairs", "i32"), ("pad", "i32"))
assert _EXPERTS.itemsize == 376
# moe.cu MoeTmaDownParams: a MoeGemvParams (dn_*), a MoeSharedDown (sd_*), a MoeCombine (c_*)
_TMA_DOWN = C.struct(*_nested("dn_", _GEMV_FIELDS), *_nested("sd_", _SHARED_DOWN_FIELDS),
                     *_nested("c_", _COMBINE_FIELDS), ("n_rows", "i32"), ("pad", "i32"))
assert _TMA_DOWN.itemsize == 240
_NO_FOLD = C.pack(_SHARED_DOWN)  # moe_fused_down_kernel's sd when nothing folds (w null)
# moe.cu MoeNormFold: the norm fold's producer (moe_block `norm_fold`); zeros where none
_NORM_FOLD = C.struct(("res", "ptr"), ("gain", "ptr"), ("xg", "ptr"), ("parts", "ptr"),
                      ("res_rs", "i64"), ("xg_rs", "i64"), ("parts_rs", "i64"))
assert _NORM_FOLD.itemsize == 56
_NO_NORM_FOLD = C.pack(_NORM_FOLD)


def norm_fold_parts(hidden: int) -> int:
    """The columns of `parts` an MoE block's norm fold writes: one per 16 output columns."""
    return -(-hidden // 16)


def norm_folds(n: int, top_k: int, hidden: int, *, batch_invariant: bool = False) -> bool:
    """Whether `moe_block(..., norm_fold=...)` takes n rows: the grouped-GEMV decode path whose
    last launch is moe_fused_down_kernel or moe_combine_kernel (not the opt-in persistent or
    bulk-copy down kernels: PERSIST / TMA_DOWN, checked as flags so that every row count
    decides alike), and at most NORM_FOLD_MAX_PARTS column groups."""
    if PERSIST or TMA_DOWN or norm_fold_parts(hidden) > NORM_FOLD_MAX_PARTS:
        return False
    return (n <= GEMV_MAX_ROWS or batch_invariant) and n * top_k <= MAX_PAIRS


def _norm_fold_params(norm_fold, n: int, hidden: int):
    """MoeNormFold packed from `norm_fold` = (residual f32 [N, H], gain f32 [H], xg bf16 bits
    [N, H], parts f32 [N, >= ceil(H / 16)]), checked; the zero record for None."""
    if norm_fold is None:
        return _NO_NORM_FOLD
    residual, gain, xg, parts = norm_fold
    C.norm_fold_operands(residual, gain, xg, parts, n, hidden, norm_fold_parts(hidden),
                         out_name="xg")
    return C.pack(_NORM_FOLD, res=C.ptr(residual), gain=C.ptr(gain), xg=C.ptr(xg),
                  parts=C.ptr(parts), res_rs=C.row_stride(residual, "residual"),
                  xg_rs=C.row_stride(xg, "xg"), parts_rs=C.row_stride(parts, "parts"))


def moe_route(logits, top_k: int, weights_out, ids_out, *,
              workspace: MoeWorkspace | None = None) -> None:
    """Softmax over E experts (fp32), the top_k largest (ties to the lower id), renormalised.
    logits: f32[N, E] with a contiguous last axis (rows may be strided). With a `workspace`
    whose group tables hold N * top_k <= MAX_PAIRS pairs (ids_out contiguous), the launch also
    writes the grouping of ids_out (GROUP_STRIDE pairs per group; moe_route_group_kernel, or
    moe_route_kernel + moe_group_kernel when E > 32 ROUTE_GROUP_J[-1]): what
    `moe_block(..., routed=True, workspace=workspace)` reads; the same weights and ids."""
    n, experts = _check_route(logits, top_k, weights_out, ids_out)
    if n == 0:
        return
    if workspace is not None and route_groups(workspace, n * top_k):
        C.contiguous(ids_out, "ids_out")
        _route_group(logits, top_k, weights_out, ids_out, GROUP_STRIDE, workspace)
        return
    warps = min(n, ROUTE_ROWS_PER_BLOCK)
    launch(get_function(SOURCE, f"moe_route_kernel<{_route_j(experts, ROUTE_J)}>"),
           ((n + warps - 1) // warps,), (32 * warps,), _route_args(logits, top_k, weights_out,
                                                              ids_out), name="moe_route",
           pdl=True)


def route_with_swiglu_applies(logits, top_k: int, x, gate_up,
                              workspace: MoeWorkspace | None) -> bool:
    """Whether `route_with_swiglu` runs as one launch (linear.tma_swiglu_route_ok, a workspace
    whose group tables take N * top_k pairs, logits and x with the same rows)."""
    return (workspace is not None and logits.ndim == 2 and logits.shape[0] == x.shape[0]
            and route_groups(workspace, x.shape[0] * top_k)
            and tma_swiglu_route_ok(x, gate_up, logits.shape[1], top_k))


def route_with_swiglu(logits, top_k: int, weights_out, ids_out, x, gate_up, act_out, *,
                      workspace: MoeWorkspace) -> None:
    """`moe_route(logits, top_k, weights_out, ids_out, workspace=workspace)` and
    `linear_swiglu(x, gate_up, act_out)` (gate_up bf16 [2I, K] = [gate; up], act_out f32
    [N, I]): bitwise those two, in one launch where `route_with_swiglu_applies` (the routing
    runs on an extra block of the SwiGLU GEMV), else the two launches. x f32, or bf16 bits
    where `linear_swiglu` takes them."""
    n, _ = _check_route(logits, top_k, weights_out, ids_out)
    C.device_array(x, "x", dtype=np.uint16 if C.is_bf16_bits(x) else np.float32, ndim=2)
    C.require(x.shape[0] == n, "x", f"{x.shape[0]} rows, logits have {n}")
    if not route_with_swiglu_applies(logits, top_k, x, gate_up, workspace):
        moe_route(logits, top_k, weights_out, ids_out, workspace=workspace)
        linear_swiglu(x, gate_up, act_out)
        return
    w, _ = C.weight_array(gate_up, "gate_up")
    C.device_array(act_out, "act_out", dtype=np.float32, ndim=2, shape=(n, w.shape[0] // 2))
    C.contiguous(ids_out, "ids_out")
    launch_tma_swiglu_route(x, gate_up, act_out, logits, top_k, weights_out, ids_out,
                            workspace.group_expert, workspace.group_pairs, workspace.num_groups,
                            GROUP_STRIDE)



def route_groups(ws: MoeWorkspace, pairs: int) -> bool:
    """Whether `moe_route(..., workspace=ws)` writes the group tables for `pairs` pairs: the
    grouped-GEMV path's pair limit and room in ws (else moe_block's grouped path cannot run
    with ws anyway)."""
    return pairs <= MAX_PAIRS and ws.group_expert.shape[0] >= pairs


def _route_group(logits, top_k, weights_out, ids_out, nt: int, ws: MoeWorkspace) -> None:
    """Routing of all rows and the grouping of ids_out (groups of <= nt pairs) into ws: one
    moe_route_group_kernel launch, or moe_route_kernel + moe_group_kernel for E > 32 J."""
    n, experts = logits.shape
    j = _route_j(experts, ROUTE_GROUP_J)
    if j is None:
        moe_route(logits, top_k, weights_out, ids_out)
        _group(ids_out, nt, ws)
        return
    # a warp per row (up to 32 warps) and at least a thread per pair
    warps = max(min(n, 32), -(-n * top_k // 32))
    launch(get_function(SOURCE, f"moe_route_group_kernel<{j}>"), (1,), (32 * warps,),
           _route_args(logits, top_k, weights_out, ids_out)
           + (np.int32(nt), ws.group_expert, ws.group_pairs, ws.num_groups),
           name="moe_route_group", pdl=True)


def _check_route(logits, top_k, weights_out, ids_out) -> tuple[int, int]:
    C.device_array(logits, "logits", dtype=np.float32, ndim=2)
    n, experts = logits.shape
    C.require(1 <= top_k <= min(experts, 64), "top_k", f"must be in [1, {min(experts, 64)}]")
    C.require(experts <= 32 * ROUTE_J[-1], "logits", f"{experts} experts > {32 * ROUTE_J[-1]}")
    C.device_array(weights_out, "weights_out", dtype=np.float32, shape=(n, top_k))
    C.device_array(ids_out, "ids_out", dtype=np.int32, shape=(n, top_k))
    return n, experts


def _route_j(experts: int, choices: tuple[int, ...]) -> int | None:
    """The smallest J in `choices` with 32 J >= experts (None: none fits)."""
    return next((j for j in choices if 32 * j >= experts), None)


def _route_args(logits, top_k, weights_out, ids_out) -> tuple:
    """(logits, logits_rs, n_rows, experts, top_k, w_out, w_rs, ids_out, ids_rs)."""
    n, experts = logits.shape
    return (logits, np.int64(C.row_stride(logits, "logits")), np.int32(n), np.int32(experts),
            np.int32(top_k), weights_out, np.int64(C.row_stride(weights_out, "weights_out")),
            ids_out, np.int64(C.row_stride(ids_out, "ids_out")))


@dataclasses.dataclass(frozen=True)
class MoeWorkspace:
    """Intermediates of the grouped-GEMV path for up to `pairs` = N * K (row, slot) pairs."""

    act: object           # f32 [pairs, Im]
    y: object             # f32 [pairs, H]
    group_expert: object  # i32 [pairs]
    group_pairs: object   # i32 [pairs * 8]
    num_groups: object    # i32 [1]
    # u32 [2], zeros: moe_tma_experts_kernel's grid barrier (one u64: arrivals | generation << 32)
    barrier: object = None
    # f32 [rows, H]: the f32 copy of a bf16 x for the stages that read f32 (_x_f32)
    x32: object = None

    @classmethod
    def allocate(cls, max_rows: int, top_k: int, hidden: int, inter: int):
        cp = C.cupy()
        pairs = max_rows * top_k
        return cls(cp.empty((pairs, inter), dtype=np.float32),
                   cp.empty((pairs, hidden), dtype=np.float32),
                   cp.empty(pairs, dtype=np.int32), cp.empty(pairs * GROUP_STRIDE, dtype=np.int32),
                   cp.empty(1, dtype=np.int32), cp.zeros(2, dtype=np.uint32),
                   cp.empty((max_rows, hidden), dtype=np.float32))

    def fits(self, pairs: int, hidden: int, inter: int) -> bool:
        return (self.act.shape[0] >= pairs and self.act.shape[1] == inter
                and self.y.shape[1] == hidden and self.group_expert.shape[0] >= pairs)


def _expert_weights(gate_up, down, hidden):
    gu, kind = C.weight_array(gate_up, "gate_up")
    dn, dkind = C.weight_array(down, "down")
    C.require(gu.ndim == 3 and gu.shape[2] == hidden and gu.shape[1] % 2 == 0, "gate_up",
              f"expected [E, 2Im, {hidden}], got {gu.shape}")
    experts, two_i = gu.shape[0], gu.shape[1]
    C.require(dn.shape == (experts, hidden, two_i // 2), "down",
              f"expected [{experts}, {hidden}, {two_i // 2}], got {dn.shape}")
    C.require(kind is dkind, "down", "gate_up and down must have the same dtype")
    C.contiguous(gu, "gate_up")
    C.contiguous(dn, "down")
    return gu, dn, kind, experts, two_i // 2


def _check_x(x) -> None:
    """x: f32 [N, H] rows strided, or bf16 bits (uint16) with 16-byte aligned rows."""
    if C.is_bf16_bits(x):
        C.device_array(x, "x", dtype=np.uint16, ndim=2)
        C.require(C.aligned(x) and C.row_stride(x, "x") % 8 == 0, "x",
                  "a bf16 x needs 16-byte aligned rows")
    else:
        C.device_array(x, "x", dtype=np.float32, ndim=2)


def _x_f32(x, ws: MoeWorkspace | None):
    """x as f32: x itself, or the values of a bf16 x (exact) in ws.x32 (a new array without a
    workspace: not capturable) for the stages that read an f32 x."""
    if not C.is_bf16_bits(x):
        return x
    n, hidden = x.shape
    if ws is not None and ws.x32 is not None and ws.x32.shape[0] >= n \
            and ws.x32.shape[1] == hidden:
        out = ws.x32[:n]
    else:
        out = C.cupy().empty((n, hidden), dtype=np.float32)
    if n:
        launch(get_function(SOURCE, "moe_x_f32_kernel"), (n,), (256,),
               (x, np.int64(C.row_stride(x, "x")), np.int32(hidden), out), name="moe_x_f32")
    return out


def _tma_takes_x(x, use_mma: bool, tma: "TmaPlan | None") -> bool:
    """Whether the gate_up stage reads x itself (moe_tma_gate_up_kernel takes a bf16 x), else
    a bf16 x goes through _x_f32 first."""
    return not C.is_bf16_bits(x) or (use_mma and tma is not None)


def moe_experts(x, gate_up, down, ids, weights, out, *, workspace: MoeWorkspace | None = None,
                batch_invariant: bool = False, bf16_act: bool = False) -> None:
    """out[n] = sum_k weights[n,k] * down[e] @ (silu(g) * u), [g|u] = gate_up[e] @ x[n]. x f32
    or bf16 bits (uint16): then out is that of the f32 x holding the same values. `bf16_act`
    (bf16 weights): silu(g) * u rounded to bf16 before the down stage (as the prefill path
    stores it), on every path the same values."""
    _check_x(x)
    n, hidden = x.shape
    gu, dn, kind, experts, inter = _expert_weights(gate_up, down, hidden)
    C.contiguous(C.device_array(ids, "ids", dtype=np.int32, ndim=2), "ids")
    top_k = ids.shape[1]
    C.require(ids.shape[0] == n and 1 <= top_k <= 64, "ids", f"expected [{n}, K <= 64]")
    C.device_array(weights, "weights", dtype=np.float32, shape=(n, top_k))
    C.device_array(out, "out", dtype=np.float32, shape=(n, hidden))
    if n == 0:
        return
    if _gemv_path(n, top_k, batch_invariant):
        ws = _workspace(workspace, n, top_k, hidden, inter)
        use_mma, nt = _gemv_plan(x, gu, dn, kind)
        tma = _tma_plan(use_mma, hidden)
        if not _tma_takes_x(x, use_mma, tma):
            x = _x_f32(x, ws)
        _group(ids, nt, ws)
        _experts_gemv(x, gu, dn, kind, experts, inter, use_mma, nt, ids, weights, out, ws, None,
                      tma, _act_mode(bf16_act, kind, use_mma and GEMV_ROWS))
    else:
        _experts_prefill(_x_f32(x, workspace), gu, dn, kind, experts, inter, ids, weights, out,
                         None)


def moe_block(x, logits, top_k: int, gate_up, down, weights_out, ids_out, out, *, shared=None,
              shared_gate=None, shared_down=None, workspace: MoeWorkspace | None = None,
              batch_invariant: bool = False, fused: bool | None = None,
              routed: bool = False, bf16_act: bool = False, norm_fold=None) -> None:
    """`moe_route(logits, top_k, weights_out, ids_out)`, `moe_experts(x, gate_up, down, ids_out,
    weights_out, out)` and, with `shared` f32[N, H] and `shared_gate` f32[N, 1] (rows strided),
    out += sigmoid(shared_gate) * shared, bitwise equal to those ops (and `sigmoid_scale_add`).
    Grouped-GEMV path: the routing and the grouping are one launch and the shared add runs in
    the combine (4 launches instead of 6); where `fused_applies`, 2 launches (`fused`: None
    follows FUSED, False forces the 4-launch path; with MOE_TMA route_group -> TMA gate_up ->
    fused down).

    `routed=True`: weights_out / ids_out already hold `moe_route`'s results for these logits
    and, when `workspace` is given, its group tables hold their grouping (written by
    `moe_route(..., workspace=workspace)`); only the expert stages, the combine and the shared
    add run (the fused path: the gate_up stage then fused down), bitwise the routed=False
    results. Without a workspace the grouping is recomputed into a new one (not capturable).

    `shared_down` (bf16 [H, Is]; only where `shared_down_folds`): `shared` is then the shared
    expert's activation f32[N, Is] and the shared add uses shared_down @ shared[n], computed in
    the fused down launch, bitwise `linear(shared, shared_down)` (linear_tma_kernel's sums).

    x: f32 [N, H] rows strided, or bf16 bits (uint16, 16-byte aligned rows): then every output
    is that of the f32 x holding the same values (the bulk-copy gate_up stage reads the bits;
    the other paths an f32 copy in the workspace). `bf16_act`: as `moe_experts`'s (the default
    paths store act as bf16 bits, which their down stages read with one mma per k16 step).

    `norm_fold` (where `norm_folds`): (residual f32 [N, H], gain f32 [H], xg bf16 bits [N, H],
    parts f32 [N, >= ceil(H / 16)]): the block's output is not stored in `out` but added into
    the residual stream, r = residual + out; xg = bf16(r * gain) and parts[n, g] = the sum of
    r^2 over columns [16 g, 16 g + 16) (moe.cu MoeNormFold: the same bits on every path)."""
    _check_x(x)
    n, hidden = x.shape
    gu, dn, kind, experts, inter = _expert_weights(gate_up, down, hidden)
    C.require(logits.shape[:1] == (n,) and logits.shape[1:] == (experts,), "logits",
              f"expected [{n}, {experts}], got {list(logits.shape)}")
    _check_route(logits, top_k, weights_out, ids_out)
    C.contiguous(ids_out, "ids_out")
    C.device_array(out, "out", dtype=np.float32, shape=(n, hidden))
    if shared_down is not None:
        C.require(shared_down_folds(x, top_k, gate_up, down, shared_down, shared,
                                    batch_invariant=batch_invariant, fused=fused), "shared_down",
                  "the shared down projection folds only into the fused decode path "
                  "(check shared_down_folds first)")
        gated = _gated_shared(shared, shared_gate, n, shared.shape[1])
    else:
        gated = _gated_shared(shared, shared_gate, n, hidden)
    if norm_fold is not None:
        C.require(norm_folds(n, top_k, hidden, batch_invariant=batch_invariant), "norm_fold",
                  "the norm fold runs on the grouped-GEMV decode path (check norm_folds first)")
    nf = _norm_fold_params(norm_fold, n, hidden)
    if n == 0:
        return
    if not _gemv_path(n, top_k, batch_invariant):
        if not routed:
            moe_route(logits, top_k, weights_out, ids_out)
        _experts_prefill(_x_f32(x, workspace), gu, dn, kind, experts, inter, ids_out,
                         weights_out, out, gated)
        return
    grouped = routed and workspace is not None  # moe_route left the GROUP_STRIDE tables in ws
    ws = _workspace(workspace, n, top_k, hidden, inter)
    use_mma, nt = _gemv_plan(x, gu, dn, kind)
    tma = _tma_plan(use_mma, hidden)
    fuse = _takes_fused(n, top_k, experts, use_mma, fused)
    folded = (shared_down, shared) if shared_down is not None else None
    persist = (persist_plan(n, top_k, hidden, inter)
               if fuse and tma is not None and ws.barrier is not None else None)
    if persist is not None or not _tma_takes_x(x, use_mma, tma):
        x = _x_f32(x, ws)
    if routed:
        if not grouped or nt != GROUP_STRIDE:
            _group(ids_out, nt, ws)
    elif fuse and tma is None:
        _block_fused(x, logits, top_k, gu, dn, experts, inter, weights_out, ids_out, out, ws,
                     gated, folded, _act_mode(bf16_act, kind, True), nf=nf)
        return
    else:
        _route_group(logits, top_k, weights_out, ids_out, nt, ws)
    if persist is not None:  # (shared_down_folds checked the fold)
        _experts_persist(x, gu, dn, experts, inter, top_k, weights_out, ids_out, out, ws, gated,
                         persist, folded, _act_mode(bf16_act, kind, False))
        return
    if fuse:  # (route_group ->) TMA or rows gate_up -> moe_fused_down_kernel
        # after the bulk-copy gate_up, moe_tma_down_kernel where it applies (it reads f32 act)
        tma_down = tma is not None and tma_down_applies(
            n, top_k, inter, 0 if folded is None else shared.shape[1])
        act_mode = _act_mode(bf16_act, kind, not tma_down)
        _gate_up_mma(x, gu, experts, inter, top_k, n * top_k, ws, tma, act_mode)
        # moe_tma_gate_up_kernel waits before it triggers the down launch: the shared act,
        # written before it, is complete when that launch starts
        _fused_down(n, top_k, hidden, inter, dn, experts, weights_out, ids_out, out, ws, gated,
                    prewait=True, folded=folded, shared_early=tma is not None,
                    tma_down=tma_down, act_mode=act_mode, nf=nf)
        return
    _experts_gemv(x, gu, dn, kind, experts, inter, use_mma, nt, ids_out, weights_out, out, ws,
                  gated, tma, _act_mode(bf16_act, kind, use_mma and GEMV_ROWS), nf=nf)


def _takes_fused(n: int, top_k: int, experts: int, use_mma: bool, fused: bool | None) -> bool:
    """Whether moe_block's grouped-GEMV call runs the fused launches (`fused`: None follows
    FUSED for decode row counts, False never, True where `fused_applies`)."""
    take = (FUSED and n * top_k <= FUSED_DEFAULT_PAIRS) if fused is None else fused
    return take and fused_applies(n, top_k, experts, use_mma)


def shared_down_folds(x, top_k: int, gate_up, down, shared_down, shared_act, *,
                      batch_invariant: bool = False, fused: bool | None = None) -> bool:
    """Whether `moe_block(x, ..., shared=shared_act, shared_down=shared_down)` takes the shared
    expert's down projection into its fused down launch, bitwise `linear(shared_act,
    shared_down, out, batch_invariant=batch_invariant)`: the call runs the fused decode path
    and that linear runs linear_tma_kernel (`linear.tma_geometry`) with Is <= FOLD_MAX_K;
    shared_act f32 [N, Is] (16-byte aligned rows, as that kernel needs)."""
    if shared_down is None or shared_act is None:
        return False
    n, hidden = x.shape
    if not _gemv_path(n, top_k, batch_invariant):
        return False
    gu, dn, kind, experts, _ = _expert_weights(gate_up, down, hidden)
    use_mma, _ = _gemv_plan(x, gu, dn, kind)
    if not _takes_fused(n, top_k, experts, use_mma, fused):
        return False
    sd, _ = C.weight_array(shared_down, "shared_down")
    if (sd.ndim != 2 or sd.shape[0] != hidden or shared_act.ndim != 2
            or shared_act.shape != (n, sd.shape[1]) or sd.shape[1] > FOLD_MAX_K):
        return False
    geometry = tma_geometry(shared_act, shared_down, batch_invariant=batch_invariant)
    if geometry is None:
        return False
    inter = gu.shape[1] // 2
    persist = (persist_plan(n, top_k, hidden, inter) if _tma_plan(use_mma, hidden) is not None
               else None)
    return persist is None or persist_folds(persist, inter, sd.shape[1], geometry[1])


def persist_plan(n: int, top_k: int, hidden: int, inter: int) -> TmaPlan | None:
    """moe_tma_experts_kernel's ring (PERSIST; None where it does not run): moe_tma_gate_up_kernel's
    (`tma_gate_up_plan`), at most PERSIST_GROUPS pairs, Im % 32 == 0, a down split that fits the
    consumer warps, one block per 16 output columns within one block per SM, and a ring whose
    stages hold the PERSIST_GROUPS down tiles (`persist_down_tiles_per_stage` side by side) and
    then the act rows of PERSIST_GROUPS pairs (Im + 4 floats apart) in one more stage."""
    if not PERSIST or n * top_k > PERSIST_GROUPS or inter % 32 or hidden % 16:
        return None
    if -(-hidden // 16) > current_device().sm_count:
        return None
    plan = tma_gate_up_plan(hidden)
    if plan is None or mma_splits(inter, MMA_SPLITS) > plan.splits:
        return None
    gps = persist_down_tiles_per_stage(plan, inter)
    if gps < 1 or PERSIST_GROUPS * (inter + 4) * 4 > 16 * tma_pitch(plan.sk):
        return None
    return plan if -(-PERSIST_GROUPS // gps) + 1 <= plan.stages else None


def persist_down_tiles_per_stage(plan: TmaPlan, inter: int) -> int:
    """moe.cu moe_tma_experts_kernel's gps: 16-row down tiles (rows of Im bf16) per ring stage,
    side by side in the stage's rows of tma_pitch(sk) bytes (at most PERSIST_GROUPS)."""
    return min(PERSIST_GROUPS, tma_pitch(plan.sk) // (2 * inter))


def persist_folds(plan: TmaPlan, inter: int, shared_k: int, shared_cons: int) -> bool:
    """Whether moe_tma_experts_kernel (ring `plan`) also computes a folded shared down
    projection of K = shared_k whose linear_tma_kernel geometry has shared_cons consumer warps:
    its 16-row tile fits one more ring stage (before the down tiles and act) and the block's
    consumer warps take two of those warps' partials each."""
    gps = persist_down_tiles_per_stage(plan, inter)
    return (2 * shared_k <= tma_pitch(plan.sk) and shared_cons <= min(2 * plan.splits, 16)
            and -(-PERSIST_GROUPS // gps) + 2 <= plan.stages)


def _experts_persist(x, gu, dn, experts, inter, top_k, weights_out, ids_out, out, ws, gated,
                     plan: TmaPlan, folded=None, act_mode: int = ACT_F32) -> None:
    """moe_tma_experts_kernel over the group tables in `ws`: act, then out (the experts' sum
    and the gated shared add), bitwise _gate_up_mma (bulk-copy) + _fused_down (`folded` as
    there, where `persist_folds`)."""
    n, hidden = x.shape
    pairs = n * top_k
    C.require(act_mode != ACT_BF16_BITS, "act_mode", "moe_tma_experts_kernel reads an f32 act")
    gu_f = _stage_fields(gu, hidden, gu.shape[1] * hidden, x, C.row_stride(x, "x"), 0, ws.act,
                         inter, hidden, splits=plan.splits, top_k=top_k, up_offset=inter,
                         experts=experts, ws=ws, out_mode=act_mode)
    dn_f = _down_fields(dn, hidden, inter, top_k, experts, ws)
    sd = None if folded is None else _shared_down_fields(folded, hidden)
    params = C.pack(_EXPERTS, **_prefixed("gu_", gu_f), **_prefixed("dn_", dn_f),
                    **_prefixed("sd_", sd), **_combine_fields(weights_out, ids_out, gated, out),
                    barrier=C.ptr(ws.barrier), n_rows=n, sk=plan.sk, sw=plan.stage_warps,
                    stages=plan.stages, pairs=MOE_TMA_PAIRS)
    xr = tma_x_regs_ok(hidden, plan.splits, 0, pairs, top_k) and TMA_X_REGS
    fn = get_function(SOURCE, f"moe_tma_experts_kernel<{int(xr)}>")
    if fn.max_dynamic_shared_size_bytes < plan.smem:
        fn.max_dynamic_shared_size_bytes = plan.smem
    items = pairs * ((inter + 7) // 8)
    sms = current_device().sm_count
    launch(fn, (min(sms, max(items, -(-hidden // 16))),), (32 * (plan.splits + 1),), (params,),
           shared_mem=plan.smem, name="moe_tma_experts", pdl=True)


def fused_applies(n: int, top_k: int, experts: int, use_mma: bool) -> bool:
    """Whether moe_block's grouped-GEMV call can take the two fused launches: decode row
    counts, at most FUSED_MAX_PAIRS pairs, the tensor-core expert kernels, E <= 32 FUSED_J[-1]."""
    return (use_mma and n <= FUSED_MAX_ROWS and n * top_k <= FUSED_MAX_PAIRS
            and _route_j(experts, FUSED_J) is not None)


def fused_down_smem(splits: int, warps: int = FUSED_DOWN_WARPS, shared_k: int = 0,
                    shared_cons: int = 0) -> int:
    """Dynamic shared memory of moe_fused_down_kernel: the warps' staging buffers, the teams'
    partial tiles and the alignment slack (72.25 KiB at 16 warps, 2 splits); with a folded
    shared down of K = shared_k (moe.cu moe_shared_*_pitch), its staged tile, FUSED_MAX_ROWS x
    rows and shared_cons partial tiles (+ 41 KiB at K = 512, 16 consumers)."""
    slots = min(FUSED_DOWN_SLOTS, warps // splits)
    smem = warps * MMA_ROWS_WARP_SMEM + slots * splits * 16 * 8 * 4 + MMA_ROWS_ALIGN
    if shared_k:
        smem += (16 * (2 * shared_k + 16) + FUSED_MAX_ROWS * (shared_k + 8) * 4
                 + shared_cons * 16 * 8 * 4)
    return smem


def _block_fused(x, logits, top_k, gu, dn, experts, inter, weights_out, ids_out, out, ws,
                 gated, folded=None, act_mode: int = ACT_F32, nf=_NO_NORM_FOLD) -> None:
    """moe_block's decode path in two launches (moe.cu moe_fused_gate_up_kernel and
    moe_fused_down_kernel): same K splits, tiles and groups as `_experts_gemv` with the
    tensor-core rows kernels, so bitwise its results."""
    n, hidden = x.shape
    pairs = n * top_k
    x_rs = C.row_stride(x, "x")
    gu_splits = mma_splits(hidden, MMA_SPLITS)
    warps = max(gu_splits, -(-pairs // 32))  # moe_group_block: a thread per pair
    params = C.pack(_GEMV, **_stage_fields(gu, hidden, gu.shape[1] * hidden, x, x_rs, 0,
                                           _act_out(ws, act_mode), inter, hidden,
                                           splits=gu_splits, top_k=top_k, up_offset=inter,
                                           experts=experts, ws=ws, out_mode=act_mode))
    launch(get_function(SOURCE, f"moe_fused_gate_up_kernel<{_route_j(experts, FUSED_J)}>"),
           ((inter + 7) // 8, pairs), (32 * warps,),
           (params, logits, np.int64(C.row_stride(logits, "logits")), np.int32(n), weights_out,
            np.int64(C.row_stride(weights_out, "weights_out")), ids_out,
            np.int64(C.row_stride(ids_out, "ids_out"))),
           # moe.cu: one MmaPartials<8>, then the warps' staging buffers (checked in-kernel)
           shared_mem=mma_rows_smem(warps), name="moe_fused_gate_up", pdl=True)
    _fused_down(n, top_k, hidden, inter, dn, experts, weights_out, ids_out, out, ws, gated,
                folded=folded, act_mode=act_mode, nf=nf)


def tma_down_smem(inter: int, shared_k: int = 0) -> int:
    """Dynamic shared memory of moe_tma_down_kernel (moe.cu): its mbarriers, the teams' partial
    tiles, PERSIST_GROUPS expert tiles of 16 rows of Im bf16, the folded shared tile (16 rows
    of shared_k bf16) and PERSIST_GROUPS act rows of Im + 4 floats (176.25 KiB at the
    35B-A3B shape with Is = 512)."""
    return (TMA_DOWN_HEAD + TMA_DOWN_TEAMS * 8 * 16 * 8 * 4 + PERSIST_GROUPS * 16 * 2 * inter
            + 16 * 2 * shared_k + PERSIST_GROUPS * (inter + 4) * 4)


def tma_down_applies(n: int, top_k: int, inter: int, shared_k: int = 0) -> bool:
    """Whether the fused down stage after the bulk-copy gate_up runs moe_tma_down_kernel
    (TMA_DOWN): at most PERSIST_GROUPS pairs, Im % 32 == 0, and its shared memory (with a
    folded shared down of K = shared_k, 0: none) within the opt-in limit."""
    return (TMA_DOWN and n * top_k <= PERSIST_GROUPS and inter % 32 == 0
            and tma_down_smem(inter, shared_k) + TMA_DOWN_STATIC <= TMA_SMEM_LIMIT)


def _prefixed(prefix: str, fields: dict | None) -> dict:
    """A nested record's fields under its prefix in a packed launch record (None: none)."""
    return {} if fields is None else {prefix + k: v for k, v in fields.items()}


def _combine_fields(weights_out, ids_out, gated, out) -> dict:
    """moe.cu MoeCombine's fields (c_*): the routing, the gated shared operands (`gated`, as
    moe_combine_kernel's, or None) and out."""
    shared, shared_rs, gate, gate_rs = gated if gated is not None else (None, 0, None, 0)
    return _prefixed("c_", dict(
        w=C.ptr(weights_out), ids=C.ptr(ids_out), shared=0 if shared is None else C.ptr(shared),
        gate=0 if gate is None else C.ptr(gate), out=C.ptr(out),
        w_rs=C.row_stride(weights_out, "weights_out"), shared_rs=int(shared_rs),
        gate_rs=int(gate_rs), out_rs=C.row_stride(out, "out")))


def _tma_down(n, top_k, hidden, inter, dn, experts, weights_out, ids_out, out, ws, gated,
              sd: dict | None) -> None:
    """moe_tma_down_kernel: _fused_down's results (see there; launched only where every input
    but act is complete when the launch starts). `sd`: the folded shared down's MoeSharedDown
    fields (`_shared_down_fields`), or None."""
    params = C.pack(_TMA_DOWN,
                    **_prefixed("dn_", _down_fields(dn, hidden, inter, top_k, experts, ws)),
                    **_prefixed("sd_", sd), **_combine_fields(weights_out, ids_out, gated, out),
                    n_rows=n)
    smem = tma_down_smem(inter, 0 if sd is None else sd["k"])
    fn = get_function(SOURCE, "moe_tma_down_kernel")
    if fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    launch(fn, ((hidden + 15) // 16,), (32 * TMA_DOWN_WARPS,), (params,), shared_mem=smem,
           name="moe_tma_down", pdl=True)


def _fused_down(n, top_k, hidden, inter, dn, experts, weights_out, ids_out, out, ws,
                gated, prewait: bool = False, folded=None, shared_early: bool = False,
                tma_down: bool = False, act_mode: int = ACT_F32, nf=_NO_NORM_FOLD) -> None:
    """moe_fused_down_kernel over the routing (weights_out, ids_out), the group tables and act
    in `ws` (written by moe_fused_gate_up_kernel, or by moe_route_group_kernel and the gate_up
    stage). `prewait`: the group tables were written before the gate_up stage, so the kernel's
    L2 prefetch of its down rows before pdl_wait (DOWN_PREWAIT) finds them complete. `folded`:
    (shared_down bf16 [H, Is], shared act f32 [N, Is]) where `shared_down_folds`: the launch's
    shared team computes linear(act, shared_down) (`gated` then carries the act in place of the
    shared output; the kernel does not read it there); before its PDL wait where
    `shared_early` (the kernel before this launch waited before letting it start, so act is
    complete). `tma_down` (the caller checked `shared_early` and `tma_down_applies`):
    moe_tma_down_kernel instead (the same bits; everything but act read before its PDL wait).
    `act_mode`: how the gate_up stage stored act (ACT_BF16_BITS: moe_fused_down_kernel<1> reads
    the bits; not with the moe_tma_down_kernel, which reads f32). `nf`: the packed MoeNormFold
    (`_norm_fold_params`; the zero record: none)."""
    sd = None if folded is None else _shared_down_fields(folded, hidden)
    if tma_down:
        C.require(nf is _NO_NORM_FOLD, "norm_fold", "moe_tma_down_kernel has no norm fold")
        C.require(act_mode != ACT_BF16_BITS, "act_mode", "moe_tma_down_kernel reads an f32 act")
        _tma_down(n, top_k, hidden, inter, dn, experts, weights_out, ids_out, out, ws, gated, sd)
        return
    fields = _down_fields(dn, hidden, inter, top_k, experts, ws)
    dn_splits = fields["splits"]
    params = C.pack(_GEMV, **fields)
    team, sd_params, smem = 0, _NO_FOLD, fused_down_smem(dn_splits)
    if sd is not None:
        team = FUSED_DOWN_SHARED_WARPS
        sd_params = C.pack(_SHARED_DOWN, **sd)
        smem = fused_down_smem(dn_splits, shared_k=sd["k"], shared_cons=sd["cons"])
    flags = (DOWN_PREFETCH if prewait and DOWN_PREWAIT else 0) | (
        DOWN_SHARED_EARLY if shared_early and folded is not None and SHARED_EARLY else 0)
    fn = get_function(SOURCE, f"moe_fused_down_kernel<{int(act_mode == ACT_BF16_BITS)}, "
                              f"{int(nf is not _NO_NORM_FOLD)}>")
    if smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem:
        fn.max_dynamic_shared_size_bytes = smem
    shared_args = gated if gated is not None else (None, np.int64(0), None, np.int64(0))
    launch(fn, ((hidden + 15) // 16,), (32 * (FUSED_DOWN_WARPS + team),),
           (params, sd_params, weights_out, np.int64(C.row_stride(weights_out, "weights_out")),
            ids_out, np.int32(n)) + shared_args
           + (out, np.int64(C.row_stride(out, "out")), np.int32(flags), nf),
           shared_mem=smem, name="moe_fused_down", pdl=True)


def _shared_down_fields(folded, hidden: int) -> dict:
    """MoeSharedDown's fields for `folded` = (shared_down bf16 [H, Is], shared act f32 [N, Is]):
    linear_tma_kernel's geometry for linear(act, shared_down) (`shared_down_folds` holds)."""
    weight, act = folded
    sk, cons = tma_geometry(act, weight)
    sd, _ = C.weight_array(weight, "shared_down")
    return dict(w=C.ptr(sd), x=C.ptr(act), w_rs=C.row_stride(sd, "shared_down"),
                x_rs=C.row_stride(act, "shared"), m=hidden, k=sd.shape[1], sk=sk, cons=cons)


def _gated_shared(shared, gate, n: int, hidden: int) -> tuple | None:
    """moe_combine_kernel's (shared, shared_rs, gate, gate_rs) arguments, or None."""
    if shared is None and gate is None:
        return None
    C.require(shared is not None and gate is not None, "shared",
              "shared and shared_gate go together")
    C.device_array(shared, "shared", dtype=np.float32, shape=(n, hidden))
    C.device_array(gate, "shared_gate", dtype=np.float32, shape=(n, 1))
    gate_rs = C.estrides(gate)[0] if n > 1 else 1
    return shared, np.int64(C.row_stride(shared, "shared")), gate, np.int64(gate_rs)


def _gemv_path(n: int, top_k: int, batch_invariant: bool) -> bool:
    """The grouped-GEMV path (else the eager cuBLAS prefill, which a capture cannot take)."""
    capturing = C.cupy().cuda.get_current_stream().is_capturing()
    pairs = n * top_k
    if (n <= GEMV_MAX_ROWS or capturing or batch_invariant) and pairs <= MAX_PAIRS:
        return True
    C.require(not capturing, "x", f"{pairs} pairs > {MAX_PAIRS} cannot run inside a graph")
    return False


def _workspace(ws: MoeWorkspace | None, n: int, top_k: int, hidden: int,
               inter: int) -> MoeWorkspace:
    if ws is None:
        ws = MoeWorkspace.allocate(n, top_k, hidden, inter)
    C.require(ws.fits(n * top_k, hidden, inter), "workspace", f"too small for {n * top_k} pairs")
    return ws


def _gemv_aligned(w, kind, w_rs, w_es, x, x_rs, k) -> bool:
    vec = 8 if kind is C.WKind.BF16 else 4
    return (k % 8 == 0 and C.aligned(w) and w_rs % vec == 0 and w_es % vec == 0
            and C.aligned(x) and x_rs % 4 == 0)


def _gemv_plan(x, gu, dn, kind) -> tuple[bool, int]:
    """(tensor-core kernels?, pairs per group NT) of the grouped-GEMV path."""
    x_rs = C.row_stride(x, "x")
    use_mma = kind is C.WKind.BF16 and all(
        C.aligned(w) and w.shape[2] % 8 == 0 for w in (gu, dn)) and C.aligned(x) and x_rs % 4 == 0
    return use_mma, GROUP_STRIDE if use_mma else rows_tile(min(x.shape[0], GROUP_STRIDE))


def _group(ids, nt: int, ws: MoeWorkspace) -> None:
    launch(get_function(SOURCE, "moe_group_kernel"), (1,), (1024,),
           (ids, np.int32(ids.size), np.int32(nt), ws.group_expert, ws.group_pairs,
            ws.num_groups), name="moe_group", pdl=True)


def _experts_gemv(x, gu, dn, kind, experts, inter, use_mma, nt, ids, weights, out, ws,
                  gated, tma: TmaPlan | None = None, act_mode: int = ACT_F32,
                  nf=_NO_NORM_FOLD) -> None:
    """The two expert stages and the combine over the groups already in `ws` (`tma`: the
    gate_up stage runs moe_tma_gate_up_kernel with that plan; `act_mode`: how it stores act,
    ACT_BF16_BITS only where the down stage runs moe_mma_rows_kernel)."""
    hidden = x.shape[1]
    top_k = ids.shape[1]
    pairs = ids.size
    x_rs = C.row_stride(x, "x")
    act = _act_out(ws, act_mode)
    stages = (  # (weights, x, x_rs, x_by_pair, out, m, k, swiglu)
        (gu, x, x_rs, 0, act, inter, hidden, 1),
        (dn, act, inter, 1, ws.y, hidden, inter, 0))
    for w, xs, xs_rs, by_pair, dst, m, k, swiglu in stages:
        w_rs, w_es = w.shape[2], w.shape[1] * w.shape[2]
        if use_mma and swiglu:
            _gate_up_mma(x, gu, experts, inter, top_k, pairs, ws, tma, act_mode)
            continue
        if use_mma:
            launch_mma(w, w_rs, w_es, xs, xs_rs, by_pair, dst, m, k, swiglu=bool(swiglu),
                       top_k=top_k, up_offset=inter, experts=experts, ws=ws, pairs=pairs)
            continue
        r = _swiglu_rows(nt) if swiglu else ROWS_PER_BLOCK[nt]
        aligned = int(_gemv_aligned(w, kind, w_rs, w_es, xs, xs_rs, k))
        splits = k_splits(k)
        params = C.pack(_GEMV, w=C.ptr(w), x=C.ptr(xs), out=C.ptr(dst),
                        group_expert=C.ptr(ws.group_expert), group_pairs=C.ptr(ws.group_pairs),
                        num_groups=C.ptr(ws.num_groups), w_es=w_es, w_rs=w_rs, x_rs=xs_rs,
                        out_rs=dst.shape[1], m=m, k=k, splits=splits, top_k=top_k,
                        up_offset=inter, x_by_pair=by_pair, experts=experts,
                        out_mode=act_mode if swiglu else ACT_F32)
        fn = get_function(SOURCE, f"moe_gemv_kernel<{kind.ctype}, {nt}, {r}, {aligned}, {swiglu}>")
        launch(fn, ((m + r - 1) // r, pairs), (32 * splits,), (params,), name="moe_gemv",
               pdl=True)
    _combine(ws.y, hidden, None, ids, weights, out, gated, nf)


def _tma_plan(use_mma: bool, hidden: int) -> TmaPlan | None:
    """The plan of moe_tma_gate_up_kernel when MOE_TMA is on and the gate_up stage can take it
    (tensor-core experts, K = hidden % 16 == 0, sm_90, a ring that fits), else None."""
    if not (MOE_TMA and use_mma and tma_ok(hidden)):
        return None
    return tma_gate_up_plan(hidden)


def _gate_up_mma(x, gu, experts: int, inter: int, top_k: int, pairs: int, ws: MoeWorkspace,
                 tma: TmaPlan | None, act_mode: int = ACT_F32) -> None:
    """The tensor-core gate_up + SwiGLU stage over the groups in `ws` into ws.act:
    moe_tma_gate_up_kernel with plan `tma`, else launch_mma (moe_mma_rows_kernel<1>; bitwise
    the same)."""
    if tma is not None:
        _experts_gate_up_tma(x, gu, experts, inter, top_k, pairs, ws, tma, act_mode)
        return
    hidden = x.shape[1]
    launch_mma(gu, hidden, gu.shape[1] * hidden, x, C.row_stride(x, "x"), 0,
               _act_out(ws, act_mode), inter, hidden, swiglu=True, top_k=top_k, up_offset=inter,
               experts=experts, ws=ws, pairs=pairs, act_mode=act_mode)


def _experts_gate_up_tma(x, gu, experts: int, inter: int, top_k: int, pairs: int,
                         ws: MoeWorkspace, plan: TmaPlan, act_mode: int = ACT_F32) -> None:
    """ws.act[pair, :inter] = silu(gate) * up of every group in `ws` (x rows: the pairs' token
    rows) by moe_tma_gate_up_kernel."""
    hidden = x.shape[1]
    launch_tma_gate_up(gu, hidden, gu.shape[1] * hidden, x, C.row_stride(x, "x"), 0,
                       _act_out(ws, act_mode), inter, hidden, top_k=top_k, experts=experts,
                       ws=ws, pairs=pairs, plan=plan, act_mode=act_mode)


def launch_tma_gate_up(w, w_rs: int, w_es: int, x, x_rs: int, x_by_pair: int, out, m: int,
                       k: int, *, top_k: int, experts: int, ws: MoeWorkspace, pairs: int,
                       plan: TmaPlan, item_pairs: bool | None = None,
                       x_regs: bool | None = None, act_mode: int = ACT_F32) -> None:
    """The gate_up + SwiGLU stage over the groups in `ws` by moe_tma_gate_up_kernel (sm_90, bf16
    w [E, 2m, K] with strides w_es, w_rs, 16-byte aligned rows, K % 16 == 0; x rows 16-byte
    aligned): out[pair, :m] (row stride out.shape[1]), bitwise moe_mma_rows_kernel<1> (launch_mma
    with swiglu=True, up_offset=m): the same K split, fragments and orders. One persistent block
    per SM, at most one per work item of the worst case (pairs groups x ceil(m / 8) row
    tiles). `item_pairs`: consumers take two items at a time (None: MOE_TMA_PAIRS; the same
    bits either way). `x_regs`: the consumers hold their x values in registers
    (moe_tma_gate_up_kernel<1>), possible where every pair reads x row 0 (x_by_pair = 0 and
    pairs <= top_k) and no warp's K range is longer than TMA_XR_STEPS 32-k steps; None takes it
    wherever possible when TMA_X_REGS is set (the same bits either way). x f32, or bf16 bits
    (uint16, rows x_rs elements apart, x_rs % 8 == 0): then out is that of the f32 x holding the
    same values (moe_tma_gate_up_kernel<*, 1> skips the lo products, all zero). `act_mode`: how
    out is stored (ACT_*; out uint16 for ACT_BF16_BITS)."""
    C.require(plan.splits == mma_splits(k, MMA_SPLITS), "plan", f"not a plan for K = {k}")
    C.require(not C.is_bf16_bits(x) or x_rs % 8 == 0, "x", "bf16 rows must be 16-byte aligned")
    xr_ok = tma_x_regs_ok(k, plan.splits, x_by_pair, pairs, top_k)
    C.require(not x_regs or xr_ok, "x_regs", "needs one x row and a short K range per warp")
    xr = (xr_ok and TMA_X_REGS) if x_regs is None else x_regs
    params = C.pack(_GEMV, **_stage_fields(w, w_rs, w_es, x, x_rs, x_by_pair, out, m, k,
                                           splits=plan.splits, top_k=top_k, up_offset=m,
                                           experts=experts, ws=ws, out_mode=act_mode))
    source = SOURCE_XPIPE if TMA_XPIPE and not xr else SOURCE
    fn = get_function(source, f"moe_tma_gate_up_kernel<{int(xr)}, {int(C.is_bf16_bits(x))}>")
    if fn.max_dynamic_shared_size_bytes < plan.smem:
        fn.max_dynamic_shared_size_bytes = plan.smem
    items = pairs * ((m + 7) // 8)
    launch(fn, (max(1, min(current_device().sm_count, items)),), (32 * (plan.splits + 1),),
           (params, np.int32(plan.sk), np.int32(plan.stage_warps), np.int32(plan.stages),
            np.int32(MOE_TMA_PAIRS if item_pairs is None else item_pairs)),
           shared_mem=plan.smem, name="moe_tma_gate_up", pdl=True)


def tma_x_regs_ok(k: int, splits: int, x_by_pair: int, pairs: int, top_k: int) -> bool:
    """Whether moe_tma_gate_up_kernel<1> (x in registers) can run: one x row for every pair and
    at most TMA_XR_STEPS 32-k steps in each consumer warp's K range (mma_warp_k_range)."""
    steps = -(-k // 32)  # 32-k steps of K
    per_warp = -(-steps // splits)
    return x_by_pair == 0 and pairs <= top_k and per_warp <= TMA_XR_STEPS


def mma_rows_smem(splits: int) -> int:
    """Dynamic shared memory of moe_mma_rows_kernel with `splits` warps (36.25 KiB at 8): the
    staging buffers, one MmaPartials<8> and the alignment slack."""
    return splits * MMA_ROWS_WARP_SMEM + MMA_SPLITS * 16 * 8 * 4 + MMA_ROWS_ALIGN


assert mma_rows_smem(MMA_SPLITS) <= 48 * 1024  # no dynamic shared memory opt-in needed


def launch_mma(w, w_rs: int, w_es: int, x, x_rs: int, x_by_pair: int, out, m: int, k: int, *,
               swiglu: bool, top_k: int, up_offset: int, experts: int, ws: MoeWorkspace,
               pairs: int, rows: bool | None = None, act_mode: int = ACT_F32) -> None:
    """One tensor-core expert stage over the groups in `ws` (bf16 w [E, rows, K] with strides
    w_es, w_rs, 16-byte aligned rows; x rows 16-byte aligned): out[pair, :m] (rows of out are
    contiguous, stride out.shape[1]). `rows`: moe_mma_rows_kernel (True) or moe_mma_kernel
    (False); None: GEMV_ROWS. Both take the same K split (mma_splits(k, 8): K only).
    `act_mode` (swiglu): how out is stored (ACT_*). A down stage's x may be an act stored as
    bf16 bits (uint16; moe_mma_rows_kernel<0, 1>: the results of the f32 x of those values)."""
    rows = GEMV_ROWS if rows is None else rows
    splits = mma_splits(k, MMA_SPLITS)
    xb = C.is_bf16_bits(x)
    C.require(not xb or (rows and not swiglu), "x", "bf16 bits are read by the down stage's "
              "moe_mma_rows_kernel only")
    C.require(swiglu or act_mode == ACT_F32, "act_mode", "a down stage stores f32")
    params = C.pack(_GEMV, **_stage_fields(w, w_rs, w_es, x, x_rs, x_by_pair, out, m, k,
                                           splits=splits, top_k=top_k, up_offset=up_offset,
                                           experts=experts, ws=ws, out_mode=act_mode))
    tile = 8 if swiglu else 16
    grid = ((m + tile - 1) // tile, pairs)
    if rows:
        launch(get_function(SOURCE, f"moe_mma_rows_kernel<{int(swiglu)}, {int(xb)}>"), grid,
               (32 * splits,), (params,), shared_mem=mma_rows_smem(splits), name="moe_mma_rows",
               pdl=True)
    else:
        launch(get_function(SOURCE, f"moe_mma_kernel<{int(swiglu)}>"), grid, (32 * splits,),
               (params,), name="moe_mma", pdl=True)


def _combine(y, y_rs, pair_row, ids, weights, out, gated, nf=_NO_NORM_FOLD) -> None:
    n, hidden = out.shape
    shared_args = gated if gated is not None else (None, np.int64(0), None, np.int64(0))
    launch(get_function(SOURCE, f"moe_combine_kernel<{int(nf is not _NO_NORM_FOLD)}>"),
           (n, (hidden + 255) // 256), (256,),
           (y, np.int64(y_rs), pair_row, ids, weights,
            np.int64(C.row_stride(weights, "weights")), np.int32(ids.shape[1]),
            np.int32(hidden)) + shared_args + (out, np.int64(C.row_stride(out, "out")), nf),
           name="moe_combine", pdl=True)


def _experts_prefill(x, gu, dn, kind, experts, inter, ids, weights, out, gated) -> None:
    cp = C.cupy()
    n, hidden = x.shape
    top_k = ids.shape[1]
    flat = cp.asnumpy(ids).reshape(-1)  # synchronises: prefill only
    C.require(bool(flat.size == 0 or (flat.min() >= 0 and flat.max() < experts)), "ids",
              f"expert id outside [0, {experts})")
    counts = np.bincount(flat, minlength=experts)
    max_c = int(counts.max())
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    order = np.argsort(flat, kind="stable")
    slot = np.empty_like(order)
    slot[order] = np.arange(order.size) - starts[flat[order]]
    pair_row = cp.asarray((flat * max_c + slot).astype(np.int32))
    store = np.uint16 if kind is C.WKind.BF16 else np.float32
    dtype = _cublas.R_16BF if kind is C.WKind.BF16 else _cublas.R_32F
    rows = experts * max_c
    xpad = cp.zeros((rows, hidden), dtype=store)
    launch(get_function(SOURCE, f"moe_gather_kernel<{kind.ctype}>"), (n * top_k,), (256,),
           (x, np.int64(C.row_stride(x, "x")), np.int32(hidden), np.int32(top_k), pair_row, xpad),
           name="moe_gather")
    gu_out = cp.empty((rows, 2 * inter), dtype=np.float32)
    act = cp.empty((rows, inter), dtype=store)
    y = cp.empty((rows, hidden), dtype=np.float32)
    _cublas.gemm_strided_batched_ex(
        _cublas.OP_T, _cublas.OP_N, 2 * inter, max_c, hidden, C.ptr(gu), dtype, hidden,
        2 * inter * hidden, C.ptr(xpad), dtype, hidden, max_c * hidden, C.ptr(gu_out),
        2 * inter, max_c * 2 * inter, experts)
    total = rows * inter
    launch(get_function(SOURCE, f"moe_swiglu_kernel<{kind.ctype}>"),
           (min(65535, (total + 255) // 256),), (256,),
           (gu_out, np.int64(rows), np.int32(inter), act), name="moe_swiglu")
    _cublas.gemm_strided_batched_ex(
        _cublas.OP_T, _cublas.OP_N, hidden, max_c, inter, C.ptr(dn), dtype, inter, hidden * inter,
        C.ptr(act), dtype, inter, max_c * inter, C.ptr(y), hidden, max_c * hidden, experts)
    _combine(y, hidden, pair_row, ids, weights, out, gated)
