"""CUDA graph capture/replay through cuda-python: a decode-like chain of our kernels is
captured once, replayed with new contents in the same device buffers, and must equal an eager
run bitwise; memory snapshots around capture and destroy are reported."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.core.cuda import CudaGraph, DeviceContext, GraphMemoryReport, snapshot
from ninfer.core.dtypes import DType
from ninfer.kernels_cuda import attention, elementwise, gdn, linear, norm, sampling
from ninfer.kernels_cuda.gdn_decode import decode_counters

from cuda_testutil import assert_same_bits, cp, randn, weight_pair

pytestmark = pytest.mark.gpu

N, H, M, HEADS, HKV, D, PAGE = 12, 256, 384, 4, 2, 64, 16


def _buffers(rng):
    c = cp()
    b = dict(x=c.asarray(randn(rng, (N, H))), y=c.empty((N, H), np.float32),
             z=c.empty((N, M), np.float32), r=c.asarray(randn(rng, (N, M))),
             q=c.asarray(randn(rng, (N, HEADS, D))), att=c.empty((N, HEADS, D), np.float32),
             kp=c.asarray(randn(rng, (40, HKV, PAGE, D))),
             vp=c.asarray(randn(rng, (40, HKV, PAGE, D))),
             bt=c.asarray(rng.permutation(40).reshape(2, 20).astype(np.int32)),
             row_seq=c.asarray((np.arange(N) % 2).astype(np.int32)),
             row_pos=c.asarray(rng.integers(0, 20 * PAGE, N).astype(np.int32)))
    b["ws"] = attention.AttentionWorkspace.allocate(N, HEADS, D, 20 * PAGE)
    _, b["w_norm"] = weight_pair(rng, (H,), DType.BFLOAT16, 0.3)
    _, b["w_lin"] = weight_pair(rng, (M, H), DType.BFLOAT16, H ** -0.5)
    return b


def _step(b):
    norm.rms_norm(b["x"], b["w_norm"], 1e-6, b["y"], zero_centered=True)
    # N = 12 > 8: the GEMV (capturable, batch invariant) rather than eager cuBLAS
    linear.linear(b["y"], b["w_lin"], b["z"], batch_invariant=True)
    elementwise.add_inplace(b["z"], b["r"])
    attention.paged_attention(b["q"], b["kp"], b["vp"], b["bt"], b["row_seq"], b["row_pos"],
                              D ** -0.5, b["att"], workspace=b["ws"])


def test_capture_replay_equals_eager(rng):
    ctx = DeviceContext(0)
    with ctx.activate():
        b = _buffers(rng)
        _step(b)  # warm-up: compiles and loads the modules outside the capture
        ctx.synchronize()
        before = snapshot("before")
        graph = CudaGraph("decode-like")
        with graph.capture(ctx.stream):
            _step(b)
        after = snapshot("captured")
        assert graph.ready and graph.num_nodes() >= 4
        for _ in range(2):  # replay with new inputs in the same buffers
            b["x"][...] = cp().asarray(randn(rng, (N, H)))
            b["q"][...] = cp().asarray(randn(rng, (N, HEADS, D)))
            graph.launch(ctx.stream)
            ctx.synchronize()
            got_z, got_att = b["z"].copy(), b["att"].copy()
            _step(b)  # eager rerun on the same inputs
            ctx.synchronize()
            assert_same_bits(got_z, b["z"], "linear chain")
            assert_same_bits(got_att, b["att"], "attention")
        graph.destroy()
        report = GraphMemoryReport(before, after, snapshot("destroyed"))
        assert isinstance(report.calibration_growth, int) and "graphs:" in report.describe()


@pytest.mark.parametrize("dtype", [DType.FLOAT32, DType.BFLOAT16])
def test_captured_cublas_linear_equals_eager(rng, dtype):
    """A 20-row linear takes cuBLAS (through ctypes, bound to the capturing stream with a fixed
    workspace) inside a capture too; the replay equals the eager call bit for bit."""
    ctx = DeviceContext(0)
    with ctx.activate():
        x = cp().asarray(randn(rng, (20, 128)))
        _, w = weight_pair(rng, (64, 128), dtype)
        out_graph, out_eager = cp().empty((20, 64), np.float32), cp().empty((20, 64), np.float32)
        staging = cp().empty(20 * 128, np.uint16)
        linear.linear(x, w, out_eager, workspace=staging)
        ctx.synchronize()
        graph = CudaGraph("linear")
        with graph.capture(ctx.stream):
            linear.linear(x, w, out_graph, workspace=staging)
        out_graph.fill(np.nan)
        ctx.synchronize()
        graph.launch(ctx.stream)
        ctx.synchronize()
        assert_same_bits(out_graph, out_eager, "captured linear")
        graph.destroy()


def test_fused_decode_and_sampler_replay(rng):
    """The GDN fused decode (with its counters) and the sampler replay correctly many times."""
    hk, hv, dk, dv, kc, n, vocab = 2, 4, 64, 64, 4, 3, 3000
    c = 2 * hk * dk + hv * dv
    ctx = DeviceContext(0)
    with ctx.activate():
        cpm = cp()
        qkv = cpm.asarray(randn(rng, (n, c)))
        conv = cpm.asarray(randn(rng, (4, kc - 1, c)))
        state = cpm.asarray(randn(rng, (4, hv, dk, dv), 0.1))
        a, bb = cpm.asarray(randn(rng, (n, hv))), cpm.asarray(randn(rng, (n, hv)))
        z = cpm.asarray(randn(rng, (n, hv, dv)))
        ws = [weight_pair(rng, s, DType.FLOAT32)[1] for s in ((c, kc), (hv,), (hv,), (dv,))]
        slots = cpm.asarray(np.array([1, 3, 0], np.int32))
        counters = decode_counters(n, hk)
        out = cpm.empty((n, hv, dv), np.float32)
        logits = cpm.asarray(randn(rng, (n, vocab)))
        samp = dict(temperature=cpm.full(n, 0.8, np.float32), top_k=cpm.full(n, 20, np.int32),
                    top_p=cpm.full(n, 0.9, np.float32), min_p=cpm.zeros(n, np.float32),
                    rep=cpm.ones(n, np.float32), pres=cpm.zeros(n, np.float32),
                    freq=cpm.zeros(n, np.float32),
                    seeds=cpm.asarray(np.arange(n, dtype=np.uint64) + 7),
                    counters=cpm.zeros(n, np.int64), off=cpm.zeros(n + 1, np.int32),
                    toks=cpm.zeros(1, np.int32), cnts=cpm.zeros(1, np.int32))
        tokens, lps = cpm.empty(n, np.int32), cpm.empty(n, np.float32)
        top_ids, top_lp = cpm.empty((n, 2), np.int32), cpm.empty((n, 2), np.float32)
        scratch = cpm.empty((n, vocab), np.float32)

        def step():
            gdn.gdn_decode_fused(qkv, ws[0], conv, a, bb, ws[1], ws[2], state, slots, z, ws[3],
                                 1e-6, out, counters=counters)
            sampling.sample(logits, *samp.values(), tokens, lps, top_ids, top_lp,
                            scratch=scratch)

        conv0, state0 = conv.copy(), state.copy()
        step()
        ctx.synchronize()
        conv[...], state[...] = conv0, state0
        graph = CudaGraph("gdn+sample")
        with graph.capture(ctx.stream):
            step()
        results = []
        for _ in range(3):
            graph.launch(ctx.stream)
            results.append((out.copy(), tokens.copy(), conv.copy(), state.copy()))
        ctx.synchronize()
        graph.destroy()
        conv[...], state[...] = conv0, state0
        for i, (exp_out, exp_tokens, exp_conv, exp_state) in enumerate(results):
            step()
            assert_same_bits(exp_out, out, f"replay {i}: out")
            assert_same_bits(exp_tokens, tokens, f"replay {i}: tokens")
            assert_same_bits(exp_conv, conv, f"replay {i}: conv state")
            assert_same_bits(exp_state, state, f"replay {i}: state")
        assert int(counters.sum()) == 0
