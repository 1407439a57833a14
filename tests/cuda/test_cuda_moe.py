"""MoE on the GPU: routing (ids exact, weights vs float64, bitwise the former kernel), routed
experts on the grouped-GEMV path (reads only the selected experts) and the cuBLAS prefill path,
batch invariance, moe_mma_rows_kernel bitwise equal to moe_mma_kernel, PDL on vs off, and
moe_block (routing, experts and the gated shared expert) bitwise equal to the separate ops,
eagerly and replayed from a CUDA graph."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from cuda_testutil import (
    DTYPES,
    TOL_BF16_X,
    TOL_F32,
    assert_close,
    assert_graph_replay_equals_eager,
    assert_same_bits,
    cp,
    dev,
    host,
    launch_names,
    poisoned,
    randn,
    randn_refill,
    tiled_experts,
    weight_pair,
)

from ninfer import ops
from ninfer.core.dtypes import DType, bf16_bits_to_f32, f32_to_bf16_bits
from ninfer.core.tensor import Weight
from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda import moe as kmoe
from ninfer.ops import reference as ref

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("experts,top_k", [(256, 8), (60, 5), (512, 10)])
def test_moe_route(rng, experts, top_k):
    n = 13
    logits = randn(rng, (n, experts), 2.0)
    w, ids = poisoned((n, top_k)), poisoned((n, top_k), np.int32)
    ops.moe_route(dev(logits), top_k, w, ids)
    exp_w, exp_ids = ref.moe_route(logits, top_k)
    np.testing.assert_array_equal(host(ids), exp_ids)
    assert_close(w, exp_w, 1e-6)


def _routing(rng, n, experts, top_k):
    ids = np.stack([rng.choice(experts, top_k, replace=False) for _ in range(n)]).astype(np.int32)
    w = rng.uniform(0.1, 1.0, (n, top_k)).astype(np.float32)
    return ids, (w / w.sum(axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 8, 20])
@pytest.mark.parametrize("hidden", [136, 296, 304])  # > 256: the combine's 2nd block is partial
@pytest.mark.parametrize("inter", [40, 48])  # K % 16 == 0 in both stages at (304, 48)
def test_moe_experts_gemv_path(rng, dtype, n, hidden, inter):
    experts, top_k = 16, 4
    gu_h, gu_d = weight_pair(rng, (experts, 2 * inter, hidden), dtype, scale=hidden ** -0.5)
    dn_h, dn_d = weight_pair(rng, (experts, hidden, inter), dtype, scale=inter ** -0.5)
    x = randn(rng, (n, hidden))
    ids, w = _routing(rng, n, experts, top_k)
    if n > 2:
        ids[2] = ids[0][::-1]  # shared experts across rows
    out = poisoned((n, hidden))
    ops.moe_experts(dev(x), gu_d, dn_d, dev(ids), dev(w), out)
    assert_close(out, ref.moe_experts(x, gu_h, dn_h, ids, w))


@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_experts_prefill_path(rng, dtype):
    experts, top_k, hidden, inter, n = 12, 3, 96, 64, 70
    gu_h, gu_d = weight_pair(rng, (experts, 2 * inter, hidden), dtype, scale=hidden ** -0.5)
    dn_h, dn_d = weight_pair(rng, (experts, hidden, inter), dtype, scale=inter ** -0.5)
    x = randn(rng, (n, hidden))
    ids, w = _routing(rng, n, experts, top_k)
    out = poisoned((n, hidden))
    kmoe.moe_experts(dev(x), gu_d, dn_d, dev(ids), dev(w), out)
    tol = TOL_BF16_X if dtype is DType.BFLOAT16 else 1e-5
    assert_close(out, ref.moe_experts(x, gu_h, dn_h, ids, w), tol)


def test_moe_experts_batch_invariance(rng):
    experts, top_k, hidden, inter, n = 32, 8, 2048, 512, 8
    _, gu_d = weight_pair(rng, (experts, 2 * inter, hidden), DType.BFLOAT16, hidden ** -0.5)
    _, dn_d = weight_pair(rng, (experts, hidden, inter), DType.BFLOAT16, inter ** -0.5)
    x = dev(randn(rng, (n, hidden)))
    ids, w = (dev(a) for a in _routing(rng, n, experts, top_k))
    ws = kmoe.MoeWorkspace.allocate(n, top_k, hidden, inter)
    batch = poisoned((n, hidden))
    kmoe.moe_experts(x, gu_d, dn_d, ids, w, batch, workspace=ws)
    for rows in ([0], [5, 6], [1, 2, 3]):
        part = poisoned((len(rows), hidden))
        kmoe.moe_experts(x[rows], gu_d, dn_d, ids[rows], w[rows], part, workspace=ws)
        assert_same_bits(part, batch[rows], f"rows {rows}")


# The block-per-row routing kernel that the warp-per-row moe_route_kernel replaced, verbatim (but
# for its name): the bitwise reference of the new kernel.
_FORMER_ROUTE = r'''
extern "C" __global__ void __launch_bounds__(1024) former_route(const float* __restrict__ logits,
                                                              i64 logits_rs, int experts, int top_k,
                                                              float* __restrict__ w_out, i64 w_rs,
                                                              int* __restrict__ ids_out,
                                                              i64 ids_rs) {
  __shared__ float scratch[32];
  __shared__ float red_v[32];
  __shared__ int red_i[32];
  __shared__ float picked_p[64];
  __shared__ int picked_id[64];
  const i64 n = blockIdx.x;
  const int e = threadIdx.x;
  const bool ok = e < experts;
  const float l = ok ? logits[n * logits_rs + e] : -NINFER_INF;
  const float m = block_max(l, scratch);
  const float ex = ok ? expf(l - m) : 0.0f;
  const float total = block_sum(ex, scratch);
  float p = ok ? ex / total : -1.0f;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  for (int k = 0; k < top_k; ++k) {
    float bv = p;
    int bi = ok ? e : 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) { red_v[warp] = bv; red_i[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
      float v = red_v[0];
      int id = red_i[0];
      for (int w = 1; w < nwarps; ++w)
        if (red_v[w] > v || (red_v[w] == v && red_i[w] < id)) { v = red_v[w]; id = red_i[w]; }
      picked_p[k] = v;
      picked_id[k] = id;
    }
    __syncthreads();
    if (e == picked_id[k]) p = -1.0f;  // taken
  }
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int k = 0; k < top_k; ++k) sum += picked_p[k];
    for (int k = 0; k < top_k; ++k) {
      w_out[n * w_rs + k] = picked_p[k] / sum;
      ids_out[n * ids_rs + k] = picked_id[k];
    }
  }
}
'''


@functools.cache
def _former_route_fn():
    from ninfer.kernels_cuda._loader import BASE_OPTIONS, PACKAGE_DIR, expand_source

    code = expand_source(PACKAGE_DIR / "common.cuh") + _FORMER_ROUTE
    return cp().RawModule(code=code, options=BASE_OPTIONS).get_function("former_route")


def _former_route(logits, top_k):
    n, experts = logits.shape
    w, ids = poisoned((n, top_k)), poisoned((n, top_k), np.int32)
    _former_route_fn()((n,), (max(32, (experts + 31) // 32 * 32),),
                       (logits, np.int64(logits.strides[0] // 4), np.int32(experts),
                        np.int32(top_k), w, np.int64(top_k), ids, np.int64(top_k)))
    return w, ids


def _route_logits(rng, n, experts):
    """Host logits: random rows, then a row of many exact ties and a row of equal values."""
    logits = randn(rng, (n, experts), 2.0)
    logits[1] = rng.integers(-3, 3, experts) * 0.5
    logits[2] = 0.25
    return logits


@pytest.mark.parametrize("experts,top_k", [(256, 8), (60, 5), (512, 10), (1000, 64), (32, 32),
                                           (7, 3), (300, 9)])
def test_moe_route_equals_former_kernel_bitwise(rng, experts, top_k):
    """Ids and weights bitwise equal to the former block-per-row kernel, ids equal to the float64
    reference (ties to the lower id), on strided rows."""
    n = 13
    host_logits = _route_logits(rng, n, experts)
    parent = dev(randn(rng, (n, experts + 3)))
    logits = parent[:, 1:experts + 1]
    logits[...] = dev(host_logits)
    w, ids = poisoned((n, top_k)), poisoned((n, top_k), np.int32)
    ops.moe_route(logits, top_k, w, ids)
    former_w, former_ids = _former_route(logits, top_k)
    assert_same_bits(ids, former_ids, "ids")
    assert_same_bits(w, former_w, "weights")
    exp_w, exp_ids = ref.moe_route(host_logits, top_k)
    np.testing.assert_array_equal(host(ids), exp_ids)
    assert_close(w, exp_w, 1e-6)


def test_moe_route_rows_without_a_softmax(rng):
    """A NaN or +inf logit, or only -inf: experts 0..K-1 with NaN weights (as on the CPU); the
    other rows are unaffected."""
    n, experts, top_k = 5, 256, 8
    logits = randn(rng, (n, experts), 2.0)
    logits[1, 77] = np.nan
    logits[2, 3] = np.inf
    logits[3] = -np.inf
    w, ids = poisoned((n, top_k)), poisoned((n, top_k), np.int32)
    ops.moe_route(dev(logits), top_k, w, ids)
    w, ids = host(w), host(ids)
    for r in (1, 2, 3):
        assert ids[r].tolist() == list(range(top_k)), r
        assert np.all(np.isnan(w[r])), r
    exp_w, exp_ids = ref.moe_route(logits[[0, 4]], top_k)
    np.testing.assert_array_equal(ids[[0, 4]], exp_ids)
    assert_close(w[[0, 4]], exp_w, 1e-6)


@pytest.mark.parametrize("kernel", ["tma", "rows", "mma"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_router_and_shared_gate_in_one_linear_are_bitwise_unchanged(rng, monkeypatch, dtype,
                                                                    kernel):
    """Decode (N <= 8, the GEMV): linear over [router; shared_gate] gives each column exactly what
    the two separate linears gave (the 35B-A3B shape: E = 256, H = 2048)."""
    from ninfer.kernels_cuda import linear as klinear

    monkeypatch.setattr(klinear, "GEMV_TMA", kernel == "tma")
    monkeypatch.setattr(klinear, "GEMV_ROWS", kernel == "rows")
    experts, hidden = 256, 2048
    both_h, _ = weight_pair(rng, (experts + 1, hidden), dtype, hidden ** -0.5)
    router = Weight(dev(both_h.data[:experts]), dtype)
    gate = Weight(dev(both_h.data[experts:]), dtype)
    both = Weight(dev(both_h.data), dtype)
    for n in (1, 2, 3, 5, 8):
        x = dev(randn(rng, (n, hidden)))
        fused, lone = poisoned((n, experts + 1)), poisoned((n, experts))
        lone_gate = poisoned((n, 1))
        ops.linear(x, both, fused)
        ops.linear(x, router, lone)
        ops.linear(x, gate, lone_gate)
        assert_same_bits(fused[:, :experts], lone, f"router logits, n={n}")
        assert_same_bits(fused[:, experts:], lone_gate, f"gate logit, n={n}")


def _block_inputs(rng, dtype, n, experts, hidden=136, inter=40):
    gu_h, gu_d = weight_pair(rng, (experts, 2 * inter, hidden), dtype, scale=hidden ** -0.5)
    dn_h, dn_d = weight_pair(rng, (experts, hidden, inter), dtype, scale=inter ** -0.5)
    x = dev(randn(rng, (n, hidden)))
    logits = dev(randn(rng, (n, experts + 1), 2.0))  # [router logits | shared gate logit]
    shared = dev(randn(rng, (n, hidden)))
    return (gu_h, gu_d), (dn_h, dn_d), x, logits, shared


def _separate_ops(x, logits, top_k, gu, dn, shared, **kw):
    n, experts = logits.shape[0], logits.shape[1] - 1
    w, ids, out = poisoned((n, top_k)), poisoned((n, top_k), np.int32), poisoned((n, x.shape[1]))
    ops.moe_route(logits[:, :experts], top_k, w, ids)
    ops.moe_experts(x, gu, dn, ids, w, out, **kw)
    if shared is not None:
        ops.sigmoid_scale_add(out, shared, logits[:, experts:])
    return w, ids, out


def _moe_block(x, logits, top_k, gu, dn, shared, **kw):
    n, experts = logits.shape[0], logits.shape[1] - 1
    w, ids, out = poisoned((n, top_k)), poisoned((n, top_k), np.int32), poisoned((n, x.shape[1]))
    gate = logits[:, experts:] if shared is not None else None
    ops.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out, shared=shared,
                  shared_gate=gate, **kw)
    return w, ids, out


def _check_block_vs_separate_ops(inputs, experts: int, tol: float, **kw) -> None:
    """moe_block (top 8) vs moe_route, moe_experts, sigmoid_scale_add: weights, ids and output
    bitwise equal; the output within `tol` of float64."""
    (gu_h, gu), (dn_h, dn), x, logits, shared = inputs
    got = _moe_block(x, logits, 8, gu, dn, shared, **kw)
    want = _separate_ops(x, logits, 8, gu, dn, shared, **kw)
    for g, e, what in zip(got, want, ("weights", "ids", "out")):
        assert_same_bits(g, e, what)
    w, ids, out = (host(a) for a in got)
    gate = host(logits)[:, experts:].astype(np.float64)
    expect = (ref.moe_experts(host(x), gu_h, dn_h, ids, w)
              + host(shared) / (1.0 + np.exp(-gate)))
    assert_close(out, expect, tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,batch_invariant", [(1, False), (3, False), (8, False), (20, False),
                                               (70, False), (70, True)])
@pytest.mark.parametrize("experts", [64, 256, 300, 600])  # route J = 2, 8, 16, 32 (unfused)
def test_moe_block_equals_the_separate_ops_bitwise(rng, dtype, n, batch_invariant, experts):
    """moe_block (fused routing + grouping; shared add in the combine) vs moe_route, moe_experts,
    sigmoid_scale_add: weights, ids and output bitwise equal, on the grouped-GEMV path (f32 FMA
    and tensor-core kernels) and the cuBLAS prefill path (n = 70)."""
    kw = dict(batch_invariant=True) if batch_invariant else {}
    prefill_bf16 = dtype is DType.BFLOAT16 and n > kmoe.GEMV_MAX_ROWS and not batch_invariant
    _check_block_vs_separate_ops(_block_inputs(rng, dtype, n, experts), experts,
                                 TOL_BF16_X if prefill_bf16 else TOL_F32, **kw)


@pytest.mark.parametrize("n", [1, 3, 8])
def test_moe_block_equals_the_separate_ops_bitwise_k16_shape(rng, n):
    """As above with K % 16 == 0 in both stages (H = 304, Im = 48)."""
    experts = 256
    _check_block_vs_separate_ops(_block_inputs(rng, DType.BFLOAT16, n, experts, 304, 48),
                                 experts, TOL_F32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_block_without_shared_equals_route_and_experts(rng, dtype):
    (_, gu), (_, dn), x, logits, _ = _block_inputs(rng, dtype, 5, 256)
    got = _moe_block(x, logits, 8, gu, dn, None)
    want = _separate_ops(x, logits, 8, gu, dn, None)
    for g, e, what in zip(got, want, ("weights", "ids", "out")):
        assert_same_bits(g, e, what)


@pytest.mark.parametrize("experts", [256, 600])
def test_fused_route_grouping_equals_the_group_kernel(rng, experts):
    """The group tables moe_route_group_kernel leaves in the workspace equal moe_group_kernel's
    (experts = 600: routing and grouping are separate launches)."""
    n, top_k, hidden, inter = 8, 8, 136, 40
    (_, gu), (_, dn), x, logits, shared = _block_inputs(rng, DType.BFLOAT16, n, experts)
    ws_block = kmoe.MoeWorkspace.allocate(n, top_k, hidden, inter)
    ws_group = kmoe.MoeWorkspace.allocate(n, top_k, hidden, inter)
    for ws in (ws_block, ws_group):
        for a in (ws.group_expert, ws.group_pairs, ws.num_groups):
            a.fill(-7)
    w, ids = poisoned((n, top_k)), poisoned((n, top_k), np.int32)
    out = poisoned((n, hidden))
    kmoe.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out, workspace=ws_block)
    kmoe.moe_experts(x, gu, dn, ids, w, poisoned((n, hidden)), workspace=ws_group)
    groups = int(host(ws_group.num_groups)[0])
    assert 1 <= groups <= n * top_k
    assert_same_bits(ws_block.num_groups, ws_group.num_groups, "num_groups")
    assert_same_bits(ws_block.group_expert[:groups], ws_group.group_expert[:groups], "experts")
    assert_same_bits(ws_block.group_pairs[:groups * 8], ws_group.group_pairs[:groups * 8], "pairs")


@pytest.mark.parametrize("n,hidden,inter", [(4, 136, 40), (3, 528, 96), (8, 1040, 256)])
def test_moe_block_graph_replay_equals_eager(rng, n, hidden, inter):
    """Captured in a CUDA graph (workspace preallocated) and replayed on new inputs in the same
    buffers: bitwise the eager result (several hidden / inner sizes, K % 16 == 0 or not)."""
    from ninfer.core.cuda import DeviceContext

    experts, top_k = (256, 8) if hidden == 136 else (64, 8)
    ctx = DeviceContext(0)
    with ctx.activate():
        (_, gu), (_, dn), x, logits, shared = _block_inputs(rng, DType.BFLOAT16, n, experts,
                                                            hidden, inter)
        ws = kmoe.MoeWorkspace.allocate(n, top_k, hidden, inter)
        w, ids, out = poisoned((n, top_k)), poisoned((n, top_k), np.int32), poisoned((n, hidden))

        def step():
            ops.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out, shared=shared,
                          shared_gate=logits[:, experts:], workspace=ws)

        def eager():
            step()
            return w, ids, out

        refill = randn_refill(rng, (x, 1.0), (logits, 2.0), (shared, 1.0))
        assert_graph_replay_equals_eager(
            ctx, "moe_block", step, refill, (w, ids, out),
            (w, ids, out), eager, ("weights", "ids", "out"), "graph replay vs eager")


# moe_mma_rows_kernel (the default; NINFER_GEMV_ROWS=0 selects moe_mma_kernel): row-contiguous
# expert weight reads staged through shared memory; must equal moe_mma_kernel bit for bit on every
# shape (same K split, fragments, mma order and reduction order). Explicit launches of one stage
# (kmoe.launch_mma) on the group tables of random routings.

def _padded_experts(rng, experts, rows, k):
    """(float64 values, device bf16 bits [E, rows, K]) with 16-byte aligned rows padded with NaN
    up to the stride: a kernel reading past K (and not zeroing) turns its result into NaN."""
    stride = -(-k // 8) * 8 + 8
    bits = f32_to_bf16_bits((rng.standard_normal((experts, rows, k)) * k ** -0.5)
                            .astype(np.float32))
    full = np.full((experts, rows, stride), 0x7FC0, dtype=np.uint16)
    full[..., :k] = bits
    return bf16_bits_to_f32(bits).astype(np.float64), dev(full)[..., :k]


def _padded_x(rng, n, k):
    """(host, device) x f32 [n, k] with NaN around each row; rows 16-byte aligned with a stride
    that is a multiple of 4 (what the mma kernels need)."""
    stride = -(-k // 4) * 4 + 8
    full = np.full((n, stride), np.nan, dtype=np.float32)
    full[:, 4:4 + k] = randn(rng, (n, k), 3.0)
    return full[:, 4:4 + k], dev(full)[:, 4:4 + k]


def _stage(w_d, x_d, ids, m, *, swiglu, by_pair, experts, rows):
    """One expert stage of moe_mma_rows_kernel (rows=True) or moe_mma_kernel on the groups of
    `ids` (device): out f32 [pairs, m], poisoned before the launch."""
    n, top_k = ids.shape
    ws = kmoe.MoeWorkspace.allocate(n, top_k, 8, 8)  # only the group tables are used
    kmoe._group(ids, kmoe.GROUP_STRIDE, ws)
    out = poisoned((ids.size, m))
    k = x_d.shape[1]
    w_rs = C.row_stride(w_d[0], "w")
    kmoe.launch_mma(w_d, w_rs, w_d.shape[1] * w_rs, x_d, C.row_stride(x_d, "x"), by_pair, out, m,
                    k, swiglu=swiglu, top_k=top_k, up_offset=m, experts=experts, ws=ws,
                    pairs=ids.size, rows=rows)
    return out


def _stage_oracle(w, x, ids, m, *, swiglu, by_pair):
    """float64 out[pair, :m] of one stage (w: float64 [E, rows, K])."""
    top_k = ids.shape[1]
    out = np.empty((ids.size, m))
    for pr, e in enumerate(ids.reshape(-1)):
        y = w[e] @ np.asarray(x[pr if by_pair else pr // top_k], np.float64)
        out[pr] = ref.swiglu(y[None])[0] if swiglu else y
    return out


@pytest.mark.parametrize("m,k,swiglu,by_pair", [
    (147, 1000, True, False),   # odd M (a partial row tile), K not a multiple of 128
    (301, 1016, False, True),
    (64, 2048, True, False),    # the 35B-A3B gate_up K (8 splits), 8 row tiles
    (2048, 512, False, True),   # the 35B-A3B down (2 splits)
    (40, 64, False, False),     # one split shorter than a batch
    (77, 333, True, True),      # K % 8 != 0: a partial unit (one split)
    (203, 4100, False, False),  # K % 8 != 0 with 8 splits
])
@pytest.mark.parametrize("experts,top_k", [(16, 4), (5, 3)])  # experts without rows; full groups
def test_moe_mma_rows_kernel_equals_mma_kernel_bitwise(rng, m, k, swiglu, by_pair, experts,
                                                       top_k):
    w, w_d = _padded_experts(rng, experts, 2 * m if swiglu else m, k)
    for n in range(1, 9):
        ids = dev(_routing(rng, n, experts, top_k)[0])
        x_h, x_d = _padded_x(rng, n * top_k if by_pair else n, k)
        kw = dict(swiglu=swiglu, by_pair=int(by_pair), experts=experts)
        want = _stage(w_d, x_d, ids, m, rows=False, **kw)
        assert np.isfinite(host(want)).all(), f"n={n}: moe_mma_kernel output not finite"
        got = _stage(w_d, x_d, ids, m, rows=True, **kw)
        assert_same_bits(got, want, f"m={m} k={k} swiglu={swiglu} n={n}")
        assert_close(got, _stage_oracle(w, x_h, host(ids), m, swiglu=swiglu, by_pair=by_pair))


@pytest.mark.parametrize("swiglu", [False, True])
def test_moe_mma_rows_kernel_bad_expert_rows_are_nan(rng, swiglu):
    """An expert id outside [0, E) gives NaN rows (never read weights), like moe_mma_kernel; the
    other pairs are unaffected."""
    experts, top_k, n, m, k = 8, 2, 3, 40, 256
    _, w_d = _padded_experts(rng, experts, 2 * m if swiglu else m, k)
    ids_h = _routing(rng, n, experts, top_k)[0]
    ids_h[1, 0] = experts
    ids = dev(ids_h)
    _, x_d = _padded_x(rng, n, k)
    kw = dict(swiglu=swiglu, by_pair=0, experts=experts)
    got = host(_stage(w_d, x_d, ids, m, rows=True, **kw))
    want = host(_stage(w_d, x_d, ids, m, rows=False, **kw))
    assert_same_bits(got, want, "rows vs mma kernel")
    bad = 1 * top_k + 0
    assert np.isnan(got[bad]).all()
    assert np.isfinite(np.delete(got, bad, axis=0)).all()


def test_gemv_rows_flag_routes_moe_experts(rng, monkeypatch):
    """GEMV_ROWS (NINFER_GEMV_ROWS, read at import) switches moe_experts' tensor-core stages; both
    give the same bits (the 35B-A3B expert shape: H = 2048, Im = 512, top 8)."""
    experts, top_k, hidden, inter = 32, 8, 2048, 512
    _, gu_d = weight_pair(rng, (experts, 2 * inter, hidden), DType.BFLOAT16, hidden ** -0.5)
    _, dn_d = weight_pair(rng, (experts, hidden, inter), DType.BFLOAT16, inter ** -0.5)
    for n in (1, 3, 8):
        x = dev(randn(rng, (n, hidden)))
        ids, w = (dev(a) for a in _routing(rng, n, experts, top_k))
        got = []
        for rows in (True, False):
            monkeypatch.setattr(kmoe, "GEMV_ROWS", rows)
            ws = kmoe.MoeWorkspace.allocate(n, top_k, hidden, inter)
            ws.act.fill(np.nan)
            ws.y.fill(np.nan)
            out = poisoned((n, hidden))
            kmoe.moe_experts(x, gu_d, dn_d, ids, w, out, workspace=ws)
            got.append((ws.act[:n * top_k].copy(), ws.y[:n * top_k].copy(), out))
        for a, b, what in zip(got[0], got[1], ("act", "y", "out")):
            assert_same_bits(a, b, f"{what}, n={n}")
        assert np.isfinite(host(got[0][2])).all()


# A bitwise check that reports the differing elements, and 35B-A3B-shaped expert weights.

def _tiled_experts_35b(rng, experts, sub):
    """cuda_testutil.tiled_experts at the 35B-A3B shape (H = 2048, Im = 512)."""
    return tiled_experts(rng, experts, 2048, 512, sub)


def test_moe_block_pdl_on_equals_off(rng, monkeypatch):
    """moe_block with every MoE kernel launched with PDL (sm_90) vs plain launches: bitwise the
    same weights, ids and output (B = 1, 3, 8; 35B-A3B expert shape, 256 experts routed)."""
    from ninfer.kernels_cuda import _loader

    experts, top_k, hidden = 256, 8, 2048
    sub = 24  # random weights of 24 experts, tiled: expert e has expert e % 24's weights
    gu, dn, _, _ = _tiled_experts_35b(rng, experts, sub)
    for n in (1, 3, 8):
        x = dev(randn(rng, (n, hidden)))
        logits = dev(randn(rng, (n, experts + 1), 2.0))
        shared = dev(randn(rng, (n, hidden)))
        got = {}
        for pdl in (True, False):
            monkeypatch.setattr(_loader, "_PDL", pdl)
            got[pdl] = _moe_block(x, logits, top_k, gu, dn, shared)
        assert np.isfinite(host(got[True][2])).all()
        for a, b, what in zip(got[True], got[False], ("weights", "ids", "out")):
            assert_same_bits(a, b, f"{what}, n={n}, PDL on vs off")


# The fused decode path (NINFER_MOE_FUSED, kmoe.FUSED): moe_fused_gate_up_kernel (routing,
# grouping, gate_up) and moe_fused_down_kernel (down, combine, gated shared add) against the
# four-launch path (fused=False), bitwise: weights, ids, output and the group tables.

def _kmoe_block(x, logits, top_k, gu, dn, shared, *, fused: bool):
    """kmoe.moe_block (the launcher: ops.moe_block has no `fused` switch) into poisoned outputs;
    logits: [router logits | shared gate logit]."""
    n, experts = logits.shape[0], logits.shape[1] - 1
    w, ids, out = poisoned((n, top_k)), poisoned((n, top_k), np.int32), poisoned((n, x.shape[1]))
    gate = logits[:, experts:] if shared is not None else None
    kmoe.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out, shared=shared,
                   shared_gate=gate, fused=fused)
    return w, ids, out


def _fused_vs_unfused(x, logits, top_k, gu, dn, shared, what: str):
    n, experts = logits.shape[0], logits.shape[1] - 1
    hidden, inter = x.shape[1], dn.shape[2]
    got = {}
    for fused in (True, False):
        ws = kmoe.MoeWorkspace.allocate(n, top_k, hidden, inter)
        for a in (ws.act, ws.y):
            a.fill(np.nan)
        for a in (ws.group_expert, ws.group_pairs, ws.num_groups):
            a.fill(-7)
        w, ids, out = (poisoned((n, top_k)), poisoned((n, top_k), np.int32),
                       poisoned((n, hidden)))
        gate = logits[:, experts:] if shared is not None else None
        kmoe.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out, shared=shared,
                       shared_gate=gate, workspace=ws, fused=fused)
        got[fused] = (w, ids, out, ws)
    (w1, i1, o1, ws1), (w0, i0, o0, ws0) = got[True], got[False]
    assert np.isfinite(host(o1)).all(), f"{what}: non-finite output"
    for a, b, name in ((w1, w0, "weights"), (i1, i0, "ids"), (o1, o0, "out")):
        assert_same_bits(a, b, f"{what}: {name}, fused vs four launches")
    groups = int(host(ws0.num_groups)[0])
    assert_same_bits(ws1.num_groups, ws0.num_groups, f"{what}: num_groups")
    assert_same_bits(ws1.group_expert[:groups], ws0.group_expert[:groups],
                     f"{what}: group experts")
    assert_same_bits(ws1.group_pairs[:groups * 8], ws0.group_pairs[:groups * 8],
                     f"{what}: group pairs")
    return w1, i1, o1


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("with_shared", [True, False])
def test_moe_fused_equals_four_launches_35b_shape(rng, n, with_shared):
    """35B-A3B shape (H = 2048, Im = 512, 256 experts, top 8), duplicate experts across rows
    (logits of row 2 copy row 0's): bitwise the four-launch path; the output within 2e-2 of the
    float64 oracle (bf16 weights, f32 x)."""
    experts, top_k, hidden = 256, 8, 2048
    sub = 24  # expert e has expert e % 24's weights
    gu, dn, gu_h, dn_h = _tiled_experts_35b(rng, experts, sub)
    x = dev(randn(rng, (n, hidden)))
    logits_h = randn(rng, (n, experts + 1), 2.0)
    if n > 2:
        logits_h[2, :experts] = logits_h[0, :experts]  # the same 8 experts in rows 0 and 2
    logits = dev(logits_h)
    shared = dev(randn(rng, (n, hidden))) if with_shared else None
    assert kmoe.fused_applies(n, top_k, experts, True)
    w, ids, out = _fused_vs_unfused(x, logits, top_k, gu, dn, shared, f"35B n={n}")
    expect = ref.moe_experts(host(x), gu_h, dn_h, host(ids) % sub, host(w))
    if with_shared:
        expect = expect + host(shared) / (1.0 + np.exp(-logits_h[:, experts:].astype(np.float64)))
    assert_close(out, expect, 2e-2)


@pytest.mark.parametrize("n,hidden,inter,experts,top_k", [
    (1, 136, 40, 64, 8),     # 1 split per stage: gate_up blocks of max(1, 64 / 32) warps
    (3, 296, 48, 100, 5),    # hidden not a multiple of 16 (partial output tiles), E % 32 != 0
    (8, 1040, 264, 256, 8),  # Im % 16 != 0, 64 pairs
    (5, 528, 96, 512, 4),    # J = 16
    (8, 304, 8, 8, 8),       # top_k = E: every row picks every expert
])
def test_moe_fused_equals_four_launches_odd_shapes(rng, n, hidden, inter, experts, top_k):
    (_, gu), (_, dn), x, logits, shared = _block_inputs(rng, DType.BFLOAT16, n, experts, hidden,
                                                        inter)
    assert kmoe.fused_applies(n, top_k, experts, True)
    _fused_vs_unfused(x, logits, top_k, gu, dn, shared, f"n={n} H={hidden} Im={inter}")


def test_moe_fused_batch_invariance(rng):
    """A row's fused result does not depend on the other rows of the launch."""
    experts, top_k, hidden, inter, n = 64, 8, 1040, 264, 8
    (_, gu), (_, dn), x, logits, shared = _block_inputs(rng, DType.BFLOAT16, n, experts, hidden,
                                                        inter)
    full = _kmoe_block(x, logits, top_k, gu, dn, shared, fused=True)
    for rows in ([0], [5, 6], [1, 2, 3, 7]):
        part = _kmoe_block(x[rows], logits[rows], top_k, gu, dn, shared[rows], fused=True)
        for a, b, what in zip(part, full, ("weights", "ids", "out")):
            assert_same_bits(a, host(b)[rows], f"{what}, rows {rows}")


def test_moe_fused_falls_back_outside_its_shapes(rng):
    """N > 8, f32 weights or N*K > 64 take the four-launch path (fused_applies is False)."""
    assert not kmoe.fused_applies(9, 8, 256, True)
    assert not kmoe.fused_applies(8, 9, 256, True)
    assert not kmoe.fused_applies(4, 8, 256, False)
    assert not kmoe.fused_applies(4, 8, 600, True)
    (_, gu), (_, dn), x, logits, shared = _block_inputs(rng, DType.FLOAT32, 4, 64)
    _fused_vs_unfused(x, logits, 8, gu, dn, shared, "f32 weights")


def test_moe_fused_graph_replay_equals_eager(rng):
    """The fused launches captured in a CUDA graph, replayed on new inputs: bitwise eager."""
    from ninfer.core.cuda import DeviceContext

    n, hidden, inter, experts, top_k = 3, 1040, 264, 256, 8
    ctx = DeviceContext(0)
    with ctx.activate():
        (_, gu), (_, dn), x, logits, shared = _block_inputs(rng, DType.BFLOAT16, n, experts,
                                                            hidden, inter)
        ws = kmoe.MoeWorkspace.allocate(n, top_k, hidden, inter)
        w, ids, out = poisoned((n, top_k)), poisoned((n, top_k), np.int32), poisoned((n, hidden))

        def step(fused=True):
            kmoe.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out, shared=shared,
                           shared_gate=logits[:, experts:], workspace=ws, fused=fused)

        def eager():
            step(fused=False)
            return w, ids, out

        refill = randn_refill(rng, (x, 1.0), (logits, 2.0), (shared, 1.0))
        assert_graph_replay_equals_eager(
            ctx, "moe_block_fused", step, refill, (w, ids, out),
            (w, ids, out), eager, ("weights", "ids", "out"),
            "graph replay (fused) vs eager four launches")


