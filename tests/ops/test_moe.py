"""moe_route (softmax, top-k, ties, renormalisation, strided rows, rows without a softmax),
moe_experts (oracle, batch invariance, bitwise agreement with the dense linear path) and
moe_block (bitwise the separate ops; routed=True after moe_route bitwise routed=False)."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.core.tensor import Weight
from ninfer.ops import linear, moe_block, moe_experts, moe_route, sigmoid_scale_add, swiglu
from ninfer.ops import reference as ref

from .helpers import DTYPES, assert_close, assert_same_bits, poisoned, randn, rows_view, weight

E, H, IM, K = 7, 37, 11, 3


@pytest.mark.parametrize("n", [1, 3, 17])
def test_moe_route_picks_and_renormalises_top_k(rng, n):
    logits = randn(rng, (n, E), scale=2.0)
    w_out, ids_out = poisoned((n, K)), poisoned((n, K), np.int32)
    moe_route(logits, K, w_out, ids_out)
    expect_w, expect_ids = ref.moe_route(logits, K)
    assert np.array_equal(ids_out, expect_ids)
    assert_close(w_out, expect_w)
    assert np.allclose(w_out.sum(axis=1), 1.0, atol=1e-6)
    assert np.all(np.diff(w_out, axis=1) <= 0), "largest first"


def test_moe_route_ties_go_to_the_lower_id():
    logits = np.array([[0.5, 2.0, 2.0, -1.0, 2.0]], np.float32)
    w_out, ids_out = poisoned((1, 2)), poisoned((1, 2), np.int32)
    moe_route(logits, 2, w_out, ids_out)
    assert ids_out.tolist() == [[1, 2]]
    assert_close(w_out, [[0.5, 0.5]], 1e-7)


def test_moe_route_reads_strided_rows(rng):
    logits = rows_view(rng, (6, E), scale=2.0)
    w_out, ids_out = poisoned((6, K)), poisoned((6, K), np.int32)
    moe_route(logits, K, w_out, ids_out)
    w_ref, ids_ref = poisoned((6, K)), poisoned((6, K), np.int32)
    moe_route(np.ascontiguousarray(logits), K, w_ref, ids_ref)
    assert_same_bits(ids_out, ids_ref, "ids")
    assert_same_bits(w_out, w_ref, "weights")


def test_moe_route_rows_without_a_softmax(rng):
    """A NaN or +inf logit, or only -inf: experts 0..K-1 with NaN weights."""
    logits = randn(rng, (4, E), scale=2.0)
    logits[0, 4] = np.nan
    logits[1, 0] = np.inf
    logits[2] = -np.inf
    w_out, ids_out = poisoned((4, K)), poisoned((4, K), np.int32)
    moe_route(logits, K, w_out, ids_out)
    assert ids_out[:3].tolist() == [list(range(K))] * 3
    assert np.all(np.isnan(w_out[:3]))
    assert np.array_equal(ids_out[3:], ref.moe_route(logits[3:], K)[1])


@pytest.mark.parametrize("with_shared", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_block_equals_the_separate_ops_bitwise(rng, dtype, with_shared):
    n = 5
    x = randn(rng, (n, H))
    gate_up = weight(rng, (E, 2 * IM, H), dtype, scale=0.3)
    down = weight(rng, (E, H, IM), dtype, scale=0.3)
    logits = randn(rng, (n, E + 1), scale=2.0)  # [router logits | shared gate logit]
    shared = randn(rng, (n, H)) if with_shared else None
    gate = logits[:, E:] if with_shared else None
    w, ids, out = poisoned((n, K)), poisoned((n, K), np.int32), poisoned((n, H))
    moe_block(x, logits[:, :E], K, gate_up, down, w, ids, out, shared=shared, shared_gate=gate)
    w2, ids2, out2 = poisoned((n, K)), poisoned((n, K), np.int32), poisoned((n, H))
    moe_route(logits[:, :E], K, w2, ids2)
    moe_experts(x, gate_up, down, ids2, w2, out2)
    if with_shared:
        sigmoid_scale_add(out2, shared, gate)
    assert_same_bits(ids, ids2, "ids")
    assert_same_bits(w, w2, "weights")
    assert_same_bits(out, out2, "out")


@pytest.mark.parametrize("with_shared", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 5])
def test_moe_block_routed_equals_unrouted_bitwise(rng, dtype, with_shared, n):
    """moe_route (a workspace argument is ignored on the CPU), then moe_block(routed=True):
    bitwise moe_block(routed=False); routed=True reads the given ids / weights, not logits."""
    x = randn(rng, (n, H))
    gate_up = weight(rng, (E, 2 * IM, H), dtype, scale=0.3)
    down = weight(rng, (E, H, IM), dtype, scale=0.3)
    logits = randn(rng, (n, E + 1), scale=2.0)
    shared = randn(rng, (n, H)) if with_shared else None
    gate = logits[:, E:] if with_shared else None
    w, ids, out = poisoned((n, K)), poisoned((n, K), np.int32), poisoned((n, H))
    moe_block(x, logits[:, :E], K, gate_up, down, w, ids, out, shared=shared, shared_gate=gate)
    w2, ids2, out2 = poisoned((n, K)), poisoned((n, K), np.int32), poisoned((n, H))
    moe_route(logits[:, :E], K, w2, ids2, workspace=None)
    stale = np.full((n, E), np.nan, np.float32)  # routed=True must not read the logits
    moe_block(x, stale, K, gate_up, down, w2, ids2, out2, shared=shared, shared_gate=gate,
              routed=True)
    assert_same_bits(ids2, ids, "ids")
    assert_same_bits(w2, w, "weights")
    assert_same_bits(out2, out, "out")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 17])
def test_moe_experts_vs_float64(rng, dtype, n):
    x = randn(rng, (n, H))
    gate_up = weight(rng, (E, 2 * IM, H), dtype, scale=0.3)
    down = weight(rng, (E, H, IM), dtype, scale=0.3)
    w, ids = ref.moe_route(randn(rng, (n, E)), K)
    weights = w.astype(np.float32)
    out = poisoned((n, H))
    moe_experts(x, gate_up, down, ids, weights, out)
    assert_close(out, ref.moe_experts(x, gate_up, down, ids, weights))


@pytest.mark.parametrize("dtype", DTYPES)
def test_moe_experts_is_batch_invariant(rng, dtype):
    n = 19
    x = randn(rng, (n, H))
    gate_up = weight(rng, (E, 2 * IM, H), dtype, scale=0.3)
    down = weight(rng, (E, H, IM), dtype, scale=0.3)
    w, ids = ref.moe_route(randn(rng, (n, E)), K)
    weights = w.astype(np.float32)
    whole = poisoned((n, H))
    moe_experts(x, gate_up, down, ids, weights, whole)
    for i in (0, 5, 18):
        one = poisoned((1, H))
        moe_experts(x[i:i + 1], gate_up, down, ids[i:i + 1], weights[i:i + 1], one)
        assert_same_bits(one[0], whole[i], f"row {i}")


def test_moe_single_expert_equals_the_linear_path_bitwise(rng):
    x = randn(rng, (4, H))
    gate_up = weight(rng, (E, 2 * IM, H), DTYPES[1], scale=0.3)
    down = weight(rng, (E, H, IM), DTYPES[1], scale=0.3)
    e = 5
    out = poisoned((4, H))
    moe_experts(x, gate_up, down, np.full((4, 1), e, np.int32), np.ones((4, 1), np.float32), out)
    gu, act, y = poisoned((4, 2 * IM)), poisoned((4, IM)), poisoned((4, H))
    linear(x, Weight(gate_up.data[e], gate_up.dtype), gu)
    swiglu(gu, act)
    linear(act, Weight(down.data[e], down.dtype), y)
    assert_same_bits(out, y, "expert via moe_experts vs linear/swiglu/linear")


def test_moe_checks(rng):
    with pytest.raises(ValueError, match="top_k must be"):
        moe_route(randn(rng, (2, E)), E + 1, poisoned((2, E + 1)), poisoned((2, E + 1), np.int32))
    gate_up = weight(rng, (E, 2 * IM, H), DTYPES[0])
    down = weight(rng, (E, H, IM), DTYPES[0])
    with pytest.raises(ValueError, match="expert id outside"):
        moe_experts(randn(rng, (1, H)), gate_up, down, np.array([[E]], np.int32),
                    np.ones((1, 1), np.float32), poisoned((1, H)))
    args = (randn(rng, (1, H)), randn(rng, (1, E)), K, gate_up, down, poisoned((1, K)),
            poisoned((1, K), np.int32), poisoned((1, H)))
    with pytest.raises(ValueError, match="go together"):
        moe_block(*args, shared=randn(rng, (1, H)))
    with pytest.raises(ValueError, match="logits must have shape"):
        moe_block(args[0], randn(rng, (1, E + 1)), *args[2:])
    with pytest.raises(ValueError, match="down must have shape"):
        moe_experts(randn(rng, (1, H)), gate_up, weight(rng, (E, H, IM + 1), DTYPES[0]),
                    np.array([[0]], np.int32), np.ones((1, 1), np.float32), poisoned((1, H)))


def test_moe_route_with_swiglu_is_cuda_only(rng):
    """The routing-beside-the-shared-gate_up launch is a CUDA decode op: on the CPU
    `moe_route_with_swiglu_applies` says no and the op raises a TypeError naming what the CPU
    runs instead."""
    from ninfer.core.dtypes import DType
    from ninfer.ops import moe_route_with_swiglu, moe_route_with_swiglu_applies

    n = 2
    x, logits = randn(rng, (n, H)), randn(rng, (n, E), scale=2.0)
    gate_up = weight(rng, (2 * IM, H), DType.BFLOAT16)
    assert not moe_route_with_swiglu_applies(logits, K, x, gate_up)
    with pytest.raises(TypeError, match="CUDA-only"):
        moe_route_with_swiglu(logits, K, poisoned((n, K)), poisoned((n, K), np.int32), x,
                              gate_up, poisoned((n, IM)), workspace=None)


def test_moe_block_shared_down_folds_only_on_cuda(rng):
    """The shared down projection folded into moe_block is a CUDA decode path: on the CPU
    `moe_block_folds_shared_down` says no and moe_block refuses `shared_down` with a ValueError
    (the caller runs `linear` first); `shared_down` without `shared`, or of the wrong width, is
    refused by the checks before that."""
    from ninfer.ops import moe_block_folds_shared_down

    n, inner = 1, 16
    gate_up = weight(rng, (E, 2 * IM, H), DTYPES[0])
    down = weight(rng, (E, H, IM), DTYPES[0])
    shared_down = weight(rng, (H, inner), DTYPES[0])
    x, logits, act = randn(rng, (n, H)), randn(rng, (n, E)), randn(rng, (n, inner))
    assert not moe_block_folds_shared_down(x, K, gate_up, down, shared_down, act)
    outs = (poisoned((n, K)), poisoned((n, K), np.int32), poisoned((n, H)))
    with pytest.raises(ValueError, match="folds only"):
        moe_block(x, logits, K, gate_up, down, *outs, shared=act, shared_gate=randn(rng, (n, 1)),
                  shared_down=shared_down)
    with pytest.raises(ValueError, match="needs shared"):
        moe_block(x, logits, K, gate_up, down, *outs, shared_down=shared_down)
    with pytest.raises(ValueError, match="shared_down"):
        moe_block(x, logits, K, gate_up, down, *outs, shared=act,
                  shared_gate=randn(rng, (n, 1)), shared_down=weight(rng, (H + 1, inner),
                                                                     DTYPES[0]))


def test_moe_bf16_x_and_act_are_cuda_only(rng, monkeypatch):
    """An MoE input as bf16 bits is a CUDA path: on the CPU `moe_reads_bf16_x` says no (flag on
    or off, bf16 weights) and moe_block / moe_experts refuse a uint16 x with a TypeError."""
    from ninfer.core.dtypes import DType
    from ninfer.ops import moe_reads_bf16_x

    n = 2
    router = weight(rng, (E + 1, H), DType.BFLOAT16)
    shared_gu = weight(rng, (2 * IM, H), DType.BFLOAT16)
    gate_up = weight(rng, (E, 2 * IM, H), DType.BFLOAT16)
    down = weight(rng, (E, H, IM), DType.BFLOAT16)
    for flag in ("1", "0"):
        monkeypatch.setenv("NINFER_MOE_BF16_X", flag)
        assert not moe_reads_bf16_x(n, router, shared_gu, gate_up)
    x = np.zeros((n, H), np.uint16)
    outs = (poisoned((n, K)), poisoned((n, K), np.int32), poisoned((n, H)))
    with pytest.raises(TypeError, match="CUDA-only"):
        moe_block(x, randn(rng, (n, E)), K, gate_up, down, *outs)
    with pytest.raises(TypeError, match="CUDA-only"):
        moe_experts(x, gate_up, down, np.zeros((n, K), np.int32), np.ones((n, K), np.float32),
                    outs[2])
    xf = randn(rng, (n, H))
    with pytest.raises(TypeError, match="bf16_act is CUDA-only"):
        moe_block(xf, randn(rng, (n, E)), K, gate_up, down, *outs, bf16_act=True)
    with pytest.raises(TypeError, match="bf16_act is CUDA-only"):
        moe_experts(xf, gate_up, down, np.zeros((n, K), np.int32), np.ones((n, K), np.float32),
                    outs[2], bf16_act=True)
