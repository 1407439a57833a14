"""Elementwise ops: `sigmoid_mul`, `swiglu`, `sigmoid_scale_add`, `add_inplace` (docs/ops.md).

On CUDA `sigmoid_mul` and `swiglu` may write `out` as bf16 bits (uint16, C-contiguous, not
overlapping any input): the f32 result rounded to nearest even, the operand a following cuBLAS
linear reads.
"""
from __future__ import annotations

from ninfer.ops import _checks as check
from ninfer.ops._backend import backend_of

_ROWS = check.Layout.ROWS


def sigmoid_mul(x, gate, out) -> None:
    """out = x * sigmoid(gate). x, out: f32[N, M] or f32[N, heads, D], C-contiguous (out may be x;
    or bf16 bits on CUDA); gate: same shape, rows/heads strided (e.g. the gate half of the
    interleaved q projection)."""
    backend = backend_of(x, gate, out)
    check.one_of_ndim("sigmoid_mul", "x", x, (2, 3))
    shape = check.array("sigmoid_mul", "x", x, check.F32, (None,) * x.ndim)
    check.array("sigmoid_mul", "gate", gate, check.F32, shape, _ROWS)
    check.f32_or_bf16("sigmoid_mul", "out", out, backend, shape)
    check.kernels(backend, "elementwise").sigmoid_mul(x, gate, out)


def swiglu(gate_up, out) -> None:
    """out = silu(gate_up[:, :I]) * gate_up[:, I:]. gate_up: f32[N, 2I]; out: f32[N, I] (or bf16
    bits on CUDA)."""
    backend = backend_of(gate_up, out)
    n, two_i = check.array("swiglu", "gate_up", gate_up, check.F32, (None, None))
    if two_i % 2:
        raise ValueError(f"swiglu: gate_up width {two_i} is odd")
    check.f32_or_bf16("swiglu", "out", out, backend, (n, two_i // 2))
    check.kernels(backend, "elementwise").swiglu(gate_up, out)


def sigmoid_scale_add(acc, y, gate) -> None:
    """acc += sigmoid(gate) * y. acc, y: f32[N, H]; gate: f32[N, 1] rows strided."""
    backend = backend_of(acc, y, gate)
    n, h = check.array("sigmoid_scale_add", "acc", acc, check.F32, (None, None))
    check.array("sigmoid_scale_add", "y", y, check.F32, (n, h))
    check.array("sigmoid_scale_add", "gate", gate, check.F32, (n, 1), _ROWS)
    check.kernels(backend, "elementwise").sigmoid_scale_add(acc, y, gate)


def add_inplace(acc, x) -> None:
    """acc += x. Both f32[N, H] C-contiguous."""
    backend = backend_of(acc, x)
    shape = check.array("add_inplace", "acc", acc, check.F32, (None, None))
    check.array("add_inplace", "x", x, check.F32, shape)
    check.kernels(backend, "elementwise").add_inplace(acc, x)