def test_moe_fused_pdl_on_equals_off(rng, monkeypatch):
    from ninfer.kernels_cuda import _loader

    (_, gu), (_, dn), x, logits, shared = _block_inputs(rng, DType.BFLOAT16, 8, 256, 1040, 264)
    got = {}
    for pdl in (True, False):
        monkeypatch.setattr(_loader, "_PDL", pdl)
        got[pdl] = _kmoe_block(x, logits, 8, gu, dn, shared, fused=True)
    for a, b, what in zip(got[True], got[False], ("weights", "ids", "out")):
        assert_same_bits(a, b, f"{what}, PDL on vs off")


# Routing first (NINFER_MOE_ROUTE_FIRST): moe_route(..., workspace=ws) writes weights, ids and the
# group tables; moe_block(..., routed=True, workspace=ws) then runs only the expert stages.
# Bitwise moe_block(routed=False): weights, ids, act and output, with MOE_TMA on and off.

_ROUTING_LAUNCHES = ("moe_route", "moe_route_group", "moe_fused_gate_up")


def _poisoned_ws(n, top_k, hidden, inter):
    ws = kmoe.MoeWorkspace.allocate(n, top_k, hidden, inter)
    ws.act.fill(np.nan)
    ws.y.fill(np.nan)
    for a in (ws.group_expert, ws.group_pairs, ws.num_groups):
        a.fill(-7)
    return ws


