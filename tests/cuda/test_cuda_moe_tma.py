"""moe_tma_gate_up_kernel (NINFER_MOE_TMA, kmoe.MOE_TMA): the gate_up + SwiGLU stage on a
bulk-copy ring must equal moe_mma_rows_kernel<1> bit for bit (same K split, fragments, mma and
reduction orders) on the same group tables, and moe_block with the switch on must equal it off
(weights, ids, act, output), eagerly and replayed from a CUDA graph. Needs sm_90."""
from __future__ import annotations

import numpy as np
import pytest
from cuda_testutil import (assert_close, assert_graph_replay_equals_eager, assert_same_bits, cp,
                           dev, host, poisoned, randn, randn_refill, tiled_experts)

from ninfer.core.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda import moe as kmoe
from ninfer.kernels_cuda.linear import tma_ok
from ninfer.ops import reference as ref

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _sm90():
    if not tma_ok(16):
        pytest.skip("moe_tma_gate_up_kernel needs sm_90")


def _tiled_experts(rng, experts, sub, rows, k):
    """(float64 values of `sub` distinct experts, device bf16 [experts, rows, K] view): expert e
    has expert e % sub's weights; rows padded with NaN up to a 16-byte aligned stride (a kernel
    that reads past K and does not zero turns its output into NaN)."""
    stride = -(-k // 8) * 8 + 8
    bits = f32_to_bf16_bits((rng.standard_normal((sub, rows, k)) * k ** -0.5).astype(np.float32))
    full = np.full((sub, rows, stride), 0x7FC0, dtype=np.uint16)
    full[..., :k] = bits
    d = cp().tile(dev(full), (-(-experts // sub), 1, 1))[:experts]
    return bf16_bits_to_f32(bits).astype(np.float64), d[..., :k]


def _x(rng, n, k):
    """(host, device) f32 [n, K] rows with NaN around them (16-byte aligned, stride % 4 == 0)."""
    stride = -(-k // 4) * 4 + 8
    full = np.full((n, stride), np.nan, dtype=np.float32)
    full[:, 4:4 + k] = randn(rng, (n, k), 3.0)
    return full[:, 4:4 + k], dev(full)[:, 4:4 + k]


def _routing(rng, n, experts, top_k):
    return np.stack([rng.choice(experts, top_k, replace=False)
                     for _ in range(n)]).astype(np.int32)


def _plans(k):
    """The default plan and two others (short stages, more per item; a single-buffered ring):
    all must give the same bits."""
    plans = [kmoe.tma_gate_up_plan(k), kmoe.tma_gate_up_plan(k, target_sk=256)]
    p = plans[0]
    fixed = p.smem - p.stages * 16 * kmoe.tma_pitch(p.sk)  # barriers and partials
    one = kmoe.tma_gate_up_plan(k, smem_limit=fixed + p.per_item * 16 * kmoe.tma_pitch(p.sk))
    assert one is not None and one.stages == one.per_item, one  # one item in flight
    return plans + [one]


def _stage(w_d, x_d, ids, m, experts, by_pair, plan, item_pairs=None, x_regs=None):
    """act [pairs, m] of moe_tma_gate_up_kernel (plan; `item_pairs`: its consumers take two
    items at a time; `x_regs`: x held in registers) or moe_mma_rows_kernel<1> (None) on the
    group tables of ids (device), into a NaN-poisoned buffer."""
    n, top_k = ids.shape
    ws = kmoe.MoeWorkspace.allocate(n, top_k, 8, 8)  # only the group tables are used
    kmoe._group(ids, kmoe.GROUP_STRIDE, ws)
    out = poisoned((ids.size, m))
    k = x_d.shape[1]
    w_rs = C.row_stride(w_d[0], "w")
    args = (w_d, w_rs, w_d.shape[1] * w_rs, x_d, C.row_stride(x_d, "x"), by_pair, out, m, k)
    kw = dict(top_k=top_k, experts=experts, ws=ws, pairs=ids.size)
    if plan is None:
        kmoe.launch_mma(*args, swiglu=True, up_offset=m, rows=True, **kw)
    else:
        kmoe.launch_tma_gate_up(*args, plan=plan, item_pairs=item_pairs, x_regs=x_regs, **kw)
    return out


@pytest.mark.parametrize("m,k", [(512, 2048), (200, 1040), (512, 1040), (200, 2048), (200, 2032),
                                 (512, 1520)])
@pytest.mark.parametrize("experts,top_k", [(256, 8), (61, 5)])
def test_tma_gate_up_equals_rows_kernel_bitwise(rng, m, k, experts, top_k):
    w, w_d = _tiled_experts(rng, experts, 12, 2 * m, k)
    plans = _plans(k)
    for n in (1, 2, 5, 8):
        by_pair = int(n == 5)  # x rows by pair once (the kernel takes both)
        ids_h = _routing(rng, n, experts, top_k)
        if n >= 5:
            ids_h[2] = ids_h[0][::-1]  # shared experts across rows (groups of > 1 pair)
        ids = dev(ids_h)
        x_h, x_d = _x(rng, n * top_k if by_pair else n, k)
        want = _stage(w_d, x_d, ids, m, experts, by_pair, None)
        assert np.isfinite(host(want)).all(), f"n={n}: rows kernel output not finite"
        # x in registers (moe_tma_gate_up_kernel<1>) where one x row feeds every pair
        xr_ok = kmoe.tma_x_regs_ok(k, plans[0].splits, by_pair, ids_h.size, top_k)
        assert xr_ok == (n == 1 and k != 1040), (n, k)  # K = 1040: 9 steps per warp
        for plan in plans:
            for item_pairs in (False, True):  # one item at a time, or two (rings of >= 2)
                for x_regs in (False, True) if xr_ok else (False,):
                    got = _stage(w_d, x_d, ids, m, experts, by_pair, plan, item_pairs, x_regs)
                    assert_same_bits(got, want, f"m={m} k={k} E={experts} K={top_k} n={n} "
                                                f"{plan} pairs={item_pairs} x_regs={x_regs}")
        if n == 2:  # and the values (float64 oracle)
            expect = np.empty((ids_h.size, m))
            for pr, e in enumerate(ids_h.reshape(-1)):
                y = w[e % 12] @ x_h[pr if by_pair else pr // top_k].astype(np.float64)
                expect[pr] = ref.swiglu(y[None])[0]
            assert_close(want, expect)


@pytest.mark.parametrize("xpipe", [True, False])
@pytest.mark.parametrize("m,k", [(512, 2048), (200, 1040), (200, 2032), (512, 1520)])
def test_tma_gate_up_x_pipelined_equals_rows_kernel_bitwise(rng, monkeypatch, m, k, xpipe):
    """NINFER_MOE_TMA_XPIPE (kmoe.TMA_XPIPE; moe.cu MOE_TMA_XPIPE; default on) and off: each
    consumer warp's next batch of x loads issued before the current batch's mmas, or after them.
    Bitwise the rows kernel for every plan, one or two items at a time, x rows by token and by
    pair, with groups of > 1 pair."""
    monkeypatch.setattr(kmoe, "TMA_XPIPE", xpipe)
    experts, top_k = 256, 8
    _, w_d = _tiled_experts(rng, experts, 12, 2 * m, k)
    for n in (2, 5, 8):
        by_pair = int(n == 5)
        ids_h = _routing(rng, n, experts, top_k)
        ids_h[n - 1] = ids_h[0][::-1]  # shared experts across rows (groups of > 1 pair)
        ids = dev(ids_h)
        _, x_d = _x(rng, n * top_k if by_pair else n, k)
        want = _stage(w_d, x_d, ids, m, experts, by_pair, None)
        assert np.isfinite(host(want)).all(), f"n={n}: rows kernel output not finite"
        for plan in _plans(k):
            for item_pairs in (False, True):
                got = _stage(w_d, x_d, ids, m, experts, by_pair, plan, item_pairs, False)
                assert_same_bits(got, want, f"m={m} k={k} n={n} {plan} pairs={item_pairs}")


def test_tma_gate_up_bad_expert_rows_are_nan(rng):
    """Expert ids outside [0, E): NaN rows (weights never copied), bitwise the rows kernel."""
    experts, top_k, n, m, k = 16, 4, 3, 40, 1040
    _, w_d = _tiled_experts(rng, experts, 4, 2 * m, k)
    ids_h = _routing(rng, n, experts, top_k)
    ids_h[1, 0], ids_h[2, 3] = experts, -1
    ids = dev(ids_h)
    _, x_d = _x(rng, n, k)
    want = host(_stage(w_d, x_d, ids, m, experts, 0, None))
    got = host(_stage(w_d, x_d, ids, m, experts, 0, kmoe.tma_gate_up_plan(k)))
    assert_same_bits(got, want, "bad experts")
    bad = [1 * top_k + 0, 2 * top_k + 3]
    assert np.isnan(got[bad]).all()
    assert np.isfinite(np.delete(got, bad, axis=0)).all()


def _experts(rng, experts, sub, hidden, inter):
    return tiled_experts(rng, experts, hidden, inter, sub)[:2]


def _block(monkeypatch, tma, x, logits, top_k, gu, dn, shared, fused):
    """kmoe.moe_block with MOE_TMA = tma into poisoned outputs and workspace; counts the TMA
    gate_up launches."""
    monkeypatch.setattr(kmoe, "MOE_TMA", tma)
    calls = []
    real = kmoe.launch_tma_gate_up
    monkeypatch.setattr(kmoe, "launch_tma_gate_up",
                        lambda *a, **kw: (calls.append(1), real(*a, **kw)))
    n, experts = logits.shape[0], logits.shape[1] - 1
    hidden, inter = x.shape[1], dn.shape[2]
    ws = kmoe.MoeWorkspace.allocate(n, top_k, hidden, inter)
    ws.act.fill(np.nan)
    ws.y.fill(np.nan)
    for a in (ws.group_expert, ws.group_pairs, ws.num_groups):
        a.fill(-7)
    w, ids, out = poisoned((n, top_k)), poisoned((n, top_k), np.int32), poisoned((n, hidden))
    gate = logits[:, experts:] if shared is not None else None
    kmoe.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out, shared=shared,
                   shared_gate=gate, workspace=ws, fused=fused)
    monkeypatch.setattr(kmoe, "launch_tma_gate_up", real)
    return (w, ids, ws.act[:n * top_k], out), len(calls)


@pytest.mark.parametrize("n,hidden,inter,experts,top_k,sub", [
    (1, 2048, 512, 256, 8, 8),  # 35B-A3B, B = 1: the fused path (route_group, TMA, down)
    (8, 2048, 512, 256, 8, 8),  # B = 8: 64 pairs, the four-launch path by default
    (2, 1040, 200, 61, 5, 7),    # odd E, odd top_k, Im % 16 != 0
    (5, 1040, 200, 61, 5, 7),
])
@pytest.mark.parametrize("fused", [None, True, False])
@pytest.mark.parametrize("prewait", [False, True])
def test_moe_block_tma_on_equals_off(rng, monkeypatch, n, hidden, inter, experts, top_k, sub,
                                     fused, prewait):
    """... with the fused down stage's L2 prefetch before its PDL wait (DOWN_PREWAIT) on or off
    in the TMA run: the same bits."""
    gu, dn = _experts(rng, experts, sub, hidden, inter)
    x = dev(randn(rng, (n, hidden)))
    logits = dev(randn(rng, (n, experts + 1), 2.0))
    shared = dev(randn(rng, (n, hidden))) if n != 2 else None
    monkeypatch.setattr(kmoe, "DOWN_PREWAIT", prewait)
    on, calls = _block(monkeypatch, True, x, logits, top_k, gu, dn, shared, fused)
    assert calls == 1, "the TMA gate_up did not run"
    monkeypatch.setattr(kmoe, "DOWN_PREWAIT", False)
    off, calls = _block(monkeypatch, False, x, logits, top_k, gu, dn, shared, fused)
    assert calls == 0
    assert np.isfinite(host(on[3])).all(), "non-finite output"
    for a, b, what in zip(on, off, ("weights", "ids", "act", "out")):
        assert_same_bits(a, b, f"{what}: MOE_TMA on vs off (n={n}, fused={fused})")


def test_moe_block_tma_graph_replay_equals_eager_off(rng, monkeypatch):
    """moe_block with MOE_TMA on captured in a CUDA graph (workspace preallocated), replayed on
    new inputs: bitwise the eager launches with it off (B = 1 fused path and B = 8)."""
    from ninfer.core.cuda import DeviceContext

    hidden, inter, experts, top_k = 2048, 512, 256, 8
    ctx = DeviceContext(0)
    with ctx.activate():
        gu, dn = _experts(rng, experts, 8, hidden, inter)
        for n in (1, 8):
            x = dev(randn(rng, (n, hidden)))
            logits = dev(randn(rng, (n, experts + 1), 2.0))
            shared = dev(randn(rng, (n, hidden)))
            ws = kmoe.MoeWorkspace.allocate(n, top_k, hidden, inter)
            w, ids = poisoned((n, top_k)), poisoned((n, top_k), np.int32)
            out = poisoned((n, hidden))

            def step():
                kmoe.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out,
                               shared=shared, shared_gate=logits[:, experts:], workspace=ws)

            def eager():
                monkeypatch.setattr(kmoe, "MOE_TMA", False)
                step()
                monkeypatch.setattr(kmoe, "MOE_TMA", True)
                return w, ids, ws.act[:n * top_k], out

            monkeypatch.setattr(kmoe, "MOE_TMA", True)
            refill = randn_refill(rng, (x, 1.0), (logits, 2.0), (shared, 1.0))
            assert_graph_replay_equals_eager(
                ctx, "moe_block_tma", step, refill,
                (w, ids, out, ws.act), (w, ids, ws.act[:n * top_k], out), eager,
                ("weights", "ids", "act", "out"), f"graph replay (TMA) vs eager (off), n={n}")


def _bf16_x(rng, n, k):
    """(device uint16 [n, K] bf16 bits in rows of a NaN-bit padded buffer (16-byte aligned,
    stride % 8 == 0), device f32 [n, K] of the same values): fresh values, none zero."""
    vals = randn(rng, (n, k), 3.0)
    bits = f32_to_bf16_bits(vals)
    stride = -(-k // 8) * 8 + 16
    full = np.full((n, stride), 0x7FC0, dtype=np.uint16)
    full[:, 8:8 + k] = bits
    same = bf16_bits_to_f32(bits).astype(np.float32)
    assert np.all(same != 0.0)
    return dev(full)[:, 8:8 + k], dev(same)


@pytest.mark.parametrize("xpipe", [True, False])
@pytest.mark.parametrize("m,k", [(512, 2048), (200, 1040), (200, 2032), (512, 1520)])
def test_tma_gate_up_bf16_x_equals_f32_x_of_the_same_values(rng, monkeypatch, m, k, xpipe):
    """moe_tma_gate_up_kernel<*, 1> (x as bf16 bits, one mma per k16 step) gives the bits of
    the f32 x holding the same values (<*, 0>, and the rows kernel), for x in registers or
    not, every plan, one or two items at a time, x by token and by pair, XPIPE on and off."""
    monkeypatch.setattr(kmoe, "TMA_XPIPE", xpipe)
    experts, top_k = 256, 8
    _, w_d = _tiled_experts(rng, experts, 12, 2 * m, k)
    plans = _plans(k)
    for n in (1, 2, 5, 8):
        by_pair = int(n == 5)
        ids_h = _routing(rng, n, experts, top_k)
        ids_h[n - 1] = ids_h[0][::-1]
        ids = dev(ids_h)
        xb_d, xf_d = _bf16_x(rng, n * top_k if by_pair else n, k)
        want = _stage(w_d, xf_d, ids, m, experts, by_pair, None)
        assert np.isfinite(host(want)).all(), f"n={n}: rows kernel output not finite"
        xr_ok = kmoe.tma_x_regs_ok(k, plans[0].splits, by_pair, ids_h.size, top_k)
        for plan in plans:
            for item_pairs in (False, True):
                for x_regs in (False, True) if xr_ok else (False,):
                    got = _stage(w_d, xb_d, ids, m, experts, by_pair, plan, item_pairs, x_regs)
                    assert_same_bits(got, want, f"m={m} k={k} n={n} {plan} pairs={item_pairs} "
                                                f"x_regs={x_regs}")


@pytest.mark.parametrize("fused", [None, False])
@pytest.mark.parametrize("n", [1, 3, 8])
def test_moe_block_bf16_x_equals_f32_x_of_the_same_values(rng, n, fused):
    """moe_block with x as bf16 bits: every output (weights, ids, out) bitwise that of the f32
    x holding the same values, on the fused decode path (the bulk-copy gate_up reads the bits),
    the 4-launch path and batch invariant (an f32 copy of x), eagerly."""
    experts, top_k, hidden, inter = 64, 4, 1024, 256
    gu = dev(f32_to_bf16_bits(randn(rng, (experts, 2 * inter, hidden), hidden ** -0.5)))
    dn = dev(f32_to_bf16_bits(randn(rng, (experts, hidden, inter), inter ** -0.5)))
    logits = dev(randn(rng, (n, experts), 1.0))
    xb_d, xf_d = _bf16_x(rng, n, hidden)
    outs = {}
    for name, x in (("f32", xf_d), ("bf16", xb_d)):
        for inv in (False, True):
            ws = kmoe.MoeWorkspace.allocate(n, top_k, hidden, inter)
            w_out, ids_out = poisoned((n, top_k)), cp().full((n, top_k), -7, dtype=np.int32)
            out = poisoned((n, hidden))
            kmoe.moe_block(x, logits, top_k, gu, dn, w_out, ids_out, out, workspace=ws,
                           batch_invariant=inv, fused=fused)
            outs[name, inv] = (host(w_out), host(ids_out), host(out))
    for inv in (False, True):
        for a, b, what in zip(outs["bf16", inv], outs["f32", inv], ("weights", "ids", "out")):
            assert_same_bits(a, b, f"{what} n={n} fused={fused} batch_invariant={inv}")
    assert np.isfinite(outs["bf16", False][2]).all()


def test_moe_experts_bf16_x_prefill_path_equals_f32_x(rng):
    """moe_experts on the cuBLAS prefill path (N > the GEMV rows) with a bf16 x: bitwise the f32
    x holding the same values (the gather reads the f32 copy, rounding nothing)."""
    experts, top_k, hidden, inter, n = 16, 2, 256, 64, 40
    gu = dev(f32_to_bf16_bits(randn(rng, (experts, 2 * inter, hidden), hidden ** -0.5)))
    dn = dev(f32_to_bf16_bits(randn(rng, (experts, hidden, inter), inter ** -0.5)))
    ids = dev(_routing(rng, n, experts, top_k))
    weights = dev(randn(rng, (n, top_k), 0.5))
    xb_d, xf_d = _bf16_x(rng, n, hidden)
    got, want = poisoned((n, hidden)), poisoned((n, hidden))
    kmoe.moe_experts(xb_d, gu, dn, ids, weights, got)
    kmoe.moe_experts(xf_d, gu, dn, ids, weights, want)
    assert_same_bits(got, want, "prefill path")
    assert np.isfinite(host(got)).all()


def test_moe_block_refuses_a_misaligned_bf16_x(rng):
    experts, top_k, hidden, inter, n = 8, 2, 64, 32, 2
    gu = dev(f32_to_bf16_bits(randn(rng, (experts, 2 * inter, hidden), 0.1)))
    dn = dev(f32_to_bf16_bits(randn(rng, (experts, hidden, inter), 0.1)))
    x = dev(f32_to_bf16_bits(randn(rng, (n, hidden + 4), 1.0)))[:, 4:]
    with pytest.raises(ValueError, match="16-byte aligned"):
        kmoe.moe_block(x, dev(randn(rng, (n, experts), 1.0)), top_k, gu, dn,
                       poisoned((n, top_k)), cp().zeros((n, top_k), np.int32),
                       poisoned((n, hidden)))
