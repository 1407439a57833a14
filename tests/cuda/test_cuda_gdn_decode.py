"""The fused GDN decode step (gdn_decode.cu, its one kernel gdn_decode_fused_head2_kernel) on the
GPU: vs the unfused float64 references at the Qwen3.5 head ratios (fewer heads) for B = 1, 3, 8
over several steps, f32 and bf16 weights, odd sizes, the wide conv instance (kc 6), an
unaligned state and the full 9B head counts at B = 8; bitwise: a row alone == the row in a
batch, a CUDA graph replay == eager, PDL on == PDL off (behind a GEMV that writes qkv)."""
from __future__ import annotations

import numpy as np
import pytest
from cuda_testutil import (
    DTYPES,
    assert_close,
    assert_same_bits,
    cp,
    dev,
    host,
    poisoned,
    randn,
    rows_view,
    slot_strided,
    weight_pair,
)

from ninfer.core.dtypes import DType
from ninfer.kernels_cuda import _loader
from ninfer.kernels_cuda import gdn_decode as kdec
from ninfer.ops import reference as ref

pytestmark = pytest.mark.gpu

EPS = 1e-6
# (hk, hv, dk, dv): the Qwen3.5 ratios with fewer heads, plus odd sizes (partial column groups)
SHAPES = {"0.8b": (2, 2, 128, 128), "9b": (2, 4, 128, 128), "27b": (2, 6, 128, 128),
          "35b": (1, 2, 128, 128), "odd": (3, 6, 72, 80)}
# slot_strided pads each slot's image by PAD floats on both sides: 8 keeps the state 16-byte
# aligned (as StateImageStorage does), 7 does not
ALIGNED, UNALIGNED = 8, 7


class Problem:
    """Random weights and per-slot states (host float64 oracle copy and device copy)."""

    def __init__(self, rng, hk, hv, dk, dv, wdtype, *, kc=4, num_slots=12, pad=ALIGNED):
        self.rng, self.hk, self.hv, self.dk, self.dv, self.kc = rng, hk, hv, dk, dv, kc
        self.c = 2 * hk * dk + hv * dv
        self.conv_h, self.conv_d, _ = slot_strided(rng, num_slots, (kc - 1, self.c))
        self.st_h, self.st_d, _ = slot_strided(rng, num_slots, (hv, dk, dv), pad=pad,
                                               scale=0.1)
        self.cw_h, self.cw_d = weight_pair(rng, (self.c, kc), wdtype, scale=0.5)
        self.alog_h, self.alog_d = weight_pair(rng, (hv,), wdtype, scale=0.5)
        self.dt_h, self.dt_d = weight_pair(rng, (hv,), wdtype)
        self.nw_h, self.nw_d = weight_pair(rng, (dv,), wdtype)
        self.num_slots = num_slots

    def inputs(self, n):
        """One step's activations for n rows: (host arrays, device arrays), qkv rows strided."""
        qkv_h, qkv_d = rows_view(self.rng, (n, self.c), pad=6)
        a, b = randn(self.rng, (n, self.hv)), randn(self.rng, (n, self.hv))
        z = randn(self.rng, (n, self.hv, self.dv))
        return (qkv_h, a, b, z), (qkv_d, dev(a), dev(b), dev(z))

    def slots(self, n):
        return self.rng.choice(self.num_slots, n, replace=False).astype(np.int32)

    def reference(self, host_in, slots):
        """The float64 oracle for one step; advances the host conv state and state."""
        qkv, a, b, z = host_in
        n, hk, dk = qkv.shape[0], self.hk, self.dk
        starts = np.arange(n + 1, dtype=np.int32)
        u, self.conv_h = ref.gdn_conv(qkv, self.cw_h, self.conv_h, starts, slots)
        q = ref.l2norm_heads(u[:, :hk * dk].reshape(n, hk, dk), 1e-6, dk ** -0.5)
        k = ref.l2norm_heads(u[:, hk * dk:2 * hk * dk].reshape(n, hk, dk), 1e-6, 1.0)
        v = u[:, 2 * hk * dk:].reshape(n, self.hv, self.dv)
        g, beta = ref.gdn_gates(a, b, self.alog_h, self.dt_h)
        o, self.st_h = ref.gdn_recurrence(q, k, v, g, beta, self.st_h, starts, slots)
        return ref.gated_rms_norm(o, z, self.nw_h, EPS)

    def run(self, dev_in, slots_d, out, counters, *, conv=None, state=None):
        qkv, a, b, z = dev_in
        kdec.gdn_decode_fused(qkv, self.cw_d, self.conv_d if conv is None else conv, a, b,
                              self.alog_d, self.dt_d, self.st_d if state is None else state,
                              slots_d, z, self.nw_d, EPS, out, counters=counters)


