"""moe_block with `norm_fold` (NINFER_MOE_NORM_FOLD: the next layer's input norm carried by the
MoE block's last launch, moe.cu MoeNormFold) on the GPU.

Checked, on fresh random inputs with poisoned outputs: on every path `norm_folds` admits (the
fused decode launches with the bulk-copy or the rows gate_up, the four launches, batch
invariant), with an f32 or a bf16 x: the residual becomes
residual + the block's unfolded `out` (bitwise), xg = bf16(r * gain) (bitwise), parts[n, g] =
the column-order f32 sum of r^2 over columns [16 g, 16 g + 16) (bitwise), columns past the
groups untouched, `out` not written; every path gives the same bits; a row alone gives its bits
in a batch; the opt-in persistent and bulk-copy down kernels refuse it.
"""
from __future__ import annotations

import numpy as np
import pytest
from cuda_testutil import (MOE_BLOCK_PATHS, assert_same_bits, cp, dev, host, poisoned, randn,
                           set_moe_path, tiled_experts)

from ninfer.core.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from ninfer.errors import InvalidInput
from ninfer.kernels_cuda import moe as kmoe
from ninfer.kernels_cuda.linear import tma_ok

pytestmark = pytest.mark.gpu

# the paths norm_folds admits (not the opt-in persistent and bulk-copy down kernels)
_PATHS = tuple(p for p in MOE_BLOCK_PATHS if not {"PERSIST", "TMA_DOWN"} & p[1].keys())
EXPERTS, TOP_K, HIDDEN, INTER, SUB = 64, 8, 1040, 256, 16  # H: 65 column groups


def _setup(rng, n, bf16_x):
    gu, dn, _, _ = tiled_experts(rng, EXPERTS, HIDDEN, INTER, SUB)
    x_h = randn(rng, (n, HIDDEN), 2.0)
    x = dev(f32_to_bf16_bits(x_h)) if bf16_x else dev(x_h)
    logits = dev(randn(rng, (n, EXPERTS + 1), 2.0))
    if n > 1:  # rows 0 and 1 pick the same experts: groups of more than one pair
        logits[1, :EXPERTS] = logits[0, :EXPERTS]
    return gu, dn, x, logits, dev(randn(rng, (n, HIDDEN)))


def _block(monkeypatch, flags, kw, x, logits, gu, dn, shared, fold=None):
    """(out, and with `fold` = (residual host, gain host): residual, xg, parts) on the host."""
    set_moe_path(monkeypatch, flags)
    n = x.shape[0]
    ws = kmoe.MoeWorkspace.allocate(n, TOP_K, HIDDEN, INTER)
    w, ids, out = poisoned((n, TOP_K)), poisoned((n, TOP_K), np.int32), poisoned((n, HIDDEN))
    extra = {}
    if fold is not None:
        assert kmoe.norm_folds(n, TOP_K, HIDDEN, batch_invariant=kw.get("batch_invariant", False))
        res, xg = dev(fold[0].copy()), cp().full((n, HIDDEN), 0xFFFF, np.uint16)
        parts = poisoned((n, kmoe.norm_fold_parts(HIDDEN) + 2))
        extra = {"norm_fold": (res, dev(fold[1]), xg, parts)}
    kmoe.moe_block(x, logits[:, :EXPERTS], TOP_K, gu, dn, w, ids, out, shared=shared,
                   shared_gate=logits[:, EXPERTS:], workspace=ws, bf16_act=x.dtype == np.uint16,
                   **kw, **extra)
    if fold is None:
        return host(out)
    assert np.isnan(host(out)).all(), "the folded block wrote out"
    return host(res), host(xg), host(parts)


@pytest.mark.parametrize("bf16_x", [False, True])
@pytest.mark.parametrize("n", [1, 2, 8])
def test_moe_norm_fold_every_path(rng, monkeypatch, n, bf16_x):
    if not tma_ok(16):
        pytest.skip("the bulk-copy kernels need sm_90")
    gu, dn, x, logits, shared = _setup(rng, n, bf16_x)
    resid = randn(rng, (n, HIDDEN), 3.0)
    gain = (1.0 + rng.standard_normal(HIDDEN) * 0.1).astype(np.float32)
    groups = kmoe.norm_fold_parts(HIDDEN)
    want = None
    for name, flags, kw in _PATHS:
        out = _block(monkeypatch, flags, kw, x, logits, gu, dn, shared)
        r, xg, parts = _block(monkeypatch, flags, kw, x, logits, gu, dn, shared, (resid, gain))
        assert np.isfinite(out).all()
        assert_same_bits(r, resid + out, f"{name}: residual")
        assert_same_bits(xg, f32_to_bf16_bits(r * gain), f"{name}: xg")
        sums = np.zeros((n, groups), np.float32)
        for g in range(groups):
            for c in range(16 * g, min(16 * g + 16, HIDDEN)):
                sums[:, g] += r[:, c] * r[:, c]
        assert_same_bits(parts[:, :groups], sums, f"{name}: parts")
        assert np.isnan(parts[:, groups:]).all(), f"{name}: columns past the groups written"
        if want is None:
            want = (r, xg, parts)
        for a, b, label in zip((r, xg, parts), want, ("residual", "xg", "parts")):
            assert_same_bits(a, b, f"{label}: {name} vs {_PATHS[0][0]} (n={n})")
    assert bf16_bits_to_f32(xg).std() > 0.1


def test_moe_norm_fold_rows_alone(rng, monkeypatch):
    gu, dn, x, logits, shared = _setup(rng, 8, True)
    resid = randn(rng, (8, HIDDEN), 3.0)
    gain = (1.0 + rng.standard_normal(HIDDEN) * 0.1).astype(np.float32)
    batch = _block(monkeypatch, {}, {}, x, logits, gu, dn, shared, (resid, gain))
    for i in (0, 5, 7):
        alone = _block(monkeypatch, {}, {}, x[i:i + 1], logits[i:i + 1], gu, dn,
                       shared[i:i + 1], (resid[i:i + 1], gain))
        for a, b, label in zip(alone, batch, ("residual", "xg", "parts")):
            assert_same_bits(a, b[i:i + 1], f"{label}: row {i} alone")


@pytest.mark.parametrize("flag", ["PERSIST", "TMA_DOWN"])
def test_moe_norm_fold_refused_by_the_opt_in_down_kernels(rng, monkeypatch, flag):
    gu, dn, x, logits, shared = _setup(rng, 1, True)
    monkeypatch.setattr(kmoe, flag, True)
    assert not kmoe.norm_folds(1, TOP_K, HIDDEN)
    fold = (dev(randn(rng, (1, HIDDEN))), dev(np.ones(HIDDEN, np.float32)),
            cp().zeros((1, HIDDEN), np.uint16), poisoned((1, kmoe.norm_fold_parts(HIDDEN))))
    with pytest.raises(InvalidInput):
        kmoe.moe_block(x, logits[:, :EXPERTS], TOP_K, gu, dn, poisoned((1, TOP_K)),
                       poisoned((1, TOP_K), np.int32), poisoned((1, HIDDEN)), shared=shared,
                       shared_gate=logits[:, EXPERTS:], norm_fold=fold)
