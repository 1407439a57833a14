"""Shared helpers for the op tests: fresh random inputs, strided views, NaN-poisoned outputs."""
from __future__ import annotations

import numpy as np

from ninfer.core.dtypes import DType, f32_to_bf16_bits
from ninfer.core.tensor import Weight

# fp32 kernels against the float64 reference: ||out - ref|| / ||ref|| must stay below this.
TOL_F32 = 3e-6
DTYPES = (DType.FLOAT32, DType.BFLOAT16)


def weight(rng: np.random.Generator, shape, dtype: DType, scale: float = 1.0) -> Weight:
    """A random Weight; bf16 weights are the rounded patterns (the reference widens them)."""
    values = (rng.standard_normal(shape) * scale).astype(np.float32)
    if dtype is DType.BFLOAT16:
        return Weight(f32_to_bf16_bits(values), DType.BFLOAT16)
    return Weight(values, DType.FLOAT32)


def randn(rng: np.random.Generator, shape, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def rows_view(rng: np.random.Generator, shape, pad: int = 5, scale: float = 1.0) -> np.ndarray:
    """Random f32 data of `shape` as a view whose rows are strided (last axis padded by `pad`)."""
    parent = randn(rng, tuple(shape[:-1]) + (shape[-1] + pad,), scale)
    view = parent[..., pad // 2: pad // 2 + shape[-1]]
    return view


def poisoned(shape, dtype=np.float32) -> np.ndarray:
    """An output buffer full of NaN (or -7 for ints) so unwritten elements fail the comparison."""
    if np.dtype(dtype).kind == "f":
        return np.full(shape, np.nan, dtype)
    return np.full(shape, -7, dtype)


def rel_err(out, ref) -> float:
    out = np.asarray(out, np.float64)
    ref = np.asarray(ref, np.float64)
    if not np.all(np.isfinite(out)):
        return float("inf")
    return float(np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-300))


def assert_close(out, ref, tol: float = TOL_F32, what: str = "") -> None:
    assert np.asarray(out).shape == np.asarray(ref).shape, (np.shape(out), np.shape(ref))
    assert np.linalg.norm(np.asarray(ref, np.float64)) > 0, "reference is all zeros"
    err = rel_err(out, ref)
    assert err < tol, f"{what} rel err {err:.3e} >= {tol:.1e}"


def assert_same_bits(a, b, what: str = "") -> None:
    a = np.ascontiguousarray(a)
    b = np.ascontiguousarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), f"{what}: results differ bitwise"
