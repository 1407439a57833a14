"""The CUDA-only fused ops refuse host (NumPy) operands with a TypeError naming the op, instead
of crashing in a kernel module the CPU backend does not have."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer import ops


def test_attn_prep_rejects_cpu_arrays():
    x = np.ones((1, 2, 8), np.float32)
    with pytest.raises(TypeError, match="attn_prep is a CUDA-only op"):
        ops.attn_prep(x, x[:, :, :4], x[:, :, :4], None, None, 1e-6, np.zeros((3, 1), np.int32),
                      np.ones(2, np.float32), np.zeros(2, np.int32), x[:, :, :4], x[:, :, :4],
                      x, x, np.zeros((1, 1), np.int32), np.zeros(1, np.int32),
                      np.zeros(1, np.int32))


def test_gdn_decode_fused_rejects_cpu_arrays():
    a = np.ones((1, 4), np.float32)
    with pytest.raises(TypeError, match="gdn_decode_fused is a CUDA-only op"):
        ops.gdn_decode_fused(a, a, a, a, a, a, a, a, np.zeros(1, np.int32), a, a, 1e-6, a)


def test_bf16_activations_are_cuda_only():
    """uint16 (bf16 bits) activations exist only for the CUDA cuBLAS GEMMs' operands."""
    from ninfer.core.dtypes import DType
    from ninfer.core.tensor import Weight
    from ninfer.ops.linear import reads_bf16_x

    x = np.ones((9, 8), np.float32)
    bits = np.zeros((9, 8), np.uint16)
    w = Weight(np.zeros((8,), np.uint16), DType.BFLOAT16)
    w2 = Weight(np.zeros((4, 8), np.uint16), DType.BFLOAT16)
    match = "bf16 .* is CUDA-only"
    with pytest.raises(TypeError, match=match):
        ops.rms_norm(x, w, 1e-6, bits, zero_centered=True)
    with pytest.raises(TypeError, match=match):
        ops.add_rms_norm(x.copy(), x, w, 1e-6, bits)
    with pytest.raises(TypeError, match=match):
        ops.gated_rms_norm(x.reshape(9, 1, 8), x.reshape(9, 1, 8), w, 1e-6, bits.reshape(9, 1, 8))
    with pytest.raises(TypeError, match=match):
        ops.sigmoid_mul(x, x, bits)
    with pytest.raises(TypeError, match=match):
        ops.swiglu(np.ones((9, 16), np.float32), bits)
    with pytest.raises(TypeError, match=match):
        ops.linear(bits, w2, np.zeros((9, 4), np.float32))
    assert not reads_bf16_x(100, w2)


def test_norm_fold_is_cuda_only():
    """linear_residual_norm and a linear's row_norm (the norm fold) refuse host operands; the
    fold never applies on the CPU."""
    from ninfer.core.dtypes import DType
    from ninfer.core.tensor import Weight
    from ninfer.ops.linear import RowNorm, linear_residual_norm, norm_fold_applies

    w = Weight(np.zeros((4, 16), np.uint16), DType.BFLOAT16)
    x = np.ones((2, 16), np.float32)
    parts = np.ones((2, 3), np.float32)
    with pytest.raises(TypeError, match="linear_residual_norm is a CUDA-only op"):
        linear_residual_norm(np.zeros((2, 16), np.uint16), w, np.zeros((2, 4), np.float32),
                             np.ones(4, np.float32), np.zeros((2, 4), np.uint16), parts)
    with pytest.raises(TypeError, match="row_norm is CUDA-only"):
        ops.linear(x, w, np.zeros((2, 4), np.float32), row_norm=RowNorm(parts, 16, 1e-6))
    assert not norm_fold_applies(2, w)