def _routed_run(monkeypatch, x, logits, top_k, gu, dn, shared, *, routed, fused):
    """((weights, ids, act, out), launch names of moe_route, of moe_block) into poisoned
    outputs and workspace; routed=True hands moe_block NaN logits (it must not read them)."""
    n, experts = logits.shape[0], logits.shape[1] - 1
    hidden, inter = x.shape[1], dn.shape[2]
    ws = _poisoned_ws(n, top_k, hidden, inter)
    w, ids, out = poisoned((n, top_k)), poisoned((n, top_k), np.int32), poisoned((n, hidden))
    gate = logits[:, experts:] if shared is not None else None
    route_names = []
    with launch_names(kmoe) as names:
        if routed:
            kmoe.moe_route(logits[:, :experts], top_k, w, ids, workspace=ws)
            route_names = names[:]
            names.clear()
            kmoe.moe_block(x, poisoned((n, experts)), top_k, gu, dn, w, ids, out, shared=shared,
                           shared_gate=gate, workspace=ws, fused=fused, routed=True)
        else:
            kmoe.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out, shared=shared,
                           shared_gate=gate, workspace=ws, fused=fused)
    return (w, ids, ws.act[:n * top_k], out), route_names, names


def _check_routed(monkeypatch, rng, gu, dn, dtype, hidden, experts, top_k, ns):
    """For each n, MOE_TMA on / off and fused None / True: routed == unrouted bitwise, and the
    routed moe_block launches no routing kernel (and no grouping where the tables fit)."""
    use_mma = dtype is DType.BFLOAT16
    for n in ns:
        x = dev(randn(rng, (n, hidden)))
        logits = dev(randn(rng, (n, experts + 1), 2.0))
        shared = dev(randn(rng, (n, hidden))) if n != 2 else None
        for tma in (False, True):
            monkeypatch.setattr(kmoe, "MOE_TMA", tma)
            tma_used = kmoe._tma_plan(use_mma, hidden) is not None
            for fused in (None, True):
                what = f"n={n} E={experts} K={top_k} {dtype.name} tma={tma} fused={fused}"
                take = (kmoe.FUSED and n * top_k <= kmoe.FUSED_DEFAULT_PAIRS
                        if fused is None else fused)
                fuse = take and kmoe.fused_applies(n, top_k, experts, use_mma)
                want, _, base_names = _routed_run(monkeypatch, x, logits, top_k, gu, dn, shared,
                                                  routed=False, fused=fused)
                got, route_names, names = _routed_run(monkeypatch, x, logits, top_k, gu, dn,
                                                      shared, routed=True, fused=fused)
                expect_route = (["moe_route_group"] if kmoe._route_j(experts, kmoe.ROUTE_GROUP_J)
                                else ["moe_route", "moe_group"])
                assert route_names == expect_route, (what, route_names)
                assert not set(names) & set(_ROUTING_LAUNCHES), (what, names)
                # the FMA kernels' groups hold NT pairs, the tables moe_route wrote GROUP_STRIDE
                regroup = not use_mma and kmoe.rows_tile(min(n, 8)) != kmoe.GROUP_STRIDE
                assert regroup is ("moe_group" in names), (what, names)
                assert ("moe_fused_down" in names) is fuse, (what, names, base_names)
                assert ("moe_tma_gate_up" in names) is tma_used, (what, names)
                assert ("moe_tma_gate_up" in base_names) is tma_used, (what, base_names)
                assert np.isfinite(host(got[3])).all(), f"{what}: non-finite output"
                for a, b, name in zip(got, want, ("weights", "ids", "act", "out")):
                    assert_same_bits(a, b, f"{name}: routed vs unrouted ({what})")


