"""The persistent expert launch (moe_tma_experts_kernel, kmoe.PERSIST / NINFER_MOE_PERSIST):
moe_block's fused decode path with both expert stages and the combine in one launch is bitwise
the two launches (bulk-copy gate_up, fused down): weights, ids, act and out, routed and
unrouted, with and without the gated shared expert, at the 35B-A3B shape and odd shapes; its
grid barrier survives many launches in a row and graph replays; persist_plan refuses what the
kernel cannot take."""
from __future__ import annotations

import numpy as np
import pytest
from cuda_testutil import (
    assert_close,
    assert_graph_replay_equals_eager,
    assert_same_bits,
    dev,
    host,
    launch_names,
    poisoned,
    randn,
    randn_refill,
    tiled_experts,
)

from ninfer.kernels_cuda import moe as kmoe
from ninfer.ops import reference as ref

pytestmark = pytest.mark.gpu


def _run(monkeypatch, persist, x, logits, top_k, gu, dn, shared, routed):
    """(weights, ids, act, out) of kmoe.moe_block (fused path) with PERSIST = persist into
    poisoned outputs and workspace, and the launch names."""
    monkeypatch.setattr(kmoe, "PERSIST", persist)
    n, experts = logits.shape[0], logits.shape[1] - 1
    hidden, inter = x.shape[1], dn.shape[2]
    ws = kmoe.MoeWorkspace.allocate(n, top_k, hidden, inter)
    ws.act.fill(np.nan)
    w, ids, out = poisoned((n, top_k)), poisoned((n, top_k), np.int32), poisoned((n, hidden))
    gate = logits[:, experts:] if shared is not None else None
    with launch_names(kmoe) as names:
        if routed:
            kmoe.moe_route(logits[:, :experts], top_k, w, ids, workspace=ws)
        kmoe.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out, shared=shared,
                       shared_gate=gate, workspace=ws, fused=True, routed=routed)
    return (w, ids, ws.act[:n * top_k], out), names


def _check(monkeypatch, x, logits, top_k, gu, dn, shared, what):
    n, hidden, inter = x.shape[0], x.shape[1], dn.shape[2]
    monkeypatch.setattr(kmoe, "PERSIST", True)
    assert kmoe.persist_plan(n, top_k, hidden, inter) is not None, what
    for routed in (False, True):
        got, names = _run(monkeypatch, True, x, logits, top_k, gu, dn, shared, routed)
        want, base = _run(monkeypatch, False, x, logits, top_k, gu, dn, shared, routed)
        assert "moe_tma_experts" in names and "moe_fused_down" not in names, (what, names)
        assert "moe_tma_experts" not in base, (what, base)
        assert np.isfinite(host(got[3])).all(), f"{what}: non-finite output"
        for a, b, label in zip(got, want, ("weights", "ids", "act", "out"), strict=True):
            assert_same_bits(a, b, f"{label}: persistent vs two launches ({what}, "
                                   f"routed={routed})")
    return got


@pytest.mark.parametrize("with_shared", [True, False])
def test_persist_equals_two_launches_35b_shape(rng, monkeypatch, with_shared):
    """35B-A3B experts (H 2048, Im 512, 256 tiled from 24, top 8) at B = 1: bitwise, and within
    2e-2 of float64 (bf16 weights, f32 x)."""
    experts, top_k, hidden, inter, sub = 256, 8, 2048, 512, 24
    gu, dn, gu_h, dn_h = tiled_experts(rng, experts, hidden, inter, sub)
    x = dev(randn(rng, (1, hidden)))
    logits_h = randn(rng, (1, experts + 1), 2.0)
    logits = dev(logits_h)
    shared = dev(randn(rng, (1, hidden))) if with_shared else None
    w, ids, _, out = _check(monkeypatch, x, logits, top_k, gu, dn, shared, "35B")
    expect = ref.moe_experts(host(x), gu_h, dn_h, host(ids) % sub, host(w))
    if with_shared:
        expect = expect + host(shared) / (1.0 + np.exp(-logits_h[:, experts:].astype(np.float64)))
    assert_close(out, expect, 2e-2)


@pytest.mark.parametrize("n,hidden,inter,experts,top_k", [
    (1, 304, 96, 64, 8),     # 19 column tiles, 3 down steps per split
    (2, 1040, 256, 100, 4),  # 65 column tiles, E % 32 != 0, rows sharing experts possible
    (4, 64, 32, 8, 2),       # the tiny MoE model's shape: 4 column tiles, groups of 2 pairs
    (1, 2048, 512, 16, 8),   # every expert of a small pool
])
def test_persist_equals_two_launches_odd_shapes(rng, monkeypatch, n, hidden, inter, experts,
                                                top_k):
    gu, dn, _, _ = tiled_experts(rng, experts, hidden, inter)
    x = dev(randn(rng, (n, hidden)))
    logits = dev(randn(rng, (n, experts + 1), 2.0))
    if n > 1:  # rows 0 and 1 pick the same experts: groups of more than one pair
        logits[1, :experts] = logits[0, :experts]
    shared = dev(randn(rng, (n, hidden)))
    _check(monkeypatch, x, logits, top_k, gu, dn, shared, f"n={n} H={hidden} Im={inter}")


