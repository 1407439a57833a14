"""MoE on the GPU: routing (ids exact, weights vs float64), routed experts on the grouped-GEMV
path (reads only the selected experts) and the cuBLAS prefill path, batch invariance."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer import ops
from ninfer.core.dtypes import DType
from ninfer.kernels_cuda import moe as kmoe
from ninfer.ops import reference as ref

from cuda_testutil import (DTYPES, TOL_BF16_X, assert_close, assert_same_bits, dev, host,
                           poisoned, randn, weight_pair)

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
@pytest.mark.parametrize("hidden", [136, 296])  # 296: the combine's second column block is partial
def test_moe_experts_gemv_path(rng, dtype, n, hidden):
    experts, top_k, inter = 16, 4, 40
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