def test_moe_block_routed_equals_unrouted_35b_shape(rng, monkeypatch):
    """35B-A3B experts (H = 2048, Im = 512, E = 256 tiled from 8, top 8): B = 1 takes the fused
    path (TMA or rows gate_up, then fused down), B = 2 and 8 the four-launch path (or fused when
    forced)."""
    experts, top_k, hidden, inter, sub = 256, 8, 2048, 512, 8
    gu, dn, _, _ = _tiled_experts_35b(rng, experts, sub)
    assert dn.shape[2] == inter
    _check_routed(monkeypatch, rng, gu, dn, DType.BFLOAT16, hidden, experts, top_k, (1, 2, 8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden,inter,experts,top_k", [
    (1040, 200, 61, 5),   # odd E and top_k, Im % 16 != 0
    (136, 40, 600, 8),    # E > 512: moe_route_kernel + moe_group_kernel, never fused
])
def test_moe_block_routed_equals_unrouted_odd_shapes(rng, monkeypatch, dtype, hidden, inter,
                                                     experts, top_k):
    """f32 experts (the FMA kernels regroup with their own NT) and bf16, odd shapes."""
    _, gu = weight_pair(rng, (experts, 2 * inter, hidden), dtype, hidden ** -0.5)
    _, dn = weight_pair(rng, (experts, hidden, inter), dtype, inter ** -0.5)
    _check_routed(monkeypatch, rng, gu, dn, dtype, hidden, experts, top_k, (1, 2, 8))


