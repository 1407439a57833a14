"""sigmoid_mul (2-D and 3-D strided gate), swiglu, sigmoid_scale_add, add_inplace."""
from __future__ import annotations

import pytest

from ninfer.ops import add_inplace, sigmoid_mul, sigmoid_scale_add, swiglu
from ninfer.ops import reference as ref

from .helpers import assert_close, poisoned, randn, rows_view


@pytest.mark.parametrize("n", [1, 3, 17])
def test_sigmoid_mul_2d(rng, n):
    x = randn(rng, (n, 23))
    gate = rows_view(rng, (n, 23), scale=3.0)
    out = poisoned((n, 23))
    sigmoid_mul(x, gate, out)
    assert_close(out, ref.sigmoid_mul(x, gate))


def test_sigmoid_mul_attention_gate_in_place(rng):
    n, heads, d = 5, 3, 11
    qg = randn(rng, (n, heads, 2 * d))
    attn = randn(rng, (n, heads, d))
    expect = ref.sigmoid_mul(attn, qg[:, :, d:])
    sigmoid_mul(attn, qg[:, :, d:], attn)
    assert_close(attn, expect)


@pytest.mark.parametrize("n", [1, 3, 17])
def test_swiglu(rng, n):
    gate_up = randn(rng, (n, 2 * 19), scale=2.0)
    out = poisoned((n, 19))
    swiglu(gate_up, out)
    assert_close(out, ref.swiglu(gate_up))


@pytest.mark.parametrize("n", [1, 3, 17])
def test_sigmoid_scale_add_and_add_inplace(rng, n):
    acc = randn(rng, (n, 13))
    y = randn(rng, (n, 13))
    fused = randn(rng, (n, 9))  # e.g. [router logits | shared-expert gate]
    gate = fused[:, 8:9]
    expect = ref.sigmoid_scale_add(acc, y, gate)
    sigmoid_scale_add(acc, y, gate)
    assert_close(acc, expect)
    x = randn(rng, (n, 13))
    expect = ref.add_inplace(acc, x)
    add_inplace(acc, x)
    assert_close(acc, expect)


def test_swiglu_rejects_odd_width(rng):
    with pytest.raises(ValueError, match="odd"):
        swiglu(randn(rng, (2, 7)), poisoned((2, 3)))
