"""attn_prep (one launch) against the unfused ops it replaces: rms_norm -> rope for q and k,
kv_write of k and v, and the gate copy. Bitwise equal outputs and page contents, for f32 and
bf16 norm weights / pages, decode-like and prefill-like rows, and an invalid page id skipped."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer import ops
from ninfer.core.dtypes import DType

from cuda_testutil import DTYPES, assert_same_bits, cp, dev, poisoned, randn, weight_pair

pytestmark = pytest.mark.gpu


def _positions(rng, n, row_pos):
    pos = np.stack([row_pos, row_pos + rng.integers(0, 5, n), row_pos + rng.integers(0, 5, n)])
    return dev(pos.astype(np.int32))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,a,hkv,d,rot", [(1, 16, 4, 256, 64), (5, 6, 1, 128, 32),
                                           (37, 8, 2, 64, 64)])
def test_attn_prep_equals_unfused_ops(rng, dtype, n, a, hkv, d, rot):
    pages, page_size, seqs, cols = 40, 16, 3, 8
    proj = dev(randn(rng, (n, 2 * a * d + 2 * hkv * d + 3), 2.0))[:, 3:]  # strided rows
    qg = proj[:, :2 * a * d].reshape(n, a, 2 * d)
    k = proj[:, 2 * a * d: 2 * a * d + hkv * d].reshape(n, hkv, d)
    v = proj[:, 2 * a * d + hkv * d:].reshape(n, hkv, d)
    _, qn = weight_pair(rng, (d,), dtype, 0.3)
    _, kn = weight_pair(rng, (d,), dtype, 0.3)
    half = rot // 2
    inv_freq = dev((1.0 / 1e4 ** (np.arange(half) / half)).astype(np.float32))
    axis = dev((np.arange(half) % 3).astype(np.int32))
    bt_h = rng.permutation(pages)[:seqs * cols].reshape(seqs, cols).astype(np.int32)
    bt_h[2, 1] = pages + 3  # an invalid page: rows mapping there write nothing
    bt = dev(bt_h)
    # distinct (sequence, position) slots: two rows writing one slot would race in both paths
    # (never on the invalid page but for row 0 when n > 1: a lone row there writes no key)
    slots = np.arange(seqs * cols * page_size)
    valid = ~((slots // (cols * page_size) == 2) & ((slots // page_size) % cols == 1))
    flat = rng.choice(slots[valid], n, replace=False)
    row_seq_h = (flat // (cols * page_size)).astype(np.int32)
    row_pos_h = (flat % (cols * page_size)).astype(np.int32)
    if n > 1:
        clash = (row_seq_h == 2) & (row_pos_h == page_size + 3)
        row_seq_h[clash], row_pos_h[clash] = row_seq_h[0], row_pos_h[0]
        row_seq_h[0], row_pos_h[0] = 2, page_size + 3
    row_seq, row_pos = dev(row_seq_h), dev(row_pos_h)
    pos = _positions(rng, n, row_pos_h)
    kv_dtype = np.float32 if dtype is DType.FLOAT32 else np.uint16
    init = dev(rng.integers(0, 2**15, (pages, hkv, page_size, d)).astype(kv_dtype))

    # unfused reference
    q_ref, k_ref, g_ref = poisoned((n, a, d)), poisoned((n, hkv, d)), poisoned((n, a, d))
    kp_ref, vp_ref = init.copy(), init.copy()
    ops.rms_norm(qg[:, :, :d], qn, 1e-6, q_ref, zero_centered=True)
    ops.rms_norm(k, kn, 1e-6, k_ref, zero_centered=True)
    ops.rope(q_ref, pos, inv_freq, axis)
    ops.rope(k_ref, pos, inv_freq, axis)
    ops.kv_write(k_ref, v, kp_ref, vp_ref, bt, row_seq, row_pos)
    cp().copyto(g_ref, qg[:, :, d:])

    q_out, g_out = poisoned((n, a, d)), poisoned((n, a, d))
    kp, vp = init.copy(), init.copy()
    ops.attn_prep(qg, k, v, qn, kn, 1e-6, pos, inv_freq, axis, q_out, g_out, kp, vp, bt,
                  row_seq, row_pos)
    assert_same_bits(q_out, q_ref, "q")
    assert_same_bits(g_out, g_ref, "gate")
    assert_same_bits(kp, kp_ref, "k pages")
    assert_same_bits(vp, vp_ref, "v pages")
    assert not bool(cp().array_equal(kp, init)), "no key was written"

