"""The shared expert's down projection folded into moe_fused_down_kernel (kmoe.shared_down_folds;
the model's NINFER_MOE_FOLD_SHARED): moe_block(..., shared=act, shared_down=W) is bitwise
moe_block with shared = linear(act, W) (linear_tma_kernel, every stage / consumer geometry), with
the bulk-copy gate_up and the rows gate_up, routed and unrouted; within the float64 oracle's
tolerance; batch invariant; replayed from a CUDA graph bitwise eager; the predicate refuses what
the kernel cannot take, and moe_block then refuses shared_down."""
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
    weight_pair,
)

from ninfer import ops
from ninfer.core.dtypes import DType, bf16_bits_to_f32
from ninfer.kernels_cuda import linear as klinear
from ninfer.kernels_cuda import moe as kmoe
from ninfer.ops import reference as ref

pytestmark = pytest.mark.gpu


def _linear(sd, act):
    """shared = linear(act, sd): the fold's bitwise reference (linear_tma_kernel)."""
    assert klinear.tma_geometry(act, sd) is not None
    out = poisoned((act.shape[0], sd.shape[0]))
    klinear.linear(act, sd, out)
    return out


def _block(x, logits, top_k, gu, dn, *, shared, shared_down=None, fused=None, routed=False):
    n, experts = logits.shape[0], logits.shape[1] - 1
    hidden, inter = x.shape[1], dn.shape[2]
    ws = kmoe.MoeWorkspace.allocate(n, top_k, hidden, inter)
    ws.act.fill(np.nan)
    w, ids, out = poisoned((n, top_k)), poisoned((n, top_k), np.int32), poisoned((n, hidden))
    if routed:
        kmoe.moe_route(logits[:, :experts], top_k, w, ids, workspace=ws)
    kmoe.moe_block(x, poisoned((n, experts)) if routed else logits[:, :experts], top_k, gu, dn,
                   w, ids, out, shared=shared, shared_gate=logits[:, experts:],
                   shared_down=shared_down, workspace=ws, fused=fused, routed=routed)
    return w, ids, out


def _check_fold(x, logits, top_k, gu, dn, act, sd, what, fused=None):
    assert kmoe.shared_down_folds(x, top_k, gu, dn, sd, act, fused=fused), what
    shared = _linear(sd, act)
    got = {}
    for routed in (False, True):
        want = _block(x, logits, top_k, gu, dn, shared=shared, fused=fused, routed=routed)
        fold = _block(x, logits, top_k, gu, dn, shared=act, shared_down=sd, fused=fused,
                      routed=routed)
        assert np.isfinite(host(fold[2])).all(), f"{what}: non-finite output"
        for a, b, name in zip(fold, want, ("weights", "ids", "out")):
            assert_same_bits(a, b, f"{what} routed={routed}: {name}, folded vs shared GEMV")
        got[routed] = fold
    return got[True]


@pytest.mark.parametrize("n", [1, 3, 8])
@pytest.mark.parametrize("tma,early", [(True, True), (True, False), (False, True)])
def test_fold_equals_linear_35b_shape(rng, monkeypatch, n, tma, early):
    """35B-A3B shape (H 2048, Im = Is = 512, 256 experts tiled from 24, top 8): bitwise the
    shared GEMV's path, with the shared tile computed before the down kernel's PDL wait (after
    the bulk-copy gate_up; `early`, NINFER_MOE_SHARED_EARLY) or after it, and within 2e-2 of
    float64 (bf16 weights, f32 activations)."""
    monkeypatch.setattr(kmoe, "MOE_TMA", tma)
    monkeypatch.setattr(kmoe, "SHARED_EARLY", early)
    experts, top_k, hidden, inter, sub = 256, 8, 2048, 512, 24
    gu, dn, gu_h, dn_h, x, logits, act, sd, sd_h = moe_shared_inputs(
        rng, n, experts, hidden, inter, inter, sub)
    fused = None if n == 1 else True  # the default takes the fused path at one row
    w, ids, out = _check_fold(x, logits, top_k, gu, dn, act, sd, f"35B n={n} tma={tma}", fused)
    gate = host(logits)[:, experts:].astype(np.float64)
    shared = host(act).astype(np.float64) @ bf16_bits_to_f32(sd_h.data).astype(np.float64).T
    expect = ref.moe_experts(host(x), gu_h, dn_h, host(ids) % sub, host(w))
    assert_close(out, expect + shared / (1.0 + np.exp(-gate)), 2e-2)