def test_moe_block_routed_graph_replay_equals_eager_unrouted(rng):
    """ops.moe_route(workspace=) then ops.moe_block(routed=True) captured in one CUDA graph
    (the model's decode order), replayed on new inputs: bitwise eager moe_block (B = 1, 8)."""
    from ninfer.core.cuda import DeviceContext

    experts, top_k, hidden, inter, sub = 256, 8, 2048, 512, 8
    ctx = DeviceContext(0)
    with ctx.activate():
        gu, dn, _, _ = _tiled_experts_35b(rng, experts, sub)
        for n in (1, 8):
            x = dev(randn(rng, (n, hidden)))
            logits = dev(randn(rng, (n, experts + 1), 2.0))
            shared = dev(randn(rng, (n, hidden)))
            ws = _poisoned_ws(n, top_k, hidden, inter)
            w, ids = poisoned((n, top_k)), poisoned((n, top_k), np.int32)
            out = poisoned((n, hidden))

            def step():
                ops.moe_route(logits[:, :experts], top_k, w, ids, workspace=ws)
                ops.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out,
                              shared=shared, shared_gate=logits[:, experts:], workspace=ws,
                              routed=True)

            def eager():
                return _moe_block(x, logits, top_k, gu, dn, shared,
                                  workspace=_poisoned_ws(n, top_k, hidden, inter))

            refill = randn_refill(rng, (x, 1.0), (logits, 2.0), (shared, 1.0))
            assert_graph_replay_equals_eager(
                ctx, "moe_block_routed", step, refill,
                (w, ids, out, ws.act, ws.group_expert, ws.group_pairs, ws.num_groups),
                (w, ids, out), eager, ("weights", "ids", "out"),
                f"routed graph replay vs eager unrouted, n={n}")


