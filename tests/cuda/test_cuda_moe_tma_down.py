"""moe_tma_down_kernel (kmoe.TMA_DOWN, NINFER_MOE_TMA_DOWN): the MoE decode's fused down stage
after the bulk-copy gate_up, with its weight tiles copied and its tables read before the PDL
wait, is bitwise moe_fused_down_kernel: weights, ids, act and out, routed and unrouted, with
the folded shared down (linear_tma's geometries), with a gated shared output and without one,
at the 35B-A3B shape and odd shapes; within the float64 oracle's tolerance; replayed from a
CUDA graph bitwise eager; tma_down_applies refuses what the kernel cannot take (the fused down
kernel then runs)."""
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
    moe_shared_inputs,
    poisoned,
    randn,
    randn_refill,
)

from ninfer.core.dtypes import bf16_bits_to_f32
from ninfer.kernels_cuda import linear as klinear
from ninfer.kernels_cuda import moe as kmoe
from ninfer.ops import reference as ref

pytestmark = pytest.mark.gpu


def _inputs(rng, n, experts, hidden, inter, shared_inter, sub=None):
    """moe_shared_inputs (rows 0 and 1 sharing experts) and a gated shared output [N, H]."""
    return moe_shared_inputs(rng, n, experts, hidden, inter, shared_inter, sub,
                             same_rows=True) + (dev(randn(rng, (n, hidden))),)


def _run(monkeypatch, on, x, logits, top_k, gu, dn, mode, act, sd, shared, routed):
    """((weights, ids, act, out), launch names) of kmoe.moe_block (fused path) with TMA_DOWN =
    on; mode "fold" (shared act + shared_down), "shared" (a gated shared output) or "none"."""
    monkeypatch.setattr(kmoe, "TMA_DOWN", on)
    n, experts = logits.shape[0], logits.shape[1] - 1
    hidden, inter = x.shape[1], dn.shape[2]
    ws = kmoe.MoeWorkspace.allocate(n, top_k, hidden, inter)
    ws.act.fill(np.nan)
    w, ids, out = poisoned((n, top_k)), poisoned((n, top_k), np.int32), poisoned((n, hidden))
    kw = {"fold": dict(shared=act, shared_gate=logits[:, experts:], shared_down=sd),
          "shared": dict(shared=shared, shared_gate=logits[:, experts:]),
          "none": {}}[mode]
    with launch_names(kmoe) as names:
        if routed:
            kmoe.moe_route(logits[:, :experts], top_k, w, ids, workspace=ws)
        kmoe.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out, workspace=ws,
                       fused=True, routed=routed, **kw)
    return (w, ids, ws.act[:n * top_k], out), names


def _check(monkeypatch, x, logits, top_k, gu, dn, mode, act, sd, shared, what):
    n, inter = x.shape[0], dn.shape[2]
    if mode == "fold":
        assert kmoe.shared_down_folds(x, top_k, gu, dn, sd, act, fused=True), what
    monkeypatch.setattr(kmoe, "TMA_DOWN", True)
    assert kmoe.tma_down_applies(n, top_k, inter, act.shape[1] if mode == "fold" else 0), what
    for routed in (False, True):
        got, names = _run(monkeypatch, True, x, logits, top_k, gu, dn, mode, act, sd, shared,
                          routed)
        want, base = _run(monkeypatch, False, x, logits, top_k, gu, dn, mode, act, sd, shared,
                          routed)
        assert "moe_tma_down" in names and "moe_fused_down" not in names, (what, names)
        assert "moe_tma_down" not in base and "moe_fused_down" in base, (what, base)
        assert np.isfinite(host(got[3])).all(), f"{what}: non-finite output"
        for a, b, label in zip(got, want, ("weights", "ids", "act", "out"), strict=True):
            assert_same_bits(a, b, f"{label}: tma down vs fused down ({what}, {mode}, "
                                   f"routed={routed})")
    return got


@pytest.mark.parametrize("mode", ["fold", "shared", "none"])
def test_tma_down_equals_fused_down_35b_shape(rng, monkeypatch, mode):
    """35B-A3B experts (H 2048, Im = Is = 512, 256 tiled from 24, top 8) at B = 1: bitwise, and
    within 2e-2 of float64 (bf16 weights, f32 x)."""
    experts, top_k, hidden, inter, sub = 256, 8, 2048, 512, 24
    gu, dn, gu_h, dn_h, x, logits, act, sd, sd_h, shared = _inputs(rng, 1, experts, hidden, inter,
                                                                   inter, sub)
    w, ids, _, out = _check(monkeypatch, x, logits, top_k, gu, dn, mode, act, sd, shared, "35B")
    expect = ref.moe_experts(host(x), gu_h, dn_h, host(ids) % sub, host(w))
    gate = 1.0 / (1.0 + np.exp(-host(logits)[:, experts:].astype(np.float64)))
    if mode == "fold":
        expect = expect + gate * (host(act).astype(np.float64)
                                  @ bf16_bits_to_f32(sd_h.data).astype(np.float64).T)
    elif mode == "shared":
        expect = expect + gate * host(shared)
    assert_close(out, expect, 2e-2)