@pytest.mark.parametrize("n,hidden,inter,shared_inter,experts,top_k", [
    (1, 136, 40, 48, 64, 8),       # Is < one consumer's k range
    (3, 296, 48, 96, 100, 5),      # H % 16 != 0 (a partial output tile), Is != Im
    (8, 1040, 264, 272, 256, 8),   # 64 pairs; Is not a multiple of a consumer's range
    (5, 528, 96, 2048, 512, 4),    # Is = 2 stages of 1024 k (FOLD_MAX_K)
    (2, 304, 40, 16, 16, 4),       # Is = one k16 step
])
@pytest.mark.parametrize("sk,cons", [(1024, 16), (2048, 8), (1024, 8), (2048, 16)])
def test_fold_equals_linear_odd_shapes(rng, monkeypatch, n, hidden, inter, shared_inter,
                                       experts, top_k, sk, cons):
    """Every linear_tma geometry (NINFER_GEMV_TMA_SK / _CONSUMERS): the fold follows it."""
    monkeypatch.setattr(klinear, "TMA_SK", sk)
    monkeypatch.setattr(klinear, "TMA_CONSUMERS", cons)
    gu, dn, _, _, x, logits, act, sd, _ = moe_shared_inputs(rng, n, experts, hidden, inter,
                                                            shared_inter)
    _check_fold(x, logits, top_k, gu, dn, act, sd,
                f"n={n} H={hidden} Is={shared_inter} sk={sk} cons={cons}", fused=True)


@pytest.mark.parametrize("n,hidden,inter,shared_inter,experts,top_k,sub,cons", [
    (1, 2048, 512, 512, 256, 8, 24, 16),   # 35B-A3B (the default geometry)
    (1, 2048, 512, 512, 256, 8, 24, 8),
    (2, 1040, 256, 272, 100, 4, None, 8),  # 4 consumer warps, Is != Im, 2 rows
    (1, 1040, 256, 1024, 64, 8, None, 8),  # Is = one stage of 1024 k
])
def test_persistent_fold_equals_linear(rng, monkeypatch, n, hidden, inter, shared_inter,
                                       experts, top_k, sub, cons):
    """The persistent expert launch (kmoe.PERSIST) computes the folded shared down itself:
    bitwise linear(act, W) + the two launches, routed and unrouted."""
    monkeypatch.setattr(kmoe, "PERSIST", True)
    monkeypatch.setattr(klinear, "TMA_CONSUMERS", cons)
    gu, dn, _, _, x, logits, act, sd, _ = moe_shared_inputs(rng, n, experts, hidden, inter,
                                                            shared_inter, sub)
    with launch_names(kmoe) as names:
        _check_fold(x, logits, top_k, gu, dn, act, sd,
                    f"persistent n={n} H={hidden} cons={cons}", fused=True)
    assert "moe_tma_experts" in names and "moe_fused_down" not in names, names


def test_persistent_fold_refusal(rng, monkeypatch):
    """Where the persistent launch runs but cannot take the fold (linear_tma's 16 consumer
    warps > twice its 4), shared_down_folds is False (the caller runs the GEMV); without
    PERSIST the two launches fold it."""
    monkeypatch.setattr(klinear, "TMA_CONSUMERS", 16)
    gu, dn, _, _, x, logits, act, sd, _ = moe_shared_inputs(rng, 1, 64, 1040, 256, 272)
    monkeypatch.setattr(kmoe, "PERSIST", True)
    assert kmoe.persist_plan(1, 8, 1040, 256) is not None
    assert not kmoe.shared_down_folds(x, 8, gu, dn, sd, act, fused=True)
    monkeypatch.setattr(kmoe, "PERSIST", False)
    assert kmoe.shared_down_folds(x, 8, gu, dn, sd, act, fused=True)


