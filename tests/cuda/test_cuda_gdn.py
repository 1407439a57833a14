"""GDN kernels on the GPU: conv (multi-token segments and one-token decode), gates, the
recurrence, the chunkwise prefill (vs the recurrence and vs float64, split invariance at chunk
boundaries), and the fused decode step (vs the composition of the float64 references)."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer import ops
from ninfer.kernels_cuda import gdn as kgdn
from ninfer.kernels_cuda.gdn_decode import decode_counters
from ninfer.ops import reference as ref

from cuda_testutil import (DTYPES, assert_chunk_prefill_splits_bitwise, assert_close, dev,
                           gdn_inputs, host, poisoned, randn, segments, slot_strided, weight_pair)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lengths,slots", [((5, 1, 0, 9), (2, 0, 1, 3)), ((1, 1, 1), (3, 0, 2))])
def test_gdn_conv(rng, dtype, lengths, slots):
    kc, c = 4, 200
    starts, seg_slots = segments(lengths, slots)
    n = int(starts[-1])
    x_full = randn(rng, (n, c + 6))
    x_h = x_full[:, 3:3 + c]
    w_h, w_d = weight_pair(rng, (c, kc), dtype, scale=0.5)
    st_h, st_d, _ = slot_strided(rng, 4, (kc - 1, c))
    exp_out, exp_state = ref.gdn_conv(x_h, w_h, st_h, starts, seg_slots)
    out = poisoned((n, c))
    ops.gdn_conv(dev(x_full)[:, 3:3 + c], w_d, st_d, dev(starts), dev(seg_slots), out)
    assert_close(out, exp_out, 1e-6)
    assert_close(st_d, exp_state, 1e-7)


def test_gdn_gates(rng):
    n, hv = 9, 48
    a_h, b_h = randn(rng, (n, hv), 3.0), randn(rng, (n, hv))
    a_log_h, a_log_d = weight_pair(rng, (hv,), DTYPES[0])
    dt_h, dt_d = weight_pair(rng, (hv,), DTYPES[1])
    g, beta = poisoned((n, hv)), poisoned((n, hv))
    ops.gdn_gates(dev(a_h), dev(b_h), a_log_d, dt_d, g, beta)
    exp_g, exp_beta = ref.gdn_gates(a_h, b_h, a_log_h, dt_h)
    assert_close(g, exp_g, 1e-6)
    assert_close(beta, exp_beta, 1e-6)


@pytest.mark.parametrize("hk,hv,dk,dv", [(2, 6, 32, 48), (1, 2, 128, 128)])
def test_gdn_recurrence(rng, hk, hv, dk, dv):
    starts, seg_slots = segments((7, 0, 3, 1), (1, 3, 0, 2))
    n = int(starts[-1])
    q, k, v, g, beta = gdn_inputs(rng, n, hk, hv, dk, dv)
    st_h, st_d, _ = slot_strided(rng, 4, (hv, dk, dv), scale=0.1)
    exp_out, exp_state = ref.gdn_recurrence(q, k, v, g, beta, st_h, starts, seg_slots)
    out = poisoned((n, hv, dv))
    ops.gdn_recurrence(dev(q), dev(k), dev(v), dev(g), dev(beta), st_d, dev(starts),
                       dev(seg_slots), out)
    assert_close(out, exp_out)
    assert_close(st_d, exp_state)


@pytest.mark.parametrize("hk,hv,dk,dv", [(2, 4, 128, 128), (1, 3, 40, 72)])
def test_chunk_prefill_vs_recurrence(rng, hk, hv, dk, dv):
    lengths, slots = (150, 64, 0, 1, 200), (3, 0, 1, 4, 2)
    starts, seg_slots = segments(lengths, slots)
    n = int(starts[-1])
    q, k, v, g, beta = gdn_inputs(rng, n, hk, hv, dk, dv, g_scale=0.05)
    st_h, st_rec, _ = slot_strided(rng, 5, (hv, dk, dv), scale=0.1)
    _, st_chunk, _ = slot_strided(rng, 5, (hv, dk, dv), scale=0.1)
    st_chunk[...] = st_rec
    args = [dev(a) for a in (q, k, v, g, beta)]
    out_rec, out_chunk = poisoned((n, hv, dv)), poisoned((n, hv, dv))
    kgdn.gdn_recurrence(*args, st_rec, dev(starts), dev(seg_slots), out_rec)
    kgdn.gdn_chunk_prefill(*args, st_chunk, dev(starts), dev(seg_slots), out_chunk)
    exp_out, exp_state = ref.gdn_recurrence(q, k, v, g, beta, st_h, starts, seg_slots)
    assert_close(out_chunk, exp_out, 5e-5, "chunk output")
    assert_close(st_chunk, exp_state, 5e-5, "chunk state")
    assert_close(out_chunk, host(out_rec), 5e-5, "chunk vs recurrence")


def test_chunk_prefill_split_at_64_is_bitwise_identical(rng):
    assert_chunk_prefill_splits_bitwise(rng, 192, 1, 2, 128, 128, (128,), 0.05, slots=1,
                                        contiguous_split_state=False)


@pytest.mark.parametrize("wdtype", DTYPES)
@pytest.mark.parametrize("hk,hv,dk,dv", [(2, 6, 64, 32), (1, 2, 128, 128)])
def test_decode_fused_vs_unfused_reference(rng, wdtype, hk, hv, dk, dv):
    kc, n, eps = 4, 3, 1e-6
    c = 2 * hk * dk + hv * dv
    slots = np.array([2, 0, 3], np.int32)
    conv_h, conv_d, _ = slot_strided(rng, 4, (kc - 1, c))
    st_h, st_d, _ = slot_strided(rng, 4, (hv, dk, dv), scale=0.1)
    cw_h, cw_d = weight_pair(rng, (c, kc), wdtype, scale=0.5)
    alog_h, alog_d = weight_pair(rng, (hv,), wdtype, scale=0.5)
    dt_h, dt_d = weight_pair(rng, (hv,), wdtype)
    nw_h, nw_d = weight_pair(rng, (dv,), wdtype)
    counters = decode_counters(n, hk)
    starts = np.arange(n + 1, dtype=np.int32)
    for step in range(3):  # repeated steps: the conv-state counters must reset themselves
        qkv = randn(rng, (n, c))
        a, b = randn(rng, (n, hv)), randn(rng, (n, hv))
        z = randn(rng, (n, hv, dv))
        u, conv_h = ref.gdn_conv(qkv, cw_h, conv_h, starts, slots)
        q = ref.l2norm_heads(u[:, :hk * dk].reshape(n, hk, dk), 1e-6, dk ** -0.5)
        k = ref.l2norm_heads(u[:, hk * dk:2 * hk * dk].reshape(n, hk, dk), 1e-6, 1.0)
        vv = u[:, 2 * hk * dk:].reshape(n, hv, dv)
        g, beta = ref.gdn_gates(a, b, alog_h, dt_h)
        o, st_h = ref.gdn_recurrence(q, k, vv, g, beta, st_h, starts, slots)
        expect = ref.gated_rms_norm(o, z, nw_h, eps)
        out = poisoned((n, hv, dv))
        kgdn.gdn_decode_fused(dev(qkv), cw_d, conv_d, dev(a), dev(b), alog_d, dt_d, st_d,
                              dev(slots), dev(z), nw_d, eps, out, counters=counters)
        assert_close(out, expect, 5e-5, f"step {step} output")
        assert_close(conv_d, conv_h, 1e-7, f"step {step} conv state")
        assert_close(st_d, st_h, 5e-5, f"step {step} state")
    assert int(host(counters).sum()) == 0
