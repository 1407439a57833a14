"""paged_prefill_attention (bf16 tensor-core flash prefill) on the GPU: float64 oracle over odd
chunk lengths and offsets, GQA groups 1/4/6/8, head dims 64/128/256, page sizes 16/32 on shuffled
block tables, strided q/out; bitwise equality of a prompt run whole and in chunks; NaN rows for
invalid page ids; typed errors for bad operands."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.core.dtypes import f32_to_bf16_bits
from ninfer.errors import InvalidInput
from ninfer.kernels_cuda import attention_prefill as kpf
from ninfer.ops import reference as ref

from cuda_testutil import assert_close, assert_same_bits, dev, host, poisoned, randn

pytestmark = pytest.mark.gpu

TOL = 1e-4  # hi/lo bf16 splitting of q and P keeps the kernel near fp32 (~1e-5 expected)
BF16_NAN = 0x7FC0
SEQ = 1  # the sequence's block-table row (row 0 is a decoy on other pages)


def _setup(rng, hkv, d, page_size, total):
    """bf16 (k_pages, v_pages, block_tables) holding `total` keys of sequence row SEQ on
    shuffled pages. Slots past `total` hold NaN (the kernel must never read them), row 0 of the
    table points at other pages and two unused columns are -1."""
    need = -(-total // page_size)
    num_pages = 2 * need + 3
    kp = f32_to_bf16_bits(randn(rng, (num_pages, hkv, page_size, d)))
    vp = f32_to_bf16_bits(randn(rng, (num_pages, hkv, page_size, d)))
    perm = rng.permutation(num_pages)
    bt = np.full((3, need + 2), -1, np.int32)
    bt[SEQ, :need] = perm[:need]
    bt[0, :need] = perm[need:2 * need]
    tail = total % page_size
    if tail:
        kp[bt[SEQ, need - 1], :, tail:, :] = BF16_NAN
        vp[bt[SEQ, need - 1], :, tail:, :] = BF16_NAN
    return kp, vp, bt


def _oracle(q, kp, vp, bt, pos0, scale):
    """float64 causal GQA attention of q rows at positions pos0.. over sequence row SEQ."""
    length, heads, d = q.shape
    hkv = kp.shape[1]
    group = heads // hkv
    total = pos0 + length
    keys = ref.gather_kv(kp, bt, SEQ, total)  # [hkv, total, d]
    vals = ref.gather_kv(vp, bt, SEQ, total)
    qq = np.asarray(q, np.float64).reshape(length, hkv, group, d).transpose(1, 0, 2, 3)
    s = qq.reshape(hkv, length * group, d) @ keys.transpose(0, 2, 1) * scale
    pos = pos0 + np.repeat(np.arange(length), group)
    s[:, np.arange(total)[None, :] > pos[:, None]] = -np.inf
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = (p @ vals).reshape(hkv, length, group, d).transpose(1, 0, 2, 3)
    return o.reshape(length, heads, d)


SHAPES = [(4, 4, 128), (16, 4, 256), (24, 4, 256), (16, 2, 256), (12, 2, 128), (8, 1, 64)]


@pytest.mark.parametrize("heads,hkv,d", SHAPES)
@pytest.mark.parametrize("length,pos0", [(1, 0), (1, 77), (37, 0), (37, 77), (300, 0),
                                         (300, 77)])
@pytest.mark.parametrize("page_size", [16, 32])
def test_prefill_attention_vs_float64(rng, heads, hkv, d, length, pos0, page_size):
    kp, vp, bt = _setup(rng, hkv, d, page_size, pos0 + length)
    scale = d ** -0.5
    if page_size == 16:
        # q = the first half of an interleaved [q | gate] projection (16-byte aligned rows)
        q_full = randn(rng, (length, heads, 2 * d))
        q_h, q_d = q_full[:, :, :d], dev(q_full)[:, :, :d]
        out_full = poisoned((length, heads, d))
        out = out_full
    else:
        # odd row/head strides: the kernel's unaligned (scalar) q loads and out stores
        q_full = randn(rng, (length, heads, d + 1))
        q_h, q_d = q_full[:, :, 1:], dev(q_full)[:, :, 1:]
        out_full = poisoned((length, heads, d + 1))
        out = out_full[:, :, :d]
    kpf.paged_prefill_attention(q_d, dev(kp), dev(vp), dev(bt), SEQ, pos0, scale, out)
    assert_close(out, _oracle(q_h, kp, vp, bt, pos0, scale), TOL)
    if out is not out_full:
        assert np.isnan(host(out_full)[:, :, d:]).all(), "wrote outside out"


def test_prefill_attention_long_context(rng):
    heads, hkv, d, page_size, length, pos0 = 16, 4, 256, 16, 64, 1990
    kp, vp, bt = _setup(rng, hkv, d, page_size, pos0 + length)
    q = randn(rng, (length, heads, d))
    out = poisoned((length, heads, d))
    kpf.paged_prefill_attention(dev(q), dev(kp), dev(vp), dev(bt), SEQ, pos0, d ** -0.5, out)
    assert_close(out, _oracle(q, kp, vp, bt, pos0, d ** -0.5), TOL)


@pytest.mark.parametrize("heads,hkv,d,page_size", [(16, 4, 256, 16), (24, 4, 256, 32),
                                                   (4, 4, 128, 16), (16, 2, 64, 32)])
def test_chunked_prefill_bitwise_equals_whole(rng, heads, hkv, d, page_size):
    """Row invariance: a row depends only on its position and the KV contents."""
    length = 300
    kp, vp, bt = (dev(a) for a in _setup(rng, hkv, d, page_size, length))
    q_h = randn(rng, (length, heads, d))
    q = dev(q_h)
    scale = d ** -0.5
    whole = poisoned((length, heads, d))
    kpf.paged_prefill_attention(q, kp, vp, bt, SEQ, 0, scale, whole)
    assert_close(whole, _oracle(q_h, host(kp), host(vp), host(bt), 0, scale), TOL)
    for splits in ([128], [37, 251], [1, 2, 64, 65, 299]):
        parts = poisoned((length, heads, d))
        bounds = [0, *splits, length]
        for a, b in zip(bounds[:-1], bounds[1:]):
            kpf.paged_prefill_attention(q[a:b], kp, vp, bt, SEQ, a, scale, parts[a:b])
        assert_same_bits(parts, whole, f"chunks split at {splits}")


def test_segment_read_on_device_equals_host_segment(rng):
    """`segment` (what a replayed prefill graph uses): the kernel takes the block-table row,
    first position and live row count from the device array, not from the host arguments it was
    launched with; rows past the live count (padding of the captured size) stay unwritten."""
    heads, hkv, d, page_size, length, pos0 = 16, 4, 256, 16, 45, 70
    kp, vp, bt = (dev(a) for a in _setup(rng, hkv, d, page_size, pos0 + length))
    q = dev(randn(rng, (length, heads, d)))
    direct = poisoned((length, heads, d))
    kpf.paged_prefill_attention(q, kp, vp, bt, SEQ, pos0, d ** -0.5, direct)
    for live in (length, 33, 1):
        via_device = poisoned((length, heads, d))
        segment = dev(np.array([SEQ, pos0, live], np.int32))
        # host values of another (valid) chunk: decoy row 0 at position 0
        kpf.paged_prefill_attention(q, kp, vp, bt, 0, 0, d ** -0.5, via_device, segment=segment)
        assert_same_bits(via_device[:live], direct[:live], f"segment from the device, {live=}")
        assert np.isnan(host(via_device[live:])).all(), f"padding rows written, {live=}"
    with pytest.raises(InvalidInput, match="segment"):
        kpf.paged_prefill_attention(q, kp, vp, bt, SEQ, pos0, d ** -0.5, via_device,
                                    segment=dev(np.array([SEQ, pos0], np.int32)))


def test_invalid_page_gives_nan_rows(rng):
    heads, hkv, d, page_size, length = 8, 2, 128, 16, 100
    kp, vp, bt = _setup(rng, hkv, d, page_size, length)
    q_h = randn(rng, (length, heads, d))
    for col, bad in ((2, kp.shape[0] + 5), (4, -1)):  # keys [16*col, 16*col + 16) unreadable
        bad_bt = bt.copy()
        bad_bt[SEQ, col] = bad
        out = poisoned((length, heads, d))
        kpf.paged_prefill_attention(dev(q_h), dev(kp), dev(vp), dev(bad_bt), SEQ, 0, 0.1, out)
        o = host(out)
        first = col * page_size
        assert np.isnan(o[first:]).all(), f"rows from {first} must be NaN"
        assert_close(o[:first], _oracle(q_h[:first], kp, vp, bt, 0, 0.1), TOL)


def test_bad_operands_raise(rng):
    heads, hkv, d, page_size, length = 8, 2, 64, 16, 8
    kp_h, vp_h, bt_h = _setup(rng, hkv, d, page_size, 40)
    kp, vp, bt = dev(kp_h), dev(vp_h), dev(bt_h)
    q = dev(randn(rng, (length, heads, d)))
    out = poisoned((length, heads, d))
    good = dict(q=q, k_pages=kp, v_pages=vp, block_tables=bt, seq=SEQ, pos0=32, scale=0.125,
                out=out)

    def call(**changes):
        kpf.paged_prefill_attention(**{**good, **changes})

    call()  # the unchanged operands are accepted
    assert np.isfinite(host(out)).all()
    call(q=q[:0], out=out[:0])  # no rows: nothing to do
    capacity = bt.shape[1] * page_size
    f32_pages = dev(randn(rng, kp.shape))
    small_pages = dev(f32_to_bf16_bits(randn(rng, (4, hkv, 8, d))))
    wide_pages = dev(f32_to_bf16_bits(randn(rng, (4, hkv, page_size, 96))))
    bad = [
        dict(k_pages=f32_pages, v_pages=f32_pages),          # f32 pages: the old kernel's job
        dict(v_pages=f32_pages),                             # mixed page dtypes
        dict(k_pages=small_pages, v_pages=small_pages),      # page size 8
        dict(k_pages=wide_pages, v_pages=wide_pages,         # head dim 96
             q=dev(randn(rng, (length, heads, 96))), out=poisoned((length, heads, 96))),
        dict(q=dev(randn(rng, (length, 7, d))), out=poisoned((length, 7, d))),  # 7 % 2 heads
        dict(q=q.astype(np.float64)),
        dict(q=host(q)),                                     # not on the device
        dict(out=poisoned((length + 1, heads, d))),
        dict(out=poisoned((length, heads, 2 * d))[:, :, ::2]),  # inner dim strided
        dict(block_tables=bt.astype(np.int64)),
        dict(block_tables=bt[SEQ]),                          # 1-D
        dict(seq=bt.shape[0]),
        dict(seq=-1),
        dict(seq=1.5),
        dict(pos0=-1),
        dict(pos0=capacity - length + 1),                    # past the table's pages
        dict(scale=float("nan")),
    ]
    for changes in bad:
        with pytest.raises(InvalidInput):
            call(**changes)
