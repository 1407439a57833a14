"""Binding of fused parameter groups: MoE's router and shared-expert gate as one [E + 1, H]
weight, exact when the two are stored in different dtypes (widened to float32)."""
from __future__ import annotations

import types

import numpy as np
import pytest

from ninfer.artifact.header import Binding, Use
from ninfer.core.dtypes import DType, bf16_bits_to_f32, f32_to_bf16_bits
from ninfer.core.tensor import Weight
from ninfer.errors import ArtifactError
from ninfer.models.qwen3_5.parameters import _Binder


def _fake_artifact(weights: dict[str, Weight]):
    """The parts of an Artifact that _Binder reads, each logical name its own object."""
    return types.SimpleNamespace(
        binding=lambda name: Binding(name, name, Use.TEXT),
        objects={n: types.SimpleNamespace(dtype=w.dtype) for n, w in weights.items()},
        object_array=lambda name: weights[name].data,
        weight=lambda name: weights[name])


def test_fused_members_of_one_dtype_are_concatenated():
    rng = np.random.default_rng(0)
    a = Weight(f32_to_bf16_bits(rng.standard_normal((4, 6)).astype(np.float32)), DType.BFLOAT16)
    b = Weight(f32_to_bf16_bits(rng.standard_normal((1, 6)).astype(np.float32)), DType.BFLOAT16)
    fused = _Binder(_fake_artifact({"a": a, "b": b}), place=lambda x: x).fused(["a", "b"])
    assert fused.dtype is DType.BFLOAT16 and fused.shape == (5, 6)
    assert np.array_equal(fused.data, np.concatenate([a.data, b.data]))


def test_fused_members_of_mixed_dtypes_widen_exactly():
    rng = np.random.default_rng(1)
    a = Weight(rng.standard_normal((4, 6)).astype(np.float32), DType.FLOAT32)
    b_bits = f32_to_bf16_bits(rng.standard_normal((1, 6)).astype(np.float32))
    artifact = _fake_artifact({"a": a, "b": Weight(b_bits, DType.BFLOAT16)})
    with pytest.raises(ArtifactError, match="mix dtypes"):
        _Binder(artifact, place=lambda x: x).fused(["a", "b"])
    fused = _Binder(artifact, place=lambda x: x).fused(["a", "b"], widen=True)
    assert fused.dtype is DType.FLOAT32 and fused.shape == (5, 6)
    assert np.array_equal(fused.data[:4], a.data)
    assert np.array_equal(fused.data[4:], bf16_bits_to_f32(b_bits))