# The routing on an extra block of the shared expert's gate_up GEMV (moe_route_with_swiglu;
# linear.cu linear_tma_swiglu_route_kernel): bitwise moe_route(..., workspace=) and
# linear_swiglu, group tables included.

def _swiglu_route_operands(rng, n, hidden, inter, experts):
    _, gate_up = weight_pair(rng, (2 * inter, hidden), DType.BFLOAT16, hidden ** -0.5)
    x = dev(randn(rng, (n, hidden), 2.0))
    logits = dev(randn(rng, (n, experts + 1), 2.0))  # [router | shared gate], rows strided
    return x, gate_up, logits[:, :experts]


def _tables(ws, n_pairs):
    """The group tables' live part: (num_groups, group_expert[:g], group_pairs[:8 g])."""
    g = int(host(ws.num_groups)[0])
    assert 1 <= g <= n_pairs, g
    return (host(ws.num_groups), host(ws.group_expert[:g]),
            host(ws.group_pairs[:g * kmoe.GROUP_STRIDE]))


def _swiglu_route_run(logits, top_k, x, gate_up, *, fused: bool):
    """(weights, ids, act, tables..., launch names) into poisoned outputs and workspace."""
    from ninfer.kernels_cuda import linear as klinear

    n, hidden = x.shape
    inter = gate_up.shape[0] // 2
    ws = _poisoned_ws(n, top_k, hidden, inter)
    w, ids, act = poisoned((n, top_k)), poisoned((n, top_k), np.int32), poisoned((n, inter))
    with launch_names(klinear, kmoe, attrs=("launch", "launch_dependent")) as names:
        if fused:
            assert ops.moe_route_with_swiglu_applies(logits, top_k, x, gate_up, workspace=ws)
            ops.moe_route_with_swiglu(logits, top_k, w, ids, x, gate_up, act, workspace=ws)
        else:
            ops.moe_route(logits, top_k, w, ids, workspace=ws)
            ops.linear_swiglu(x, gate_up, act)
    return (w, ids, act) + _tables(ws, n * top_k), names


