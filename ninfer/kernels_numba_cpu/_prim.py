"""Scalar primitives shared by the Numba kernels: bf16 widen/narrow, sigmoid, silu, softplus.

`widen(v)` turns one stored element into float32: a uint16 bf16 pattern is shifted into the high
half of a float32 (exact), a float32 passes through. Kernels are written once against `widen` and
Numba specialises them per storage dtype, so no fp32 copy of a bf16 weight is ever made.
All arithmetic here is float32 (constants are typed np.float32 so nothing promotes to float64).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic, overload

F0 = np.float32(0.0)
F1 = np.float32(1.0)
SOFTPLUS_THRESHOLD = np.float32(20.0)


@intrinsic
def widen(typingctx, v):
    """float32 value of one stored element (uint16 = bf16 bits, or float32)."""
    if v == types.uint16:
        def codegen(context, builder, signature, args):
            bits = builder.zext(args[0], ir.IntType(32))
            bits = builder.shl(bits, ir.Constant(ir.IntType(32), 16))
            return builder.bitcast(bits, ir.FloatType())
        return types.float32(v), codegen
    if v == types.float32:
        def codegen(context, builder, signature, args):
            return args[0]
        return types.float32(v), codegen
    return None


@intrinsic
def f32_bits(typingctx, v):
    """The IEEE bit pattern of a float32 as uint32."""
    if v == types.float32:
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.IntType(32))
        return types.uint32(v), codegen
    return None


@njit(inline="always")
def bf16_bits(v):
    """Round a float32 to bf16 (nearest even) and return the uint16 pattern; NaN stays quiet NaN."""
    bits = f32_bits(v)
    if v != v:
        return np.uint16((bits >> np.uint32(16)) | np.uint32(0x0040))
    rounding = ((bits >> np.uint32(16)) & np.uint32(1)) + np.uint32(0x7FFF)
    return np.uint16((bits + rounding) >> np.uint32(16))


@njit(inline="always")
def sigmoid(v):
    return F1 / (F1 + np.exp(-v))


@njit(inline="always")
def silu(v):
    return v * (F1 / (F1 + np.exp(-v)))


@njit(inline="always")
def softplus(v):
    """PyTorch's softplus (beta 1, threshold 20): linear above 20."""
    if v > SOFTPLUS_THRESHOLD:
        return v
    return np.float32(np.log1p(np.exp(v)))


def store(arr, index, value):
    """arr[index] = value converted to arr's storage (float32, or uint16 bf16 bits)."""
    raise NotImplementedError("only callable from Numba-compiled code")


@overload(store)
def _store_overload(arr, index, value):
    if arr.dtype == types.uint16:
        def impl(arr, index, value):
            arr[index] = bf16_bits(value)
        return impl
    if arr.dtype == types.float32:
        def impl(arr, index, value):
            arr[index] = value
        return impl
    return None