def test_fold_batch_invariance(rng):
    """A row's folded result does not depend on the other rows of the launch."""
    gu, dn, _, _, x, logits, act, sd, _ = moe_shared_inputs(rng, 8, 64, 1040, 264, 272)
    full = _block(x, logits, 8, gu, dn, shared=act, shared_down=sd, fused=True)
    for rows in ([0], [5, 6], [1, 2, 3, 7]):
        part = _block(x[rows], logits[rows], 8, gu, dn, shared=act[rows], shared_down=sd,
                      fused=True)
        for a, b, what in zip(part, full, ("weights", "ids", "out")):
            assert_same_bits(a, host(b)[rows], f"{what}, rows {rows}")


def test_fold_graph_replay_equals_eager(rng):
    """Routing, then the folded expert stages, captured and replayed on new inputs: bitwise the
    eager path with the shared GEMV."""
    from ninfer.core.cuda import DeviceContext

    n, hidden, inter, experts, top_k = 1, 2048, 512, 256, 8
    ctx = DeviceContext(0)
    with ctx.activate():
        gu, dn, _, _, x, logits, act, sd, _ = moe_shared_inputs(rng, n, experts, hidden, inter,
                                                                inter, 16)
        ws = kmoe.MoeWorkspace.allocate(n, top_k, hidden, inter)
        w, ids, out = poisoned((n, top_k)), poisoned((n, top_k), np.int32), poisoned((n, hidden))

        def step():
            kmoe.moe_route(logits[:, :experts], top_k, w, ids, workspace=ws)
            kmoe.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out, shared=act,
                           shared_gate=logits[:, experts:], shared_down=sd, workspace=ws,
                           routed=True)

        def eager():
            return _block(x, logits, top_k, gu, dn, shared=_linear(sd, act))

        refill = randn_refill(rng, (x, 1.0), (logits, 2.0), (act, 1.0))
        assert_graph_replay_equals_eager(
            ctx, "moe_block_fold", step, refill, (w, ids, out), (w, ids, out), eager,
            ("weights", "ids", "out"), "graph replay (folded) vs eager shared GEMV")


def test_fold_predicate_refusals(rng, monkeypatch):
    """shared_down_folds is False off the fused path, where linear would not run
    linear_tma_kernel (f32 weights, K % 16 != 0, a misaligned activation, NINFER_GEMV_TMA off),
    past FOLD_MAX_K and for a mis-shaped activation; moe_block then refuses shared_down with a
    ValueError (the caller runs the GEMV)."""
    n, experts, hidden, inter, top_k = 2, 64, 136, 40, 8
    gu, dn, _, _, x, logits, act, sd, _ = moe_shared_inputs(rng, n, experts, hidden, inter, 48)
    assert kmoe.shared_down_folds(x, top_k, gu, dn, sd, act, fused=True)
    assert not kmoe.shared_down_folds(x, top_k, gu, dn, sd, act)  # 16 pairs: not fused by default
    assert not kmoe.shared_down_folds(x, top_k, gu, dn, sd, act, fused=False)
    _, sd32 = weight_pair(rng, (hidden, 48), DType.FLOAT32)
    assert not kmoe.shared_down_folds(x, top_k, gu, dn, sd32, act, fused=True)
    for inner in (40, 4096):  # K % 16 != 0; K > FOLD_MAX_K
        _, other = weight_pair(rng, (hidden, inner), DType.BFLOAT16)
        assert not kmoe.shared_down_folds(x, top_k, gu, dn, other, dev(randn(rng, (n, inner))),
                                          fused=True), inner
    wide = dev(randn(rng, (n, 49)))
    assert not kmoe.shared_down_folds(x, top_k, gu, dn, sd, wide[:, 1:], fused=True)
    assert not kmoe.shared_down_folds(x, top_k, gu, dn, sd, act[:1], fused=True)
    monkeypatch.setattr(klinear, "GEMV_TMA", False)
    assert not kmoe.shared_down_folds(x, top_k, gu, dn, sd, act, fused=True)
    monkeypatch.setattr(klinear, "GEMV_TMA", True)
    w, ids, out = poisoned((n, top_k)), poisoned((n, top_k), np.int32), poisoned((n, hidden))
    with pytest.raises(ValueError, match="shared_down"):
        kmoe.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out, shared=act,
                       shared_gate=logits[:, experts:], shared_down=sd, fused=False)
    with pytest.raises(ValueError, match="shared_down"):
        ops.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out, shared=act,
                      shared_gate=logits[:, experts:], shared_down=sd)
    assert ops.moe_block_folds_shared_down(x[:1], top_k, gu, dn, sd, act[:1])