def test_persist_barrier_survives_many_launches(rng, monkeypatch):
    """40 launches in a row on one workspace (the MoE layers of a step share it), new inputs
    each time: every output bitwise the two-launch path's (a barrier left in a bad state would
    hang or let a block read act early)."""
    experts, top_k, hidden, inter = 64, 8, 2048, 512
    gu, dn, _, _ = tiled_experts(rng, experts, hidden, inter, 8)
    monkeypatch.setattr(kmoe, "PERSIST", True)
    ws = kmoe.MoeWorkspace.allocate(1, top_k, hidden, inter)
    w, ids, out = poisoned((1, top_k)), poisoned((1, top_k), np.int32), poisoned((1, hidden))
    x, logits = dev(randn(rng, (1, hidden))), dev(randn(rng, (1, experts), 2.0))
    results = []
    for _ in range(40):
        x[...] = dev(randn(rng, (1, hidden)))
        logits[...] = dev(randn(rng, (1, experts), 2.0))
        kmoe.moe_block(x, logits, top_k, gu, dn, w, ids, out, workspace=ws)
        results.append((host(x), host(logits), host(out)))
    assert host(ws.barrier)[0] == 0 and host(ws.barrier)[1] == 40  # arrivals, generation
    monkeypatch.setattr(kmoe, "PERSIST", False)
    for xh, lh, oh in results[::7]:
        x[...] = dev(xh)
        logits[...] = dev(lh)
        kmoe.moe_block(x, logits, top_k, gu, dn, w, ids, out, workspace=ws)
        assert_same_bits(oh, out, "a persistent launch in a row vs the two launches")


def test_persist_graph_replay_equals_eager(rng, monkeypatch):
    from ninfer.core.cuda import DeviceContext

    experts, top_k, hidden, inter = 256, 8, 2048, 512
    monkeypatch.setattr(kmoe, "PERSIST", True)
    ctx = DeviceContext(0)
    with ctx.activate():
        gu, dn, _, _ = tiled_experts(rng, experts, hidden, inter, 16)
        x = dev(randn(rng, (1, hidden)))
        logits = dev(randn(rng, (1, experts + 1), 2.0))
        shared = dev(randn(rng, (1, hidden)))
        ws = kmoe.MoeWorkspace.allocate(1, top_k, hidden, inter)
        w, ids, out = poisoned((1, top_k)), poisoned((1, top_k), np.int32), poisoned((1, hidden))

        def step():
            kmoe.moe_route(logits[:, :experts], top_k, w, ids, workspace=ws)
            kmoe.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out, shared=shared,
                           shared_gate=logits[:, experts:], workspace=ws, routed=True)

        def eager():
            got, _ = _run(monkeypatch, False, x, logits, top_k, gu, dn, shared, False)
            monkeypatch.setattr(kmoe, "PERSIST", True)
            return got[0], got[1], got[3]

        refill = randn_refill(rng, (x, 1.0), (logits, 2.0), (shared, 1.0))
        assert_graph_replay_equals_eager(
            ctx, "moe_block_persist", step, refill, (w, ids, out), (w, ids, out), eager,
            ("weights", "ids", "out"), "graph replay (persistent) vs eager two launches")


def test_persist_plan_refusals(monkeypatch):
    """persist_plan is None with PERSIST off, past PERSIST_GROUPS pairs, for Im % 32 != 0 or
    H % 16 != 0, and past one block per SM; where it runs, the folded shared down is not taken
    (the persistent launch adds a shared output, it does not compute one)."""
    monkeypatch.setattr(kmoe, "PERSIST", True)
    assert kmoe.persist_plan(1, 8, 2048, 512) is not None
    plan = kmoe.persist_plan(1, 8, 2048, 512)
    assert plan.smem <= kmoe.TMA_SMEM_LIMIT
    assert kmoe.persist_plan(2, 8, 2048, 512) is None   # 16 pairs
    assert kmoe.persist_plan(1, 8, 2048, 520) is None   # Im % 32
    assert kmoe.persist_plan(1, 8, 2056, 512) is None   # H % 16
    assert kmoe.persist_plan(1, 8, 16 * 1024, 512) is None  # 1024 column tiles > SMs
    monkeypatch.setattr(kmoe, "PERSIST", False)
    assert kmoe.persist_plan(1, 8, 2048, 512) is None
