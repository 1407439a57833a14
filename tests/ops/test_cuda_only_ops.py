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
