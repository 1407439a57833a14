"""Operand checks shared by the launchers (shapes, dtypes, strides, device), and struct packing.

Launchers call these before every launch; each raises `InvalidInput` naming the operand. CuPy
is imported lazily so that importing a launcher module never needs CuPy (the offline nvcc test
imports them on machines without a GPU).
"""
from __future__ import annotations

import enum
import struct as _struct

import numpy as np

from ninfer.errors import InvalidInput


def cupy():
    import cupy as _cp

    return _cp


class WKind(enum.Enum):
    """Element type of a weight as the kernels see it (template argument spelling)."""

    F32 = "float"
    BF16 = "unsigned short"

    @property
    def ctype(self) -> str:
        return self.value

    @property
    def itemsize(self) -> int:
        return 4 if self is WKind.F32 else 2


def fail(name: str, message: str):
    raise InvalidInput(f"{name}: {message}", param=name)


def device_array(x, name: str, *, dtype=None, ndim=None, shape=None, device_id=None):
    """`x` as a CuPy array on the current device with the given dtype/ndim/shape.

    `shape` entries may be None (any size). Returns `x` unchanged.
    """
    cp = cupy()
    if not isinstance(x, cp.ndarray):
        fail(name, f"expected a CuPy array, got {type(x).__name__}")
    if device_id is None:
        device_id = cp.cuda.runtime.getDevice()
    if x.data.device_id != device_id:
        fail(name, f"lives on device {x.data.device_id}, the executing device is {device_id}")
    if dtype is not None and x.dtype != np.dtype(dtype):
        fail(name, f"dtype {x.dtype}, expected {np.dtype(dtype)}")
    if ndim is not None and x.ndim not in ((ndim,) if isinstance(ndim, int) else ndim):
        fail(name, f"has {x.ndim} dims, expected {ndim}")
    if shape is not None:
        if x.ndim != len(shape) or any(s is not None and s != d for s, d in zip(shape, x.shape)):
            want = tuple("*" if s is None else s for s in shape)
            fail(name, f"shape {tuple(x.shape)}, expected {want}")
    return x


def weight_array(w, name: str):
    """(storage, WKind) of a weight: a `Weight`, or a CuPy float32 / uint16 / bfloat16 array.

    bf16 storage is returned as a uint16 view (the kernels widen the raw patterns).
    """
    cp = cupy()
    data = getattr(w, "data", w) if not isinstance(w, cp.ndarray) else w
    device_array(data, name)
    if data.dtype == np.float32:
        return data, WKind.F32
    if data.dtype == np.uint16:
        return data, WKind.BF16
    if data.dtype.name == "bfloat16":
        return data.view(np.uint16), WKind.BF16
    fail(name, f"weight dtype {data.dtype} is not float32 or bf16 (uint16/bfloat16 storage)")


def kv_array(x, name: str):
    """(array, WKind) of a KV page array: float32, or bf16 as uint16/bfloat16 storage."""
    if x.dtype == np.float32:
        return x, WKind.F32
    if x.dtype == np.uint16:
        return x, WKind.BF16
    if x.dtype.name == "bfloat16":
        return x.view(np.uint16), WKind.BF16
    fail(name, f"dtype {x.dtype} is not float32 or bf16")