def _check_vs_reference(prob, batches, steps=3):
    counters = kdec.decode_counters(max(batches), prob.hk)
    for n in batches:
        for step in range(steps):
            slots = prob.slots(n)
            host_in, dev_in = prob.inputs(n)
            expect = prob.reference(host_in, slots)
            out = poisoned((n, prob.hv, prob.dv))
            prob.run(dev_in, dev(slots), out, counters)
            what = f"B={n} step {step} slots {slots.tolist()}"
            assert_close(out, expect, 5e-5, f"{what}: output")
            assert_close(prob.conv_d, prob.conv_h, 1e-7, f"{what}: conv state")
            assert_close(prob.st_d, prob.st_h, 5e-5, f"{what}: state")
            assert int(host(counters).sum()) == 0, f"{what}: counters not reset"


@pytest.mark.parametrize("wdtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_decode_vs_float64(rng, shape, wdtype):
    hk, hv, dk, dv = SHAPES[shape]
    _check_vs_reference(Problem(rng, hk, hv, dk, dv, wdtype), (1, 3, 8))


@pytest.mark.parametrize("shape", [(2, 4, 128, 96), SHAPES["odd"]], ids=["dv96", "odd"])
def test_wide_conv_kernel_vs_float64(rng, shape):
    """kc = 6 runs the instance with the wider conv windows (MAXK 7); odd: dk 72, dv 80, so
    partial column groups and rows."""
    hk, hv, dk, dv = shape
    _check_vs_reference(Problem(rng, hk, hv, dk, dv, DType.FLOAT32, kc=6), (1, 3), steps=2)


def test_unaligned_state(rng):
    """A state that is not 16-byte aligned (slot images offset by 7 floats): the kernel reads it
    element by element."""
    prob = Problem(rng, 2, 4, 128, 128, DType.BFLOAT16, pad=UNALIGNED)
    _check_vs_reference(prob, (1, 3), steps=2)


def _copies(prob):
    c = cp()
    return c.array(prob.conv_d), c.array(prob.st_d)


@pytest.mark.parametrize("shape", ["27b", "odd"])
def test_row_alone_equals_batch_bitwise(rng, shape):
    """Each row's output and state do not depend on the batch size or on which rows share a
    launch: rows alone, the full batch, and subsets give the same bits."""
    hk, hv, dk, dv = SHAPES[shape]
    prob = Problem(rng, hk, hv, dk, dv, DType.BFLOAT16)
    n = 8
    counters = kdec.decode_counters(n, hk)
    conv0, st0 = _copies(prob)
    for step in range(2):
        slots = prob.slots(n)
        _, (qkv, a, b, z) = prob.inputs(n)
        conv_b, st_b = conv0.copy(), st0.copy()
        out_b = poisoned((n, hv, dv))
        prob.run((qkv, a, b, z), dev(slots), out_b, counters, conv=conv_b, state=st_b)
        conv_r, st_r = conv0.copy(), st0.copy()
        out_r = poisoned((n, hv, dv))
        for i in range(n):
            sl = slice(i, i + 1)
            prob.run((qkv[sl], a[sl], b[sl], z[sl]), dev(slots[sl]), out_r[sl], counters,
                     conv=conv_r, state=st_r)
        assert_same_bits(out_r, out_b, f"step {step}: out, rows alone vs batch of {n}")
        assert_same_bits(st_r, st_b, f"step {step}: state, rows alone vs batch")
        assert_same_bits(conv_r, conv_b, f"step {step}: conv state, rows alone vs batch")
        for sub in (np.array([5, 1, 6]), np.array([7, 2])):
            conv_s, st_s = conv0.copy(), st0.copy()
            out_s = poisoned((len(sub), hv, dv))
            subd = dev(sub)
            prob.run((qkv[subd], a[subd], b[subd], z[subd]), dev(slots[sub]), out_s, counters,
                     conv=conv_s, state=st_s)
            assert_same_bits(out_s, out_b[subd], f"step {step}: out, rows {sub.tolist()} vs batch")
        conv0, st0 = conv_b, st_b
        assert int(host(counters).sum()) == 0


def test_full_9b_heads_b8(rng):
    """The 9B head counts (Hk 16, Hv 32, dk = dv = 128: the constant-stride state path) at
    B = 8, 256 blocks (2 per SM on the H200): vs the float64 reference (output, state, conv
    state, counters reset), 2 steps."""
    prob = Problem(rng, 16, 32, 128, 128, DType.BFLOAT16, num_slots=10)
    _check_vs_reference(prob, (8,), steps=2)


class Chain:
    """A decode-like chain: a GEMV writes qkv (PDL-launched on sm_90), the fused decode step
    reads it, a second GEMV reads the decode output."""

    def __init__(self, rng, n, hk=2, hv=4, dk=128, dv=128, hidden=256):
        self.prob = Problem(rng, hk, hv, dk, dv, DType.BFLOAT16)
        c = cp()
        self.n, self.hv, self.dv = n, hv, dv
        self.x = c.asarray(randn(rng, (n, hidden)))
        _, self.w_in = weight_pair(rng, (self.prob.c, hidden), DType.BFLOAT16, hidden ** -0.5)
        _, self.w_out = weight_pair(rng, (hidden, hv * dv), DType.BFLOAT16, (hv * dv) ** -0.5)
        self.qkv = c.empty((n, self.prob.c), np.float32)
        _, (_, self.a, self.b, self.z) = self.prob.inputs(n)
        self.out = c.empty((n, hv, dv), np.float32)
        self.y = c.empty((n, hidden), np.float32)
        self.slots = dev(self.prob.slots(n))
        self.counters = kdec.decode_counters(n, hk)

    def step(self):
        from ninfer.kernels_cuda import linear

        linear.linear(self.x, self.w_in, self.qkv, batch_invariant=True)
        self.prob.run((self.qkv, self.a, self.b, self.z), self.slots, self.out, self.counters)
        linear.linear(self.out.reshape(self.n, self.hv * self.dv), self.w_out, self.y,
                      batch_invariant=True)

    def snapshot(self):
        return [v.copy() for v in (self.out, self.y, self.prob.conv_d, self.prob.st_d)]

    def restore(self, conv, state):
        self.prob.conv_d[...], self.prob.st_d[...] = conv, state


NAMES = ("out", "y", "conv state", "state")


def _chain_with_inputs(rng, n):
    """A Chain of n rows, copies of its starting conv state and state, and 3 fresh inputs."""
    ch = Chain(rng, n)
    conv0, st0 = _copies(ch.prob)
    return ch, conv0, st0, [cp().asarray(randn(rng, ch.x.shape)) for _ in range(3)]


CHAIN_ROWS = [1, 3, 8]


@pytest.mark.parametrize("n", CHAIN_ROWS)
def test_graph_replay_equals_eager_bitwise(rng, n):
    from ninfer.core.cuda import CudaGraph, DeviceContext

    ctx = DeviceContext(0)
    with ctx.activate():
        ch, conv0, st0, xs = _chain_with_inputs(rng, n)
        ch.step()  # compile / warm up outside the capture
        ctx.synchronize()
        ch.restore(conv0, st0)
        graph = CudaGraph("gdn decode chain")
        with graph.capture(ctx.stream):
            ch.step()
        replays = []
        for x in xs:
            ch.x[...] = x
            graph.launch(ctx.stream)
            replays.append(ch.snapshot())
        ctx.synchronize()
        graph.destroy()
        ch.restore(conv0, st0)
        for i, x in enumerate(xs):
            ch.x[...] = x
            ch.step()
            for name, got, want in zip(NAMES, ch.snapshot(), replays[i]):
                assert_same_bits(got, want, f"step {i}: {name}, eager vs graph replay")
        assert int(host(ch.counters).sum()) == 0


@pytest.mark.parametrize("n", CHAIN_ROWS)
def test_pdl_on_equals_off_bitwise(rng, monkeypatch, n):
    """The decode kernel reads S before pdl_wait and qkv after it: behind a GEMV that writes qkv
    (and before one that reads its output), PDL launches give the bits of plain launches."""
    from ninfer.core.cuda import DeviceContext

    ctx = DeviceContext(0)
    with ctx.activate():
        ch, conv0, st0, xs = _chain_with_inputs(rng, n)
        runs = {}
        for pdl in (False, True):
            monkeypatch.setattr(_loader, "_PDL", pdl)
            ch.restore(conv0, st0)
            runs[pdl] = []
            for x in xs:
                ch.x[...] = x
                ch.out.fill(np.nan)
                ch.step()
                runs[pdl].append(ch.snapshot())
        ctx.synchronize()
    for i in range(len(xs)):
        for name, on, off in zip(NAMES, runs[True][i], runs[False][i]):
            assert_same_bits(on, off, f"step {i}: {name}, PDL on vs off")
    assert int(host(ch.counters).sum()) == 0


def test_state_l2_last_same_bits(rng, monkeypatch):
    """NINFER_GDN_STATE_L2_LAST (kdec.STATE_L2_LAST: the state's loads and stores with an L2
    evict-last policy, the SOURCE_L2_LAST build) gives the same output, state and conv state
    bits as the plain build at B = 1, 3 and 8 over 3 steps at dk = dv = 128, and the odd shape
    (the policy only on the dk = dv = 128 path) stays within float64 tolerance."""
    sources = []
    real = kdec.get_function
    monkeypatch.setattr(kdec, "get_function",
                        lambda src, name: sources.append(src.options) or real(src, name))
    hk, hv, dk, dv = SHAPES["9b"]
    prob = Problem(rng, hk, hv, dk, dv, DType.BFLOAT16)
    counters = kdec.decode_counters(8, hk)
    conv0, st0 = _copies(prob)
    for step, n in enumerate((1, 3, 8)):
        slots = dev(prob.slots(n))
        _, dev_in = prob.inputs(n)
        runs = {}
        for on in (False, True):
            monkeypatch.setattr(kdec, "STATE_L2_LAST", on)
            conv, st, out = conv0.copy(), st0.copy(), poisoned((n, hv, dv))
            sources.clear()
            prob.run(dev_in, slots, out, counters, conv=conv, state=st)
            assert sources == [kdec.SOURCE_L2_LAST.options if on else ()], sources
            runs[on] = (out, st, conv)
        for got, want, what in zip(runs[True], runs[False], ("out", "state", "conv state"),
                                   strict=True):
            assert_same_bits(got, want, f"step {step} B={n}: {what}, evict-last vs plain")
        assert np.isfinite(host(runs[True][0])).all()
        conv0, st0 = runs[True][2], runs[True][1]
    _check_vs_reference(Problem(rng, *SHAPES["odd"], DType.FLOAT32), (1, 3), steps=2)