@pytest.mark.parametrize("hidden,inter,experts,top_k", [
    (2048, 512, 256, 8),   # 35B-A3B: x in 2 register stages, 64 SwiGLU tiles + the router
    (1040, 200, 61, 5),    # odd E, top_k and tile counts
    (64, 24, 16, 4),       # one partial stage
    (4096, 136, 512, 10),  # E = 512 (moe_route_row<16> exactly), 4 stages
    (6144, 40, 40, 3),     # K > 5 stages: x read per stage (XS = 0)
])
def test_moe_route_with_swiglu_equals_two_ops_bitwise(rng, hidden, inter, experts, top_k):
    for n in (1, 2, 5, 8):
        x, gate_up, logits = _swiglu_route_operands(rng, n, hidden, inter, experts)
        what = f"n={n} H={hidden} I={inter} E={experts} K={top_k}"
        got, names = _swiglu_route_run(logits, top_k, x, gate_up, fused=True)
        want, base_names = _swiglu_route_run(logits, top_k, x, gate_up, fused=False)
        assert names == ["linear_swiglu_route"], (what, names)
        assert len(base_names) == 2, (what, base_names)
        assert np.isfinite(host(got[2])).all(), what
        labels = ("weights", "ids", "act", "num_groups", "group_expert", "group_pairs")
        for a, b, label in zip(got, want, labels, strict=True):
            assert_same_bits(a, b, f"{label}: one launch vs two ({what})")


