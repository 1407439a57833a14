"""Operand checks shared by the op entry points, and the lazy kernel-module lookup.

Checks raise TypeError (wrong type or dtype) or ValueError (shape, layout) naming the op and
operand. They read only metadata (dtype, shape, strides), never array contents, so they cost the
same on both backends and never synchronise a GPU.
"""
from __future__ import annotations

import enum
import importlib
from types import ModuleType
from typing import Sequence

import numpy as np

from ninfer.core.dtypes import DType
from ninfer.core.tensor import Weight
from ninfer.ops._backend import Backend

F32 = np.dtype(np.float32)
BF16_BITS = np.dtype(np.uint16)  # bf16 activations as raw patterns (CUDA operands of bf16 GEMMs)
I32 = np.dtype(np.int32)
I64 = np.dtype(np.int64)
U64 = np.dtype(np.uint64)

WEIGHT_DTYPES = frozenset({DType.FLOAT32, DType.BFLOAT16})
"""Storage dtypes every weight-reading kernel accepts (bf16 is widened in the kernel)."""


class Layout(enum.Enum):
    CONTIGUOUS = "C-contiguous"
    ROWS = "last axis contiguous (other axes may be strided)"
    SLOTS = "C-contiguous after the first (slot) axis"


def array(op: str, name: str, a, dtype: np.dtype, shape: Sequence[int | None],
          layout: Layout = Layout.CONTIGUOUS) -> tuple[int, ...]:
    """Check one array operand; `None` in `shape` matches any extent. Returns a.shape."""
    if not hasattr(a, "strides") or isinstance(a, Weight):
        raise TypeError(f"{op}: {name} must be an array, got {type(a).__name__}")
    if a.dtype != dtype:
        raise TypeError(f"{op}: {name} must be {dtype}, got {a.dtype}")
    _shape(op, name, tuple(a.shape), shape)
    _layout(op, name, a, layout)
    return tuple(a.shape)


def f32_or_bf16(op: str, name: str, a, backend: Backend, shape: Sequence[int | None],
                layout: Layout = Layout.CONTIGUOUS) -> tuple[int, ...]:
    """Check an activation that is f32 (with `layout`), or on CUDA bf16 bits (uint16,
    C-contiguous): the f32 values rounded to nearest even, as the cuBLAS GEMMs read them."""
    if getattr(a, "dtype", None) == BF16_BITS:
        if backend is not Backend.CUDA:
            raise TypeError(f"{op}: a bf16 (uint16) {name} is CUDA-only; the CPU backend "
                            "computes in f32")
        return array(op, name, a, BF16_BITS, shape)
    return array(op, name, a, F32, shape, layout)


def weight(op: str, name: str, w, shape: Sequence[int | None]) -> tuple[int, ...]:
    """Check a Weight operand: supported dtype, C-contiguous storage, shape."""
    if not isinstance(w, Weight):
        raise TypeError(f"{op}: {name} must be a Weight, got {type(w).__name__}")
    if w.dtype not in WEIGHT_DTYPES:
        raise TypeError(f"{op}: {name} dtype {w.dtype.value} is not supported "
                        f"(supported: {', '.join(sorted(d.value for d in WEIGHT_DTYPES))})")
    _shape(op, name, w.shape, shape)
    _layout(op, name, w.data, Layout.CONTIGUOUS)
    return w.shape


def one_of_ndim(op: str, name: str, a, ndims: tuple[int, ...]) -> int:
    ndim = getattr(a, "ndim", None)
    if ndim not in ndims:
        raise ValueError(f"{op}: {name} must have {' or '.join(map(str, ndims))} dims, got {ndim}")
    return ndim


def scalar(op: str, name: str, value, *, minimum: float | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{op}: {name} must be a number, got {type(value).__name__}")
    if not np.isfinite(value) or (minimum is not None and value < minimum):
        raise ValueError(f"{op}: {name} must be finite and >= {minimum}, got {value}")


def _shape(op: str, name: str, got: tuple[int, ...], want: Sequence[int | None]) -> None:
    if len(got) != len(want) or any(w is not None and g != w for g, w in zip(got, want)):
        spec = "[" + ", ".join("*" if w is None else str(w) for w in want) + "]"
        raise ValueError(f"{op}: {name} must have shape {spec}, got {list(got)}")


def _layout(op: str, name: str, a, layout: Layout) -> None:
    item = a.dtype.itemsize
    if layout is Layout.CONTIGUOUS:
        ok = bool(a.flags.c_contiguous)
    else:
        # Extents of 1 never move the index, so their strides are irrelevant.
        strides = [s for s, n in zip(a.strides, a.shape) if n > 1]
        ok = all(s > 0 and s % item == 0 for s in strides)
        if ok and a.ndim and a.shape[-1] > 1:
            ok = a.strides[-1] == item
        if ok and layout is Layout.SLOTS and a.ndim > 1:
            expect = item
            for n, s in reversed(list(zip(a.shape[1:], a.strides[1:]))):
                if n > 1 and s != expect:
                    ok = False
                expect *= n
    if not ok:
        raise ValueError(f"{op}: {name} must be {layout.value}, got strides {a.strides} "
                         f"for shape {list(a.shape)}")


_KERNEL_PACKAGES = {Backend.CPU: "ninfer.kernels_numba_cpu", Backend.CUDA: "ninfer.kernels_cuda"}
_modules: dict[tuple[Backend, str], ModuleType] = {}


def scratch(backend: Backend, **buffers) -> dict:
    """Keyword arguments passing preallocated scratch (and CUDA-only switches such as
    `batch_invariant`; the CPU kernels always are) to a CUDA kernel, dropped on the CPU and when
    None. Graph capture needs them: CUDA launchers allocate
    their scratch when none is given, and allocation cannot be captured."""
    if backend is not Backend.CUDA:
        return {}
    return {k: v for k, v in buffers.items() if v is not None}


def kernels(backend: Backend, module: str) -> ModuleType:
    """The kernel module `module` of `backend`, imported on first use (import compiles nothing)."""
    key = (backend, module)
    found = _modules.get(key)
    if found is None:
        found = importlib.import_module(f"{_KERNEL_PACKAGES[backend]}.{module}")
        _modules[key] = found
    return found
