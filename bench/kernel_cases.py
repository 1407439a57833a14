"""The timed cases of `ninfer-bench kernels`, one function per op family.

Each case builds random inputs on the device at the real Qwen3.5 shape (values do not change a
step's cost; never zeros), rotates input sets so they exceed the L2 cache, times our kernel with
CUDA events and, where one exists, a peer on the same problem. It returns `Measure`s whose
bytes/flops are the minimum traffic/work (each input read once, each output written once).
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from bench import peers
from bench.harness import BenchContext, Measure, bf16_random, f32_random
from ninfer.core.dtypes import DType
from ninfer.core.tensor import Weight

PAGE = 16


def _peer(measure: Measure, ctx: BenchContext, make) -> Measure:
    """Time a peer built by make() -> (fn, label); record why when it is unavailable."""
    try:
        fn, label = make()
        measure.peer, measure.peer_ms = label, ctx.time(fn)
    except peers.PeerUnavailable as exc:
        measure.note = (measure.note + "; " if measure.note else "") + f"peer: {exc}"
    except Exception as exc:  # a failing peer never fails our measurement
        measure.note = (measure.note + "; " if measure.note else "") + \
            f"peer failed: {type(exc).__name__}: {exc}"[:200]
    return measure


def linear_decode(ctx: BenchContext, cp) -> list[Measure]:
    """The decode GEMVs at N = 1 and 8 with an f32 x and, where the bf16-x GEMV takes the weight
    (NINFER_GEMV_BF16_X, the decode default), a bf16 x: eager launches (host launch cost
    included, the cuBLAS peer beside them), then the same calls back to back in a CUDA graph
    (`BenchContext.time_graph`: the device time per GEMV as in the decode graph, PDL overlap
    included; weights rotated beyond L2)."""
    from ninfer.kernels_cuda.linear import gemv_takes_bf16, linear

    out = []
    for name, m, k in ctx.shape.decode_gemvs():
        copies = ctx.copies(m * k * 2)
        ws = [Weight(bf16_random(cp, (m, k)), DType.BFLOAT16) for _ in range(copies)]
        for n in (1, 8):
            xb = bf16_random(cp, (n, k), 1.0)
            y = cp.empty((n, m), dtype=cp.float32)
            xs = [("", f32_random(cp, (n, k)), 4)]
            if gemv_takes_bf16(ws[0]):
                xs.append((" bf16 x", xb, 2))
            for label, x, x_bytes in xs:
                call = lambda i, x=x: linear(x, ws[i % copies], y)  # noqa: E731
                variant, nbytes = f"{name} [{m}x{k}] N={n}{label}", m * k * 2 + n * k * x_bytes
                meas = Measure("linear", variant, ctx.time(call), bytes=nbytes + n * m * 4)
                out.append(_peer(meas, ctx, lambda: (
                    peers.cublas_gemm(cp, m, n, k, ws[0].data, xb, y), "cuBLAS bf16 gemmEx")))
                out.append(_graph_measure(ctx, "linear", variant + " graph", call,
                                          nbytes + n * m * 4))
    return out


def _graph_measure(ctx: BenchContext, op: str, variant: str, call, nbytes: float) -> Measure:
    """`call` timed back to back in a CUDA graph (BenchContext.time_graph); a failure to capture
    is recorded in the row's note instead of failing the op's other rows."""
    try:
        ms, reps = ctx.time_graph(call)
    except Exception as exc:  # noqa: BLE001 - reported, never fatal to the benchmark
        return Measure(op, variant, float("nan"),
                       note=f"graph failed: {type(exc).__name__}: {exc}"[:200])
    return Measure(op, variant, ms, bytes=nbytes, note=f"graph of {reps} launches")


def linear_prefill(ctx: BenchContext, cp) -> list[Measure]:
    from ninfer.kernels_cuda.linear import linear

    name, m, k = max(ctx.shape.decode_gemvs()[:-1], key=lambda t: t[1] * t[2])
    n = 8192
    w = Weight(bf16_random(cp, (m, k)), DType.BFLOAT16)
    x = f32_random(cp, (n, k))
    y = cp.empty((n, m), dtype=cp.float32)
    ws = cp.empty(n * k, dtype=cp.uint16)
    ms = ctx.time(lambda i: linear(x, w, y, workspace=ws))
    meas = Measure("linear_prefill", f"{name} [{m}x{k}] N={n}", ms, flops=2.0 * n * m * k,
                   note="includes the f32->bf16 copy of x")
    xb = bf16_random(cp, (n, k), 1.0)
    return [_peer(meas, ctx, lambda: (peers.cublas_gemm(cp, m, n, k, w.data, xb, y),
                                      "cuBLAS bf16 gemmEx"))]


ATTN_DECODE_CASES = ((1, 1024), (8, 1024), (1, 8192), (8, 8192), (1, 32768), (8, 32768))


def attn_decode_cases() -> tuple[tuple[int, int], ...]:
    """(batch, keys per row) of the decode attention rows: ATTN_DECODE_CASES, or the
    NINFER_BENCH_ATTN_CASES list "B:KEYS ..." (e.g. "1:64 1:1025" for the chunk / merge-level
    boundaries)."""
    spec = os.environ.get("NINFER_BENCH_ATTN_CASES", "").split()
    if not spec:
        return ATTN_DECODE_CASES
    try:
        cases = tuple((int(b), int(k)) for b, k in (item.split(":") for item in spec))
    except ValueError:
        raise SystemExit(f"NINFER_BENCH_ATTN_CASES: want 'B:KEYS ...', got {spec!r}") from None
    if any(b < 1 or k < 1 for b, k in cases):
        raise SystemExit(f"NINFER_BENCH_ATTN_CASES: B and KEYS must be >= 1, got {spec!r}")
    return cases


def paged_attention_bytes(lengths, q_heads: int, kv_heads: int, head_dim: int,
                          kv_itemsize: int) -> int:
    """Minimum traffic of a decode paged_attention: the K and V rows of every attended key
    (row n attends lengths[n] keys of each KV head) plus q read and out written (f32)."""
    keys = sum(int(n) for n in lengths)
    return keys * kv_heads * head_dim * kv_itemsize * 2 + 2 * len(lengths) * q_heads * head_dim * 4


@dataclasses.dataclass(frozen=True)
class DecodeAttention:
    """Device inputs of decode paged_attention at a model shape: `sets` copies of the K / V pages
    of `batch` sequences of `context` keys each (set c: block-table rows c * batch ..), every row
    at its last position; q (f32, random), out and a workspace. `call(i)` runs set i % sets."""

    kp: object
    vp: object
    block_tables: object
    seqs: list
    pos: object
    q: object
    out: object
    workspace: object
    scale: float
    bytes: int  # paged_attention_bytes of one call

    @classmethod
    def build(cls, cp, shape, batch: int, context: int, sets: int) -> DecodeAttention:
        from ninfer.kernels_cuda import attention as katt

        pages_per_seq = -(-context // PAGE)
        num_pages = sets * batch * pages_per_seq
        pages = (num_pages, shape.kv_heads, PAGE, shape.head_dim)
        q = f32_random(cp, (batch, shape.heads, shape.head_dim))
        return cls(bf16_random(cp, pages, 1.0), bf16_random(cp, pages, 1.0),
                   cp.arange(num_pages, dtype=cp.int32).reshape(sets * batch, pages_per_seq),
                   [cp.arange(c * batch, (c + 1) * batch, dtype=cp.int32) for c in range(sets)],
                   cp.full(batch, context - 1, dtype=cp.int32), q, cp.empty_like(q),
                   katt.AttentionWorkspace.allocate(batch, shape.heads, shape.head_dim, context),
                   shape.head_dim ** -0.5,
                   paged_attention_bytes([context] * batch, shape.heads, shape.kv_heads,
                                         shape.head_dim, 2))

    def call(self, i: int, past_kv_ready: bool = False, gate=None) -> None:
        from ninfer.kernels_cuda import attention as katt

        katt.paged_attention(self.q, self.kp, self.vp, self.block_tables,
                             self.seqs[i % len(self.seqs)], self.pos, self.scale, self.out,
                             workspace=self.workspace, gate=gate, past_kv_ready=past_kv_ready)


def attention_decode(ctx: BenchContext, cp) -> list[Measure]:
    """Decode rows of `context` keys each: one eager call (includes the Python launch) and,
    per K/V pipeline depth, the per-call time of back-to-back calls replayed from a CUDA graph
    (`BenchContext.time_graph`; the device time as inside the decode graph); then the output
    gate as a separate sigmoid_mul launch vs fused into paged_attention (gate=), both graphed."""
    from ninfer.kernels_cuda import attention as katt
    from ninfer.kernels_cuda import elementwise as kew

    s = ctx.shape
    out = []
    for batch, context in attn_decode_cases():
        per_set = paged_attention_bytes([context] * batch, s.heads, s.kv_heads, s.head_dim, 2)
        case = DecodeAttention.build(cp, s, batch, context, ctx.copies(per_set, limit=64))
        o = case.out
        # NINFER_ATTN_TMA=1: the bulk-copy ring kernel; NINFER_ATTN_MMA: tensor-core or FMA
        path = katt.decode_path(katt.C.WKind.BF16, s.heads // s.kv_heads, s.head_dim, PAGE)
        label = f"decode B={batch} ctx={context} bf16 KV {path}"
        call = case.call

        out.append(Measure("paged_attention", f"{label} eager", ctx.time(call), bytes=per_set,
                           note="1 launch"))
        ms, reps = ctx.time_graph(call)
        out.append(Measure("paged_attention", f"{label} graph", ms, bytes=per_set,
                           note=f"graph of {reps} launches, {len(case.seqs)} sets"))
        # as in decode: no launch writes the K / V, so each may read its tiles before its wait
        ms, _ = ctx.time_graph(lambda i: call(i, True), reps=reps)
        out.append(Measure("paged_attention", f"{label} past_kv_ready graph", ms, bytes=per_set,
                           note=f"graph of {reps} launches, {len(case.seqs)} sets"))
        # the Qwen3.5 output gate: separate sigmoid_mul launch (the gate copied contiguous, as
        # attn_prep does; in place) vs fused (gate= the strided half of [q_h | gate_h])
        gate = f32_random(cp, (batch, s.heads, 2 * s.head_dim))[:, :, s.head_dim:]
        gate_c = cp.ascontiguousarray(gate)
        flat = o.reshape(batch, -1)

        def unfused(i):
            call(i)
            kew.sigmoid_mul(flat, gate_c.reshape(batch, -1), flat)

        def fused(i):
            call(i, gate=gate)

        for what, fn, note in (("+ sigmoid_mul", unfused, "2 launches"),
                               ("gated", fused, "1 launch")):
            ms, _ = ctx.time_graph(fn, reps=reps)  # the same calls per graph as the plain row
            out.append(Measure("paged_attention", f"{label} {what} graph", ms, bytes=per_set,
                               note=f"{note} per call, graph of {reps} calls"))
    return out


def attention_prefill(ctx: BenchContext, cp) -> list[Measure]:
    from ninfer.kernels_cuda.attention_prefill import paged_prefill_attention

    s = ctx.shape
    tokens = 4096
    pages = tokens // PAGE
    kp = bf16_random(cp, (pages, s.kv_heads, PAGE, s.head_dim), 1.0)
    vp = bf16_random(cp, (pages, s.kv_heads, PAGE, s.head_dim), 1.0)
    bt = cp.arange(pages, dtype=cp.int32).reshape(1, pages)
    q = f32_random(cp, (tokens, s.heads, s.head_dim))
    o = cp.empty_like(q)
    ms = ctx.time(lambda i: paged_prefill_attention(q, kp, vp, bt, 0, 0, s.head_dim ** -0.5, o))
    # useful causal FLOPs (QK^T and PV over the lower triangle); the kernel issues 2x that on
    # the tensor cores (hi + lo terms of q and p)
    meas = Measure("attention_prefill", f"causal N={tokens} (paged, bf16 KV, mma hi/lo)", ms,
                   flops=4.0 * s.heads * s.head_dim * tokens * tokens / 2)
    return [_peer(meas, ctx, lambda: peers.torch_sdpa(s.heads, s.kv_heads, tokens, s.head_dim))]


def gdn_chunk_prefill(ctx: BenchContext, cp) -> list[Measure]:
    """One 8192-token segment in each precision, bf16 also on the bf16-tile path with 32 and 64
    state columns per block, 32 columns with each of its local kernels (pair: per value-head
    pair, (I + A)^-1 by blocks and 3xTF32 mma; local16: per-column forward substitution) (FLA's
    bf16 Triton kernel as the peer)."""
    from ninfer.kernels_cuda.gdn_chunk import ChunkWorkspace, Precision
    from ninfer.kernels_cuda.gdn_chunk import gdn_chunk_prefill as chunk

    s = ctx.shape
    tokens = 8192
    q = f32_random(cp, (tokens, s.key_heads, s.dk), s.dk ** -1.0)
    k = f32_random(cp, (tokens, s.key_heads, s.dk), s.dk ** -0.5)
    v = f32_random(cp, (tokens, s.value_heads, s.dv))
    g = -cp.random.random_sample((tokens, s.value_heads), dtype=cp.float32) * 0.1
    beta = cp.random.random_sample((tokens, s.value_heads), dtype=cp.float32)
    state = f32_random(cp, (1, s.value_heads, s.dk, s.dv), 0.01)
    starts = cp.asarray(np.array([0, tokens], np.int32))
    slots = cp.zeros(1, dtype=cp.int32)
    o = cp.empty_like(v)
    ws = ChunkWorkspace.allocate(tokens, 1, s.value_heads, bf16_tiles=True)
    out = []
    for prec, cols, pair in ((Precision.TF32X3, 0, None), (Precision.BF16, 0, None),
                             (Precision.BF16, 32, False), (Precision.BF16, 32, True),
                             (Precision.BF16, 64, True)):
        mma = "3xTF32 mma" if prec is Precision.TF32X3 else "bf16 mma"
        tiles = f", bf16 tiles, {cols}-column state blocks, double-buffered" if cols else ""
        local = "" if not cols else ", local: pair" if pair else ", local: local16"
        ms = ctx.time(lambda i: chunk(q, k, v, g, beta, state, starts, slots, o, workspace=ws,
                                      precision=prec, bf16_cols=cols, local_pair=pair))
        label = f"{prec.value}" + (f" tiles{cols}" if cols else "") + (
            (" pair" if pair else " local16") if cols else "")
        out.append(_peer(Measure("gdn_chunk_prefill",
                                 f"T={tokens} Hk={s.key_heads} Hv={s.value_heads} {label}",
                                 ms, note=f"{mma}, O in the state pass{tiles}{local}"),
                         ctx, lambda: peers.fla_chunk(tokens, s.key_heads, s.value_heads, s.dk,
                                                      s.dv)))
    return out


def gdn_decode(ctx: BenchContext, cp) -> list[Measure]:
    """The fused decode step (its one kernel, head2) at B = 1, 2, 3, 4, 8: one eager call, and
    the per-call time of back-to-back calls replayed from a CUDA graph (as inside the decode
    graph, PDL overlap included)."""
    from ninfer.kernels_cuda.gdn_decode import decode_counters, gdn_decode_fused

    s = ctx.shape
    out = []
    c = s.conv_channels
    state_bytes = s.value_heads * s.dk * s.dv * 4
    for batch in (1, 2, 3, 4, 8):
        # >= 2 sets: back-to-back PDL launches must not share state slots (the kernel reads S
        # before pdl_wait)
        copies = max(2, ctx.copies(batch * state_bytes * 2, limit=32))
        slots_n = copies * batch
        state = f32_random(cp, (slots_n, s.value_heads, s.dk, s.dv), 0.01)
        conv = f32_random(cp, (slots_n, s.conv - 1, c))
        slot_sets = [cp.arange(i * batch, (i + 1) * batch, dtype=cp.int32) for i in range(copies)]
        qkv = f32_random(cp, (batch, c))
        a, b = f32_random(cp, (batch, s.value_heads)), f32_random(cp, (batch, s.value_heads))
        z = f32_random(cp, (batch, s.value_heads, s.dv))
        w = [Weight(bf16_random(cp, shape, 0.5), DType.BFLOAT16)
             for shape in ((c, s.conv), (s.value_heads,), (s.value_heads,), (s.dv,))]
        o = cp.empty((batch, s.value_heads, s.dv), dtype=cp.float32)
        counters = decode_counters(batch, s.key_heads)
        nbytes = batch * (2 * state_bytes + 2 * (s.conv - 1) * c * 4 + c * 4)
        label = f"B={batch} Hv={s.value_heads}"

        def call(i):
            gdn_decode_fused(qkv, w[0], conv, a, b, w[1], w[2], state, slot_sets[i % copies],
                             z, w[3], 1e-6, o, counters=counters)

        meas = Measure("gdn_decode_fused", f"{label} eager", ctx.time(call), bytes=nbytes,
                       note="1 launch")
        out.append(_peer(meas, ctx, lambda: peers.fla_recurrent(
            batch, s.key_heads, s.value_heads, s.dk, s.dv)))
        ms, reps = ctx.time_graph(call)
        out.append(Measure("gdn_decode_fused", f"{label} graph", ms, bytes=nbytes,
                           note=f"graph of {reps} launches, {copies} sets"))
    return out


def moe_decode(ctx: BenchContext, cp) -> list[Measure]:
    """moe_experts (eager; both expert stages and the combine), each expert stage alone
    (moe_mma_rows_kernel, graph replay: device time as in the decode graph, PDL edges included),
    and moe_route."""
    from ninfer.kernels_cuda import moe as kmoe
    from ninfer.kernels_cuda.moe import MoeWorkspace, moe_experts, moe_route

    s = ctx.shape
    if not s.experts:
        return []
    h, im, e, k = s.hidden, s.moe_inter, s.experts, s.top_k
    gu = Weight(bf16_random(cp, (e, 2 * im, h)), DType.BFLOAT16)
    dn = Weight(bf16_random(cp, (e, h, im)), DType.BFLOAT16)
    out = []
    for n in (1, 8):
        sets = [np.stack([ctx.rng.choice(e, k, replace=False) for _ in range(n)])
                .astype(np.int32) for _ in range(8)]
        experts_read = np.mean([len(np.unique(ids)) for ids in sets])
        ids = [cp.asarray(x) for x in sets]
        wts = cp.full((n, k), 1.0 / k, dtype=cp.float32)
        x = f32_random(cp, (n, h))
        y = cp.empty((n, h), dtype=cp.float32)
        ws = MoeWorkspace.allocate(n, k, h, im)
        ms = ctx.time(lambda i: moe_experts(x, gu, dn, ids[i % len(ids)], wts, y, workspace=ws))
        out.append(Measure("moe_experts", f"decode N={n} E={e} top{k} Im={im}", ms,
                           bytes=experts_read * 3 * im * h * 2, note="eager"))
        # per id set, a workspace holding its group tables (the stage-alone rows)
        group_ws = [MoeWorkspace.allocate(n, k, h, im) for _ in sets]
        for i, gws in enumerate(group_ws):
            kmoe._group(ids[i], kmoe.GROUP_STRIDE, gws)
        for name, w, xs, by_pair, m, kk, swiglu, dst in (
                ("gate_up+SwiGLU", gu.data, x, 0, im, h, True, ws.act),
                ("down", dn.data, ws.act, 1, h, im, False, ws.y)):
            def call(i, w=w, xs=xs, by_pair=by_pair, m=m, kk=kk, swiglu=swiglu, dst=dst):
                kmoe.launch_mma(w, kk, w.shape[1] * kk, xs, kk, by_pair, dst, m, kk,
                                swiglu=swiglu, top_k=k, up_offset=im, experts=e,
                                ws=group_ws[i % len(group_ws)], pairs=n * k)
            ms, reps = ctx.time_graph(call)
            rows = 2 * im if swiglu else h
            out.append(Measure("moe_stage", f"{name} N={n} [{rows}x{kk}]", ms,
                               bytes=experts_read * rows * kk * 2,
                               note=f"graph of {reps} launches"))
        logits = f32_random(cp, (n, e))
        wo, io = cp.empty((n, k), dtype=cp.float32), cp.empty((n, k), dtype=cp.int32)
        out.append(Measure("moe_route", f"N={n} E={e}", ctx.time(
            lambda i: moe_route(logits, k, wo, io))))
    return out


def sampling(ctx: BenchContext, cp) -> list[Measure]:
    from ninfer.kernels_cuda.sampling import sample

    vocab = ctx.shape.vocab
    out = []
    for batch, top_k in ((1, 20), (8, 20), (8, 0)):
        logits = f32_random(cp, (batch, vocab), 3.0)
        f = lambda v: cp.full(batch, v, dtype=cp.float32)  # noqa: E731
        args = [f(0.7), cp.full(batch, top_k, dtype=cp.int32), f(0.95), f(0.0), f(1.0), f(0.0),
                f(0.0), cp.arange(batch, dtype=cp.uint64), cp.zeros(batch, dtype=cp.int64),
                cp.zeros(batch + 1, dtype=cp.int32), cp.zeros(1, dtype=cp.int32),
                cp.zeros(1, dtype=cp.int32)]
        outs = [cp.empty(batch, dtype=cp.int32), cp.empty(batch, dtype=cp.float32),
                cp.empty((batch, 5), dtype=cp.int32), cp.empty((batch, 5), dtype=cp.float32)]
        scratch = cp.empty((batch, vocab), dtype=cp.float32)
        ms = ctx.time(lambda i: sample(logits, *args, *outs, scratch=scratch))
        out.append(Measure("sample", f"B={batch} V={vocab} top_k={top_k} top_p=0.95 T=5", ms,
                           bytes=batch * vocab * 4 * 2))
    return out


def norms(ctx: BenchContext, cp) -> list[Measure]:
    """add_rms_norm at decode and prefill-chunk rows (f32 out, and the bf16 operand out of the
    prefill), and the GDN output norm of a prefill chunk (one warp per head row)."""
    from ninfer.kernels_cuda.norm import add_rms_norm, gated_rms_norm

    h = ctx.shape.hidden
    out = []
    for n, out_dtype in ((1, cp.float32), (8, cp.float32), (512, cp.float32), (512, cp.uint16)):
        res, x = f32_random(cp, (n, h)), f32_random(cp, (n, h))
        w = Weight(bf16_random(cp, (h,), 0.1), DType.BFLOAT16)
        y = cp.empty((n, h), dtype=out_dtype)
        out.append(Measure("add_rms_norm", f"N={n} H={h} out={np.dtype(out_dtype).name}",
                           ctx.time(lambda i: add_rms_norm(res, x, w, 1e-6, y)),
                           bytes=n * h * (12 + y.itemsize)))
    n, hv, dv = 512, ctx.shape.value_heads, ctx.shape.dv
    x, z = f32_random(cp, (n, hv, dv)), f32_random(cp, (n, hv, dv))
    w = Weight(bf16_random(cp, (dv,), 0.1), DType.BFLOAT16)
    y = cp.empty((n, hv, dv), dtype=cp.uint16)
    out.append(Measure("gated_rms_norm", f"N={n} Hv={hv} dv={dv} out=uint16",
                       ctx.time(lambda i: gated_rms_norm(x, z, w, 1e-6, y)),
                       bytes=n * hv * dv * (8 + 2)))
    return out


def gemv_loads(ctx: BenchContext, cp) -> list[Measure]:
    from bench.load_patterns import gemv_loads as run

    return run(ctx, cp)


CASES = {
    "linear": linear_decode,
    "gemv_loads": gemv_loads,
    "linear_prefill": linear_prefill,
    "paged_attention": attention_decode,
    "attention_prefill": attention_prefill,
    "gdn_chunk_prefill": gdn_chunk_prefill,
    "gdn_decode_fused": gdn_decode,
    "moe": moe_decode,
    "sample": sampling,
    "norm": norms,
}
