"""moe_block / moe_experts with `bf16_act` (the experts' activations silu(g) * u rounded to bf16
before the down stage; NINFER_MOE_BF16_ACT in the model): every path gives the same bits (the
fused decode launches, the four launches, the rows or bulk-copy gate_up, the tensor-core down
kernel that reads f32, batch invariant, the persistent and the bulk-copy down kernels, which
read the rounding as f32), with an f32 or a bf16 x; rows of a batch equal the rows alone; and the
result is the float64 oracle with act rounded to bf16, away from the f32-act result."""
from __future__ import annotations

import numpy as np
import pytest
from cuda_testutil import (MOE_BLOCK_PATHS, assert_close, assert_same_bits, dev, host, poisoned,
                           randn, rel_err, set_moe_path, tiled_experts)

from ninfer.core.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from ninfer.kernels_cuda import moe as kmoe
from ninfer.kernels_cuda.linear import tma_ok
from ninfer.ops import reference as ref

pytestmark = pytest.mark.gpu

_PATHS = MOE_BLOCK_PATHS


def _block(monkeypatch, flags, kw, x, logits, top_k, gu, dn, shared, bf16_act=True):
    set_moe_path(monkeypatch, flags)
    n, hidden, inter = x.shape[0], x.shape[1], dn.shape[2]
    experts = logits.shape[1] - 1
    ws = kmoe.MoeWorkspace.allocate(n, top_k, hidden, inter)
    ws.act.fill(np.nan)
    w, ids, out = poisoned((n, top_k)), poisoned((n, top_k), np.int32), poisoned((n, hidden))
    kmoe.moe_block(x, logits[:, :experts], top_k, gu, dn, w, ids, out, shared=shared,
                   shared_gate=logits[:, experts:], workspace=ws, bf16_act=bf16_act, **kw)
    return host(w), host(ids), host(out)