def estrides(x) -> tuple[int, ...]:
    """Strides of `x` in elements (they must be whole elements)."""
    item = x.itemsize
    out = []
    for s in x.strides:
        if s % item:
            raise InvalidInput(f"stride {s} bytes is not a multiple of the item size {item}")
        out.append(s // item)
    return tuple(out)


def inner_contiguous(x, name: str, axes: int = 1) -> tuple[int, ...]:
    """Check that the last `axes` axes are C-contiguous; return the element strides."""
    st = estrides(x)
    expect = 1
    for axis in range(x.ndim - 1, x.ndim - 1 - axes, -1):
        if x.shape[axis] > 1 and st[axis] != expect:
            fail(name, f"axes {x.ndim - axes}.. must be contiguous (strides {x.strides})")
        expect *= x.shape[axis]
    return st


def row_stride(x, name: str) -> int:
    """Row stride (elements) of a 2-D array whose last axis is contiguous."""
    st = inner_contiguous(x, name, 1)
    return st[0] if x.shape[0] > 1 else max(st[0], x.shape[1])


def require(cond: bool, name: str, message: str) -> None:
    if not cond:
        fail(name, message)


def aligned(x, nbytes: int = 16) -> bool:
    return x.data.ptr % nbytes == 0


def ptr(x) -> int:
    return int(x.data.ptr)


_STRUCT_CODES = {np.dtype(np.uint64): "Q", np.dtype(np.int32): "i", np.dtype(np.int64): "q",
                 np.dtype(np.float32): "f"}
_PACKERS: dict[np.dtype, tuple] = {}


def _packer(dtype: np.dtype) -> tuple:
    """(struct.Struct, field names, their set, conversions, opaque dtype) of a `struct()` dtype
    (cached)."""
    found = _PACKERS.get(dtype)
    if found is not None:
        return found
    fmt, at, names, convert = "=", 0, [], []
    for name, (field, offset) in sorted(dtype.fields.items(), key=lambda kv: kv[1][1]):
        fmt += "x" * (offset - at) + _STRUCT_CODES[field]
        at = offset + field.itemsize
        names.append(name)
        code = _STRUCT_CODES[field]
        convert.append(float if code == "f" else
                       (lambda v: int(v) & 0xFFFFFFFFFFFFFFFF) if code == "Q" else int)
    fmt += "x" * (dtype.itemsize - at)
    found = (_struct.Struct(fmt), tuple(names), frozenset(names), tuple(convert),
             np.dtype((np.void, dtype.itemsize)))
    _PACKERS[dtype] = found
    return found


def pack(dtype: np.dtype, **fields) -> np.ndarray:
    """A size-1 array holding the bytes of a kernel params struct (CuPy passes it by value).

    The bytes of a zeroed `dtype` record with `fields` assigned (unnamed fields are 0) for
    in-range values, built with `struct` into an opaque void dtype: a structured array costs
    tens of microseconds per launch in NumPy's field handling and CuPy's `__array_interface__`.
    Out of range, struct is stricter than NumPy (an f32 beyond the float range raises instead of
    becoming inf); non-integral numbers for integer fields are truncated and negative pointers
    wrap.
    """
    packer, names, known, convert, opaque = _packer(dtype)
    if not fields.keys() <= known:
        raise ValueError(f"no field(s) {sorted(fields.keys() - known)} in the params struct")
    get = fields.get
    values = [get(name, 0) for name in names]
    try:
        raw = packer.pack(*values)
    except _struct.error:  # floats for integer fields truncated, negative pointers wrapped
        raw = packer.pack(*[conv(v) for conv, v in zip(convert, values)])
    return np.frombuffer(raw, dtype=opaque)


def struct(*fields: tuple[str, str]) -> np.dtype:
    """A C-layout (aligned) struct dtype; field types: "ptr", "i32", "i64", "f32", "u64"."""
    kinds = {"ptr": np.uint64, "i32": np.int32, "i64": np.int64, "f32": np.float32,
             "u64": np.uint64}
    return np.dtype([(n, kinds[k]) for n, k in fields], align=True)


def contiguous(x, name: str):
    """Require a C-contiguous array; return it."""
    if not x.flags.c_contiguous:
        fail(name, f"must be contiguous (strides {x.strides})")
    return x


def is_bf16_bits(a) -> bool:
    """Whether an activation operand holds bf16 bits (uint16) rather than f32."""
    return getattr(a, "dtype", None) == np.uint16


def per_head(x, name: str, n=None, heads=None, dim=None, dtype=np.float32) -> tuple[int, int]:
    """(row, head) element strides of a `dtype` (default f32) [N, heads, dim] operand with a
    contiguous last axis (None extents match anything)."""
    device_array(x, name, dtype=dtype, ndim=3, shape=(n, heads, dim))
    st = inner_contiguous(x, name, 1)
    return st[0], st[1]


def kv_pages(k_pages, v_pages):
    """(k storage, v storage, WKind) of a layer's contiguous KV page arrays [P, Hkv, page, D]
    (same shape and element type)."""
    device_array(k_pages, "k_pages", ndim=4)
    device_array(v_pages, "v_pages", ndim=4, shape=k_pages.shape)
    kp, kind = kv_array(k_pages, "k_pages")
    vp, vkind = kv_array(v_pages, "v_pages")
    require(kind is vkind, "v_pages", "k_pages and v_pages must have the same dtype")
    contiguous(kp, "k_pages")
    contiguous(vp, "v_pages")
    return kp, vp, kind


def row_targets(block_tables, row_seq, row_pos, n: int) -> int:
    """Check the per-row KV targets (row_seq, row_pos i32[n], block_tables i32[S, cols]) and
    return the block table's row stride."""
    contiguous(device_array(row_seq, "row_seq", dtype=np.int32, shape=(n,)), "row_seq")
    contiguous(device_array(row_pos, "row_pos", dtype=np.int32, shape=(n,)), "row_pos")
    device_array(block_tables, "block_tables", dtype=np.int32, ndim=2)
    return row_stride(block_tables, "block_tables")


def norm_fold_operands(residual, gain, out, parts, n: int, m: int, columns: int,
                       out_name: str = "out") -> None:
    """The norm fold producer's operands (linear.linear_residual_norm, moe.moe_block's
    norm_fold): residual f32 [n, m] rows strided, gain f32 [m] contiguous, out bf16 bits [n, m]
    rows strided, parts f32 [n, >= columns] rows strided."""
    device_array(residual, "residual", dtype=np.float32, ndim=2, shape=(n, m))
    contiguous(device_array(gain, "gain", dtype=np.float32, ndim=1, shape=(m,)), "gain")
    device_array(out, out_name, dtype=np.uint16, ndim=2, shape=(n, m))
    device_array(parts, "parts", dtype=np.float32, ndim=2)
    require(parts.shape[0] == n and parts.shape[1] >= columns, "parts",
            f"shape {parts.shape}, expected [{n}, >= {columns}]")
