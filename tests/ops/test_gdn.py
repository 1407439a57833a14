"""gdn_conv, gdn_gates, gdn_recurrence on StateImage views: float64 oracles, Hv/Hk grouping,
strided views, and bitwise chunk/batch invariance."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.core.state_image import GdnStateShape, StateImageLayout, StateImageStorage
from ninfer.ops import gdn_conv, gdn_gates, gdn_recurrence
from ninfer.ops import reference as ref

from .helpers import DTYPES, assert_close, assert_same_bits, poisoned, randn, weight

KC, HK, DK, HV, DV = 4, 2, 9, 6, 7
C = 2 * HK * DK + HV * DV
SHAPE = GdnStateShape(KC, C, HV, DK, DV)
LAYER = 1  # the second GDN layer: its fields sit at a non-zero offset of the image


def _storage(rng, num_slots=4):
    store = StateImageStorage(StateImageLayout.uniform(2, SHAPE), num_slots)
    store.data[:] = randn(rng, store.data.shape, scale=0.5)
    return store


def _segments(lengths, slots):
    starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return starts, np.asarray(slots, np.int32)


def _qkv(rng, n, g_scale=1.0):
    """Recurrence inputs as views of one conv output [N, C] (q and k L2-normalised in place)."""
    u = randn(rng, (n, C))
    q = u[:, :HK * DK].reshape(n, HK, DK)
    k = u[:, HK * DK:2 * HK * DK].reshape(n, HK, DK)
    v = u[:, 2 * HK * DK:].reshape(n, HV, DV)
    q[:] = ref.l2norm_heads(q, 1e-6, DK ** -0.5)
    k[:] = ref.l2norm_heads(k, 1e-6, 1.0)
    g = (-np.abs(randn(rng, (n, HV))) * g_scale).astype(np.float32)
    beta = rng.uniform(0.05, 0.95, (n, HV)).astype(np.float32)
    return q, k, v, g, beta


@pytest.mark.parametrize("dtype", DTYPES)
def test_gdn_conv_segments_vs_float64(rng, dtype):
    store = _storage(rng)
    lengths, slots = (5, 1, 0, 2), (2, 0, 1, 3)
    starts, seg_slots = _segments(lengths, slots)
    n = int(starts[-1])
    x = randn(rng, (n, C + 6))[:, 3:3 + C]  # a column block of a wider projection
    w = weight(rng, (C, KC), dtype, scale=0.5)
    conv = store.conv_view(LAYER)
    expect_out, expect_state = ref.gdn_conv(x, w, conv, starts, seg_slots)
    untouched = store.rec_view(LAYER).copy()
    out = poisoned((n, C))
    gdn_conv(x, w, conv, starts, seg_slots, out)
    assert_close(out, expect_out)
    assert_close(conv, expect_state)
    assert_same_bits(store.rec_view(LAYER), untouched, "recurrent field untouched")


def test_gdn_conv_chunking_is_bitwise_invariant(rng):
    x = randn(rng, (37, C))
    w = weight(rng, (C, KC), DTYPES[1], scale=0.5)
    ref_store = _storage(rng)
    initial = ref_store.data.copy()
    starts, slots = _segments((37,), (1,))
    whole = poisoned((37, C))
    gdn_conv(x, w, ref_store.conv_view(LAYER), starts, slots, whole)
    for chunk in (1, 7, 16):
        store = _storage(rng)
        store.data[:] = initial
        out = poisoned((37, C))
        for t0 in range(0, 37, chunk):
            t1 = min(37, t0 + chunk)
            st, sl = _segments((t1 - t0,), (1,))
            gdn_conv(x[t0:t1], w, store.conv_view(LAYER), st, sl, out[t0:t1])
        assert_same_bits(out, whole, f"conv output, chunks of {chunk}")
        assert_same_bits(store.data, ref_store.data, f"conv state, chunks of {chunk}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 17])
def test_gdn_gates(rng, dtype, n):
    fused = randn(rng, (n, 2 * HV + 3), scale=4.0)
    b, a = fused[:, :HV], fused[:, HV:2 * HV]
    a[0, 0] = 30.0  # beyond the softplus threshold
    a_log = weight(rng, (HV,), dtype, scale=0.5)
    dt_bias = weight(rng, (HV,), dtype)
    g_out, beta_out = poisoned((n, HV)), poisoned((n, HV))
    gdn_gates(a, b, a_log, dt_bias, g_out, beta_out)
    expect_g, expect_beta = ref.gdn_gates(a, b, a_log, dt_bias)
    assert_close(g_out, expect_g)
    assert_close(beta_out, expect_beta)
    assert np.all(g_out < 0)


def test_gdn_recurrence_vs_float64(rng):
    store = _storage(rng, num_slots=5)
    lengths, slots = (6, 1, 11), (4, 0, 2)
    starts, seg_slots = _segments(lengths, slots)
    n = int(starts[-1])
    q, k, v, g, beta = _qkv(rng, n)
    rec = store.rec_view(LAYER)
    expect_out, expect_state = ref.gdn_recurrence(q, k, v, g, beta, rec, starts, seg_slots)
    out = poisoned((n, HV, DV))
    gdn_recurrence(q, k, v, g, beta, rec, starts, seg_slots, out)
    assert_close(out, expect_out)
    assert_close(rec, expect_state)


def test_gdn_recurrence_chunking_and_batching_are_bitwise_invariant(rng):
    q, k, v, g, beta = _qkv(rng, 37 + 5, g_scale=0.3)
    base = _storage(rng)
    initial = base.data.copy()
    # Reference run: sequence A (37 tokens, slot 1) and sequence B (5 tokens, slot 3) together.
    starts, slots = _segments((37, 5), (1, 3))
    whole = poisoned((42, HV, DV))
    gdn_recurrence(q, k, v, g, beta, base.rec_view(LAYER), starts, slots, whole)
    for chunk in (1, 7, 16):
        store = _storage(rng)
        store.data[:] = initial
        out = poisoned((42, HV, DV))
        for t0 in range(0, 37, chunk):
            t1 = min(37, t0 + chunk)
            st, sl = _segments((t1 - t0,), (1,))
            gdn_recurrence(q[t0:t1], k[t0:t1], v[t0:t1], g[t0:t1], beta[t0:t1],
                           store.rec_view(LAYER), st, sl, out[t0:t1])
        st, sl = _segments((5,), (3,))
        gdn_recurrence(q[37:], k[37:], v[37:], g[37:], beta[37:], store.rec_view(LAYER), st, sl,
                       out[37:])
        assert_same_bits(out, whole, f"outputs, chunks of {chunk}")
        assert_same_bits(store.data, base.data, f"states, chunks of {chunk}")


def test_gdn_segment_checks(rng):
    store = _storage(rng)
    x = randn(rng, (3, C))
    w = weight(rng, (C, KC), DTYPES[0])
    out = poisoned((3, C))
    conv = store.conv_view(LAYER)
    with pytest.raises(ValueError, match="seg_starts must rise"):
        gdn_conv(x, w, conv, np.array([0, 2], np.int32), np.array([0], np.int32), out)
    with pytest.raises(ValueError, match="two segments"):
        gdn_conv(x, w, conv, np.array([0, 1, 3], np.int32), np.array([2, 2], np.int32), out)
    with pytest.raises(ValueError, match="seg_slots outside"):
        gdn_conv(x, w, conv, np.array([0, 3], np.int32), np.array([4], np.int32), out)
    with pytest.raises(ValueError, match="conv_state must be C-contiguous after"):
        gdn_conv(x, w, np.zeros((4, C, KC - 1), np.float32).transpose(0, 2, 1),
                 np.array([0, 3], np.int32), np.array([0], np.int32), out)
    q, k, v, g, beta = _qkv(rng, 3)
    with pytest.raises(ValueError, match="not a multiple"):
        gdn_recurrence(q, k, v[:, :5], g[:, :5], beta[:, :5], store.rec_view(LAYER),
                       np.array([0, 3], np.int32), np.array([0], np.int32), poisoned((3, 5, DV)))
