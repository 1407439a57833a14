"""GPU kernels of embedding, the norms, rope and the elementwise ops against float64 oracles
(through the ninfer.ops entry points, which dispatch CuPy arrays to ninfer.kernels_cuda)."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer import ops
from ninfer.ops import reference as ref

from cuda_testutil import (DTYPES, assert_close, assert_same_bits, dev, host, poisoned, randn,
                           rows_view, weight_pair)

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding(rng, dtype):
    vocab, hidden, n = 301, 77, 13
    t_host, t_dev = weight_pair(rng, (vocab, hidden), dtype)
    ids = rng.integers(0, vocab, n).astype(np.int32)
    out = poisoned((n, hidden))
    ops.embedding(dev(ids), t_dev, out)
    assert_close(out, ref.embedding(ids, t_host), 1e-7)


def test_embedding_bad_id_gives_nan_row(rng):
    from ninfer.kernels_cuda.embedding import embedding

    t_host, t_dev = weight_pair(rng, (50, 33), DTYPES[0])
    ids = np.array([3, 50, -1, 7], np.int32)
    out = poisoned((4, 33))
    embedding(dev(ids), t_dev, out)
    o = host(out)
    assert np.isnan(o[1]).all() and np.isnan(o[2]).all()
    assert_close(o[[0, 3]], ref.embedding(ids[[0, 3]], t_host), 1e-7)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("zero_centered", [True, False])
@pytest.mark.parametrize("hidden", [37, 1024, 3000, 4096, 5120])
def test_rms_norm_strided_rows(rng, dtype, zero_centered, hidden):
    n = 7
    x_h, x_d = rows_view(rng, (n, hidden), pad=9)
    w_h, w_d = weight_pair(rng, (hidden,), dtype, scale=0.3)
    out = poisoned((n, hidden))
    ops.rms_norm(x_d, w_d, 1e-6, out, zero_centered=zero_centered)
    assert_close(out, ref.rms_norm(x_h, w_h, 1e-6, zero_centered=zero_centered))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_per_head_in_place(rng, dtype):
    """q_norm on the q half of an interleaved [q | gate] projection, written in place."""
    n, heads, d = 5, 3, 256
    qg_h = randn(rng, (n, heads, 2 * d))
    qg_d = dev(qg_h)
    w_h, w_d = weight_pair(rng, (d,), dtype, scale=0.3)
    expect = ref.rms_norm(qg_h[:, :, :d], w_h, 1e-6, zero_centered=True)
    q = qg_d[:, :, :d]
    ops.rms_norm(q, w_d, 1e-6, q, zero_centered=True)
    got = host(qg_d)
    assert_close(got[:, :, :d], expect)
    assert_same_bits(got[:, :, d:], qg_h[:, :, d:], "gate half untouched")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [2048, 4096, 5120])
def test_add_rms_norm(rng, dtype, hidden):
    n = 9
    res_h = randn(rng, (n, hidden))
    x_h = randn(rng, (n, hidden))
    w_h, w_d = weight_pair(rng, (hidden,), dtype, scale=0.3)
    res_d = dev(res_h)
    out = poisoned((n, hidden))
    ops.add_rms_norm(res_d, dev(x_h), w_d, 1e-6, out)
    exp_res, exp_out = ref.add_rms_norm(res_h, x_h, w_h, 1e-6)
    assert_close(res_d, exp_res, 1e-7)
    assert_close(out, exp_out)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_rms_norm(rng, dtype):
    n, hv, dv = 6, 5, 128
    x_h = randn(rng, (n, hv, dv))
    z_h, z_d = rows_view(rng, (n, hv * dv), pad=4)
    z_h, z_d = z_h.reshape(n, hv, dv), z_d.reshape(n, hv, dv)
    w_h, w_d = weight_pair(rng, (dv,), dtype)
    out = poisoned((n, hv, dv))
    ops.gated_rms_norm(dev(x_h), z_d, w_d, 1e-6, out)
    assert_close(out, ref.gated_rms_norm(x_h, z_h, w_h, 1e-6))


def test_l2norm_heads_strided(rng):
    n, hh, d = 11, 4, 128
    x_h, x_d = rows_view(rng, (n, hh * d), pad=6)
    x_h, x_d = x_h.reshape(n, hh, d), x_d.reshape(n, hh, d)
    out = poisoned((n, hh, d))
    ops.l2norm_heads(x_d, 1e-6, d ** -0.5, out)
    assert_close(out, ref.l2norm_heads(x_h, 1e-6, d ** -0.5))


def test_rope_mrope_partial(rng):
    n, heads, d, rot = 9, 3, 256, 64
    x_h = randn(rng, (n, heads, 2 * d))  # q half of [q | gate]
    x_d = dev(x_h)
    positions = rng.integers(0, 200_000, (3, n)).astype(np.int32)
    inv_freq = (1e7 ** (-np.arange(0, rot, 2) / rot)).astype(np.float32)
    freq_axis = np.array([0 if j % 3 == 0 else (1 if j % 3 == 1 else 2) for j in range(rot // 2)],
                         np.int32)
    expect = ref.rope(x_h[:, :, :d], positions, inv_freq, freq_axis)
    ops.rope(x_d[:, :, :d], dev(positions), dev(inv_freq), dev(freq_axis))
    got = host(x_d)
    assert_close(got[:, :, :d], expect, 1e-6)
    assert_same_bits(got[:, :, d:], x_h[:, :, d:], "gate half untouched")


def test_elementwise_ops(rng):
    n, m = 7, 333
    x_h = randn(rng, (n, m))
    g_h, g_d = rows_view(rng, (n, m), pad=3)
    out = poisoned((n, m))
    ops.sigmoid_mul(dev(x_h), g_d, out)
    assert_close(out, ref.sigmoid_mul(x_h, g_h), 1e-6)

    gu_h = randn(rng, (n, 2 * m))
    out = poisoned((n, m))
    ops.swiglu(dev(gu_h), out)
    assert_close(out, ref.swiglu(gu_h), 1e-6)

    acc_h, y_h = randn(rng, (n, m)), randn(rng, (n, m))
    gate_h, gate_d = rows_view(rng, (n, 1), pad=4)
    acc_d = dev(acc_h)
    ops.sigmoid_scale_add(acc_d, dev(y_h), gate_d)
    assert_close(acc_d, ref.sigmoid_scale_add(acc_h, y_h, gate_h), 1e-6)

    acc_d = dev(acc_h)
    ops.add_inplace(acc_d, dev(y_h))
    assert_close(acc_d, ref.add_inplace(acc_h, y_h), 1e-7)


@pytest.mark.parametrize("out_dtype", [np.float32, np.uint16])
def test_elementwise_vector_path_equals_scalar_path(rng, out_dtype):
    """Rows of 4096 aligned elements take the 4-wide kernel; the same values one element past an
    aligned base take the scalar one: bitwise equal outputs (f32 and bf16 bits)."""
    from ninfer.kernels_cuda import elementwise as kew

    n, m = 5, 4096
    x_h, g_h = randn(rng, (n, m), 3.0), randn(rng, (n, m), 3.0)
    assert kew._vec(m, dev(x_h), m, dev(g_h), m, poisoned((n, m)), m) == 4
    assert kew._vec(m, dev(x_h)[:, 1:], m, dev(g_h), m, poisoned((n, m)), m) == 1
    for op in ("sigmoid_mul", "swiglu"):
        outs = []
        for shift in (0, 1):
            # the operands and the output start `shift` elements into their buffers
            a = dev(np.concatenate([np.zeros((n, shift), np.float32), x_h], 1))[:, shift:]
            b = dev(np.concatenate([np.zeros((n, shift), np.float32), g_h], 1))[:, shift:]
            out = dev(np.full((n, m + shift), 0xFFFF if out_dtype == np.uint16 else np.nan,
                              out_dtype))[:, shift:]
            if op == "sigmoid_mul":
                kew.sigmoid_mul(a, b, out)
            else:
                gu = dev(np.concatenate([np.zeros((n, shift), np.float32), x_h, g_h], 1))
                kew.swiglu(gu[:, shift:], out)
            outs.append(host(out))
        assert_same_bits(outs[0], outs[1], op)
        if out_dtype == np.float32:
            assert np.isfinite(outs[0]).all()
        else:
            assert (outs[0] != 0xFFFF).all()


def test_rejects_operand_on_wrong_backend(rng):
    from ninfer.errors import InvalidInput
    from ninfer.kernels_cuda.elementwise import add_inplace

    with pytest.raises(InvalidInput, match="CuPy array"):
        add_inplace(dev(randn(rng, (2, 3))), randn(rng, (2, 3)))