@pytest.mark.parametrize("hidden,inter,experts,top_k", [(2048, 512, 256, 8), (1040, 200, 61, 5),
                                                      (6144, 40, 40, 3)])
def test_moe_route_with_swiglu_bf16_x_equals_f32_x_of_the_same_values(rng, hidden, inter,
                                                                       experts, top_k):
    """x as bf16 bits (an MoE layer's input under NINFER_MOE_BF16_X): the one launch
    (linear_tma_swiglu_route_kernel<..., IO = bf16 x>) gives the bits of the f32 x holding the
    same values, and of the two ops on the bf16 x."""
    for n in (1, 3, 8):
        x, gate_up, logits = _swiglu_route_operands(rng, n, hidden, inter, experts)
        bits = f32_to_bf16_bits(host(x))
        xb = dev(bits)
        xf = dev(bf16_bits_to_f32(bits).astype(np.float32))
        what = f"n={n} H={hidden} I={inter} E={experts} K={top_k}"
        got, names = _swiglu_route_run(logits, top_k, xb, gate_up, fused=True)
        assert names == ["linear_swiglu_route"], (what, names)
        want, _ = _swiglu_route_run(logits, top_k, xf, gate_up, fused=True)
        two, _ = _swiglu_route_run(logits, top_k, xb, gate_up, fused=False)
        assert np.isfinite(host(got[2])).all(), what
        labels = ("weights", "ids", "act", "num_groups", "group_expert", "group_pairs")
        for a, b, c, label in zip(got, want, two, labels, strict=True):
            assert_same_bits(a, b, f"{label}: bf16 x vs f32 x ({what})")
            assert_same_bits(a, c, f"{label}: one launch vs two on a bf16 x ({what})")


def test_moe_route_with_swiglu_vs_float64(rng):
    """The one-launch outputs against float64 (act at f32 accuracy: x split into bf16 hi + lo)
    and the reference routing (ids exact, weights at f32 accuracy)."""
    hidden, inter, experts, top_k, n = 1040, 200, 61, 5, 3
    x, gate_up, logits = _swiglu_route_operands(rng, n, hidden, inter, experts)
    (w, ids, act, *_), _ = _swiglu_route_run(logits, top_k, x, gate_up, fused=True)
    s = bf16_bits_to_f32(host(gate_up.data)).astype(np.float64)
    gu = host(x).astype(np.float64) @ s.T
    g, u = gu[:, :inter], gu[:, inter:]
    assert_close(host(act), g / (1.0 + np.exp(-g)) * u, TOL_F32)
    exp_w, exp_ids = ref.moe_route(host(logits), top_k)
    assert np.array_equal(host(ids), exp_ids)
    assert_close(host(w), exp_w, 1e-6)


def test_moe_route_with_swiglu_falls_back_outside_its_shapes(rng):
    """N = 9 (two column tiles) and E > 512: the two launches, the same contract."""
    for n, experts, top_k in ((9, 64, 4), (2, 600, 8)):
        x, gate_up, logits = _swiglu_route_operands(rng, n, 128, 32, experts)
        ws = _poisoned_ws(n, top_k, 128, 32)
        assert not ops.moe_route_with_swiglu_applies(logits, top_k, x, gate_up, workspace=ws)
        w, ids, act = poisoned((n, top_k)), poisoned((n, top_k), np.int32), poisoned((n, 32))
        ops.moe_route_with_swiglu(logits, top_k, w, ids, x, gate_up, act, workspace=ws)
        want, _ = _swiglu_route_run(logits, top_k, x, gate_up, fused=False)
        for a, b, label in zip((w, ids, act), want[:3], ("weights", "ids", "act")):
            assert_same_bits(a, b, f"{label}: fallback n={n} E={experts}")


def test_moe_route_with_swiglu_graph_replay_equals_eager(rng):
    """Captured in a CUDA graph with the expert stages after it (the decode order), replayed on
    new inputs: bitwise the eager moe_route + linear_swiglu + moe_block."""
    from ninfer.core.cuda import DeviceContext

    experts, top_k, hidden, inter, sub = 256, 8, 2048, 512, 8
    ctx = DeviceContext(0)
    with ctx.activate():
        gu, dn, _, _ = _tiled_experts_35b(rng, experts, sub)
        for n in (1, 8):
            x, shared_gu, _ = _swiglu_route_operands(rng, n, hidden, inter, experts)
            logits = dev(randn(rng, (n, experts + 1), 2.0))
            shared = dev(randn(rng, (n, hidden)))
            ws = _poisoned_ws(n, top_k, hidden, inter)
            w, ids = poisoned((n, top_k)), poisoned((n, top_k), np.int32)
            act, out = poisoned((n, inter)), poisoned((n, hidden))

            def step():
                ops.moe_route_with_swiglu(logits[:, :experts], top_k, w, ids, x, shared_gu, act,
                                          workspace=ws)
                ops.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out,
                              shared=shared, shared_gate=logits[:, experts:], workspace=ws,
                              routed=True)

            def eager():
                want, _ = _swiglu_route_run(logits[:, :experts], top_k, x, shared_gu,
                                            fused=False)
                e_out = poisoned((n, hidden))
                ew, eids = poisoned((n, top_k)), poisoned((n, top_k), np.int32)
                ops.moe_block(x, logits[:, :experts], top_k, gu, dn, ew, eids, e_out,
                              shared=shared, shared_gate=logits[:, experts:],
                              workspace=_poisoned_ws(n, top_k, hidden, inter))
                return [want[0], want[1], want[2], e_out]

            assert_graph_replay_equals_eager(
                ctx, "moe_route_with_swiglu", step,
                randn_refill(rng, (x, 2.0), (logits, 2.0), (shared, 1.0)),
                [w, ids, act, out], [w, ids, act, out], eager,
                ("weights", "ids", "act", "out"), f"n={n}")