def _rounding_slack(x, gate_up, down, ids, weights, safety: float = 8.0) -> float:
    """How far (norm) moe_experts(act_bf16=True)'s output may move from the float64 oracle's
    because act elements near a bf16 rounding midpoint round the other way: the GPU's f32 act,
    from another summation order, may fall on the other side (one bf16 ulp; for a large element
    ~1e-3 of the output, beyond the oracle's tolerance). An f32 dot of K terms is off by about
    2^-24 sqrt(K) times the root of its summed squared terms; `safety` times that, carried to
    act = silu(g) u (plus a few f32 ulps of act), is the distance from a midpoint within which
    an element counts. Each such element moves its row's output by w * down[:, j] * ulp; down's
    random columns are nearly orthogonal, so the moves add as the root of their summed squares
    (times 1.5 for what is left)."""
    x, gu_w, dn_w, wts = (ref.f64(a) for a in (x, gate_up, down, weights))
    inter, k_dim = gu_w.shape[1] // 2, gu_w.shape[2]
    total = 0.0
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            w_e = gu_w[ids[t, k]]
            gu = w_e @ x[t]
            err = safety * 2.0 ** -24 * np.sqrt(k_dim * ((w_e * w_e) @ (x[t] * x[t])))
            g, u = gu[:inter], gu[inter:]
            sig = 1.0 / (1.0 + np.exp(-g))
            act = g * sig * u
            act_err = (np.abs(sig * (1.0 + g * (1.0 - sig)) * u) * err[:inter]
                       + np.abs(g * sig) * err[inter:] + 2.0 ** -21 * np.abs(act))
            bits = act.astype(np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
            lo = bits.view(np.float32).astype(np.float64)  # the bf16 neighbours of act
            hi = (bits + np.uint32(0x10000)).view(np.float32).astype(np.float64)
            near = np.abs(act - (lo + hi) / 2) <= act_err
            cols = dn_w[ids[t, k]][:, near] * (wts[t, k] * np.abs(hi - lo)[near])
            total += float(np.sum(cols * cols))
    return 1.5 * np.sqrt(total)


@pytest.mark.parametrize("bf16_x", [False, True])
@pytest.mark.parametrize("n", [1, 2, 8])
def test_bf16_act_every_path_same_bits(rng, monkeypatch, n, bf16_x):
    if not tma_ok(16):
        pytest.skip("the bulk-copy kernels need sm_90")
    experts, top_k, hidden, inter, sub = 64, 8, 1024, 256, 16
    gu, dn, gu_h, dn_h = tiled_experts(rng, experts, hidden, inter, sub)
    x_h = randn(rng, (n, hidden), 2.0)
    if bf16_x:  # an MoE input written as bf16 bits (NINFER_MOE_BF16_X)
        bits = f32_to_bf16_bits(x_h)
        x_h, x = bf16_bits_to_f32(bits).astype(np.float32), dev(bits)
    else:
        x = dev(x_h)
    logits = dev(randn(rng, (n, experts + 1), 2.0))
    if n > 1:  # rows 0 and 1 pick the same experts: groups of more than one pair
        logits[1, :experts] = logits[0, :experts]
    shared = dev(randn(rng, (n, hidden)))
    results = {name: _block(monkeypatch, flags, kw, x, logits, top_k, gu, dn, shared)
               for name, flags, kw in _PATHS}
    first, want = _PATHS[0][0], results[_PATHS[0][0]]
    assert np.isfinite(want[2]).all()
    for name, got in results.items():
        for a, b, label in zip(got, want, ("weights", "ids", "out")):
            assert_same_bits(a, b, f"{label}: {name} vs {first} (n={n}, bf16 x={bf16_x})")
    w, ids, out = want
    gate = host(logits)[:, experts:].astype(np.float64)
    expect = ref.moe_experts(x_h, gu_h, dn_h, ids % sub, w, act_bf16=True) + host(shared) / (
        1.0 + np.exp(-gate))
    f32_expect = ref.moe_experts(x_h, gu_h, dn_h, ids % sub, w) + host(shared) / (
        1.0 + np.exp(-gate))
    slack = _rounding_slack(x_h, gu_h, dn_h, ids % sub, w) / np.linalg.norm(expect)
    assert_close(out, expect, 2e-4 + slack)
    # the bf16 rounding, not the f32 act, is what the output follows
    assert rel_err(out, expect) < 0.5 * rel_err(out, f32_expect), (rel_err(out, expect),
                                                                   rel_err(out, f32_expect))
    # the rounding happened: the f32 act gives other values, about bf16's precision away
    _, _, f32_out = _block(monkeypatch, {}, {}, x, logits, top_k, gu, dn, shared, bf16_act=False)
    diff = np.linalg.norm(f32_out - out) / np.linalg.norm(f32_out)
    assert 1e-5 < diff < 2e-2, diff
    assert_close(f32_out, f32_expect, 1e-5)


def test_bf16_act_batch_invariance(rng):
    """moe_experts(bf16_act=True): each row of an 8-row call equals that row alone."""
    experts, top_k, hidden, inter = 32, 4, 512, 128
    gu, dn, _, _ = tiled_experts(rng, experts, hidden, inter)
    n = 8
    x = dev(randn(rng, (n, hidden), 2.0))
    ids = dev(np.stack([rng.choice(experts, top_k, replace=False) for _ in range(n)])
              .astype(np.int32))
    w = dev(randn(rng, (n, top_k), 0.5))
    batch = poisoned((n, hidden))
    kmoe.moe_experts(x, gu, dn, ids, w, batch, bf16_act=True)
    for r in range(n):
        one = poisoned((1, hidden))
        kmoe.moe_experts(x[r:r + 1], gu, dn, ids[r:r + 1], w[r:r + 1], one, bf16_act=True)
        assert_same_bits(batch[r:r + 1], one, f"row {r}")
    assert np.isfinite(host(batch)).all()
