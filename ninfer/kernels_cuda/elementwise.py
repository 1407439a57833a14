"""Launchers for elementwise.cu: sigmoid_mul, swiglu, sigmoid_scale_add, add_inplace.

Contracts: docs/ops.md. All operands are f32 CuPy arrays on the executing device, 2-D with a
contiguous last axis (rows may be strided), except that `sigmoid_mul` and `swiglu` may write
uint16 bf16 bits: the f32 result rounded to nearest even, bit for bit what `linear.to_bf16` makes
of the f32 output (the operand of a cuBLAS bf16 GEMM). Launch on CuPy's current stream, with
programmatic dependent launch allowed (`_loader.launch(..., pdl=True)`); no allocation.
"""
from __future__ import annotations

import numpy as np

from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda._loader import KernelSource, get_function, launch

_OPS = ("SigmoidMul", "SiluMul", "SigmoidScaleAdd", "Add")
_BF16_OUT_OPS = ("SigmoidMul", "SiluMul")
_OUT_TYPES = {np.dtype(np.float32): "float", np.dtype(np.uint16): "unsigned short"}
_VECS = (1, 4)
SOURCE = KernelSource("elementwise.cu", tuple(
    [f"ew_kernel<{op}, float, {vec}>" for op in _OPS for vec in _VECS]
    + [f"ew_kernel<{op}, unsigned short, {vec}>" for op in _BF16_OUT_OPS for vec in _VECS]))
_PARAMS = C.struct(("a", "ptr"), ("b", "ptr"), ("c", "ptr"), ("out", "ptr"), ("a_rs", "i64"),
                   ("b_rs", "i64"), ("c_rs", "i64"), ("out_rs", "i64"), ("c_cs", "i64"),
                   ("m", "i32"), ("pad", "i32"))
assert _PARAMS.itemsize == 80
_THREADS = 256


def _matrix(x, name, n=None, m=None, dtype=np.float32):
    C.device_array(x, name, dtype=dtype, ndim=2, shape=(n, m))
    return C.row_stride(x, name)


def _out_dtype(out):
    """float32, or uint16 (bf16 bits) for the ops that may write the operand of a bf16 GEMM."""
    C.require(getattr(out, "dtype", None) in _OUT_TYPES, "out",
              f"dtype {getattr(out, 'dtype', None)}, expected float32 or uint16 (bf16 bits)")
    return out.dtype


def _vec(m: int, a, a_rs: int, b, b_rs: int, out, out_rs: int) -> int:
    """4 when every row of a, b and out can be read / written 4 elements at a time, else 1."""
    ok = (m % 4 == 0 and a_rs % 4 == 0 and b_rs % 4 == 0 and out_rs % 4 == 0
          and C.aligned(a) and C.aligned(b) and C.aligned(out, 4 * out.itemsize))
    return 4 if ok else 1


def _run(op: str, a, b, out, c=None, c_rs=0, c_cs=0) -> None:
    n, m = out.shape
    if n == 0 or m == 0:
        return
    a_rs, b_rs, out_rs = C.row_stride(a, "a"), C.row_stride(b, "b"), C.row_stride(out, "out")
    params = C.pack(_PARAMS, a=C.ptr(a), b=C.ptr(b), c=C.ptr(c) if c is not None else 0,
                    out=C.ptr(out), a_rs=a_rs, b_rs=b_rs, c_rs=c_rs, out_rs=out_rs, c_cs=c_cs,
                    m=m)
    vec = _vec(m, a, a_rs, b, b_rs, out, out_rs)
    fn = get_function(SOURCE, f"ew_kernel<{op}, {_OUT_TYPES[out.dtype]}, {vec}>")
    per_block = _THREADS * vec
    launch(fn, (n, (m + per_block - 1) // per_block), (_THREADS,), (params,), name=op,
           pdl=True)


def sigmoid_mul(x, gate, out) -> None:
    """out = x * sigmoid(gate); x f32[N,M]; gate f32[N,M] rows strided; out f32[N,M] (may be
    x) or bf16 bits [N,M] (must not overlap x or gate)."""
    n, m = x.shape if x.ndim == 2 else (None, None)
    _matrix(x, "x")
    _matrix(gate, "gate", n, m)
    _matrix(out, "out", n, m, _out_dtype(out))
    _run("SigmoidMul", x, gate, out)


def swiglu(gate_up, out) -> None:
    """out = silu(gate_up[:, :I]) * gate_up[:, I:]; gate_up f32[N,2I], out f32 or bf16 bits
    [N,I]."""
    _matrix(gate_up, "gate_up")
    n, two_i = gate_up.shape
    C.require(two_i % 2 == 0, "gate_up", f"width {two_i} is not even")
    _matrix(out, "out", n, two_i // 2, _out_dtype(out))
    half = two_i // 2
    _run("SiluMul", gate_up[:, :half], gate_up[:, half:], out)


def sigmoid_scale_add(acc, y, gate) -> None:
    """acc += sigmoid(gate) * y; acc, y f32[N,H]; gate f32[N,1] (rows strided)."""
    _matrix(acc, "acc")
    n, h = acc.shape
    _matrix(y, "y", n, h)
    C.device_array(gate, "gate", dtype=np.float32, ndim=2, shape=(n, 1))
    g_rs = C.estrides(gate)[0] if n > 1 else 1
    _run("SigmoidScaleAdd", acc, y, acc, c=gate, c_rs=g_rs, c_cs=0)


def add_inplace(acc, x) -> None:
    """acc += x; both f32[N,H] (rows may be strided)."""
    _matrix(acc, "acc")
    _matrix(x, "x", *acc.shape)
    _run("Add", acc, x, acc)