@pytest.mark.parametrize("sk,cons", [(1024, 16), (2048, 8), (1024, 8), (2048, 16)])
def test_tma_down_fold_follows_linear_geometry(rng, monkeypatch, sk, cons):
    """Every linear_tma geometry (NINFER_GEMV_TMA_SK / _CONSUMERS): the folded shared tile is
    bitwise linear's, as moe_fused_down_kernel's is."""
    monkeypatch.setattr(klinear, "TMA_SK", sk)
    monkeypatch.setattr(klinear, "TMA_CONSUMERS", cons)
    gu, dn, _, _, x, logits, act, sd, _, shared = _inputs(rng, 1, 64, 2048, 512, 512, 16)
    _check(monkeypatch, x, logits, 8, gu, dn, "fold", act, sd, shared, f"sk={sk} cons={cons}")


@pytest.mark.parametrize("n,hidden,inter,shared_inter,experts,top_k", [
    (1, 304, 96, 48, 64, 8),      # 19 column tiles, one down split of 3 steps
    (2, 1040, 256, 272, 100, 4),  # 65 column tiles, E % 32 != 0, rows sharing experts
    (4, 64, 32, 32, 8, 2),        # the tiny MoE model's shape: 4 column tiles
    (1, 2048, 512, 2048, 16, 8),  # every expert of a small pool; Is = FOLD_MAX_K
])
@pytest.mark.parametrize("mode", ["fold", "shared"])
def test_tma_down_equals_fused_down_odd_shapes(rng, monkeypatch, n, hidden, inter,
                                               shared_inter, experts, top_k, mode):
    gu, dn, _, _, x, logits, act, sd, _, shared = _inputs(rng, n, experts, hidden, inter,
                                                          shared_inter)
    _check(monkeypatch, x, logits, top_k, gu, dn, mode, act, sd, shared,
           f"n={n} H={hidden} Im={inter} Is={shared_inter}")


def test_tma_down_graph_replay_equals_eager(rng, monkeypatch):
    """Routing, then the gate_up stage and moe_tma_down_kernel (folded shared down), captured
    and replayed on new inputs: bitwise the eager fused down kernel."""
    from ninfer.core.cuda import DeviceContext

    n, hidden, inter, experts, top_k = 1, 2048, 512, 256, 8
    ctx = DeviceContext(0)
    with ctx.activate():
        gu, dn, _, _, x, logits, act, sd, _, _ = _inputs(rng, n, experts, hidden, inter, inter,
                                                         16)
        ws = kmoe.MoeWorkspace.allocate(n, top_k, hidden, inter)
        w, ids, out = poisoned((n, top_k)), poisoned((n, top_k), np.int32), poisoned((n, hidden))

        def step():
            monkeypatch.setattr(kmoe, "TMA_DOWN", True)  # (eager() sets it off)
            kmoe.moe_route(logits[:, :experts], top_k, w, ids, workspace=ws)
            kmoe.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out, shared=act,
                           shared_gate=logits[:, experts:], shared_down=sd, workspace=ws,
                           routed=True)

        def eager():
            got, _ = _run(monkeypatch, False, x, logits, top_k, gu, dn, "fold", act, sd, None,
                          False)
            return got[0], got[1], got[3]

        refill = randn_refill(rng, (x, 1.0), (logits, 2.0), (act, 1.0))
        assert_graph_replay_equals_eager(
            ctx, "moe_tma_down", step, refill, (w, ids, out), (w, ids, out), eager,
            ("weights", "ids", "out"), "graph replay (tma down) vs eager fused down")


def test_tma_down_applies_refusals(rng, monkeypatch):
    """tma_down_applies is False without TMA_DOWN, past PERSIST_GROUPS pairs, for Im % 32 != 0
    and where the tiles do not fit the shared memory; a refused call runs moe_fused_down."""
    monkeypatch.setattr(kmoe, "TMA_DOWN", False)
    assert not kmoe.tma_down_applies(1, 8, 512, 512)
    monkeypatch.setattr(kmoe, "TMA_DOWN", True)
    assert kmoe.tma_down_applies(1, 8, 512, 512)
    assert not kmoe.tma_down_applies(2, 8, 512, 512)   # 16 pairs
    assert not kmoe.tma_down_applies(1, 8, 40, 48)     # Im % 32 != 0
    assert not kmoe.tma_down_applies(1, 8, 1024, 2048)  # 256 KiB of expert tiles
    gu, dn, _, _, x, logits, act, sd, _, shared = _inputs(rng, 1, 64, 144, 40, 48)
    assert kmoe.fused_applies(1, 8, 64, True) and kmoe._tma_plan(True, 144) is not None
    got, names = _run(monkeypatch, True, x, logits, 8, gu, dn, "shared", act, sd, shared, False)
    assert "moe_fused_down" in names and "moe_tma_down" not in names, names
    assert np.isfinite(host(got[3])).all()
