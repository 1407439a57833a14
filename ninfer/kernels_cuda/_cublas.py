"""cuBLAS GEMMs for the prefill paths, called through ctypes on the library CuPy loaded.

Why not CuPy's wrappers: they refuse to run while the current stream is capturing (so a prompt
chunk's GEMMs could not go into a CUDA graph), and CuPy leaves its handle on the legacy default
stream, which does not order against our non-blocking stream. Here every call first binds the
handle (CuPy's per-thread, per-device one) to the current stream and to a fixed workspace, so
cuBLAS neither races our kernels nor allocates inside a capture.

All matrices are column-major in cuBLAS terms; pointers are device addresses (ints); alpha = 1,
beta = 0; fp32 accumulation.
"""
from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from ninfer.kernels_cuda import _checks as C

# cublas_api.h / library_types.h
OP_N, OP_T = 0, 1
R_32F, R_16BF = 0, 14
COMPUTE_32F = 68
GEMM_DEFAULT = -1
WORKSPACE_BYTES = 32 << 20

_c_int, _c_ll, _ptr = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p
_ONE = np.ones(1, np.float32)
_ZERO = np.zeros(1, np.float32)
_lock = threading.Lock()
_lib = None
# (handle, stream) -> its workspace: a captured GEMM keeps using the workspace it was captured
# with, so two streams (two model instances driven from one thread) must not share one
_workspaces: dict[tuple[int, int], object] = {}


def _library():
    """The cuBLAS shared library CuPy already loaded. RTLD_NOLOAD: only a library that is
    already in the process qualifies, never a second cuBLAS of another CUDA version from the
    loader path (the caller has made CuPy's handle first, which loads CuPy's cuBLAS)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            for name in ("libcublas.so.13", "libcublas.so.12", "libcublas.so.11"):
                try:
                    lib = ctypes.CDLL(name, mode=os.RTLD_NOLOAD)
                    break
                except OSError:
                    continue
            else:
                raise RuntimeError("cuBLAS is not loaded in this process (CuPy's cuBLAS handle "
                                   "should have loaded it): cannot call it through ctypes")
            lib.cublasSetStream_v2.argtypes = [_ptr, _ptr]
            lib.cublasSetWorkspace_v2.argtypes = [_ptr, _ptr, ctypes.c_size_t]
            lib.cublasGemmEx.argtypes = [
                _ptr, _c_int, _c_int, _c_int, _c_int, _c_int, _ptr, _ptr, _c_int, _c_int, _ptr,
                _c_int, _c_int, _ptr, _ptr, _c_int, _c_int, _c_int, _c_int]
            lib.cublasGemmStridedBatchedEx.argtypes = [
                _ptr, _c_int, _c_int, _c_int, _c_int, _c_int, _ptr, _ptr, _c_int, _c_int, _c_ll,
                _ptr, _c_int, _c_int, _c_ll, _ptr, _ptr, _c_int, _c_int, _c_ll, _c_int, _c_int,
                _c_int]
            _lib = lib
    return _lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with cuBLAS status {status}")


def bound_handle() -> int:
    """CuPy's cuBLAS handle for this thread and device, bound to the current stream and a fixed
    workspace (allocated on a handle's first use, which must not be inside a capture)."""
    cp = C.cupy()
    handle = cp.cuda.device.get_cublas_handle()
    lib = _library()
    stream = cp.cuda.get_current_stream()
    _check(lib.cublasSetStream_v2(handle, stream.ptr), "cublasSetStream")
    ws = _workspaces.get((handle, stream.ptr))
    if ws is None:
        if stream.is_capturing():
            raise RuntimeError("the first cuBLAS call on a stream must not be inside a graph "
                               "capture (its workspace would be allocated there)")
        ws = _workspaces[(handle, stream.ptr)] = cp.empty(WORKSPACE_BYTES, np.uint8)
    # binding a stream resets the workspace: set it after every bind
    _check(lib.cublasSetWorkspace_v2(handle, ws.data.ptr, ws.nbytes), "cublasSetWorkspace")
    return handle


def gemm_ex(transa: int, transb: int, m: int, n: int, k: int, a: int, a_type: int, lda: int,
            b: int, b_type: int, ldb: int, c: int, ldc: int) -> None:
    """C[m, n] (fp32) = op(A) @ op(B) on the current stream."""
    handle = bound_handle()
    _check(_lib.cublasGemmEx(handle, transa, transb, m, n, k, _ONE.ctypes.data, a, a_type, lda,
                             b, b_type, ldb, _ZERO.ctypes.data, c, R_32F, ldc, COMPUTE_32F,
                             GEMM_DEFAULT), "cublasGemmEx")


def gemm_strided_batched_ex(transa: int, transb: int, m: int, n: int, k: int, a: int,
                            a_type: int, lda: int, stride_a: int, b: int, b_type: int, ldb: int,
                            stride_b: int, c: int, ldc: int, stride_c: int, batch: int) -> None:
    """`batch` GEMMs C_i[m, n] (fp32) = op(A_i) @ op(B_i) at fixed strides, current stream."""
    handle = bound_handle()
    _check(_lib.cublasGemmStridedBatchedEx(
        handle, transa, transb, m, n, k, _ONE.ctypes.data, a, a_type, lda, stride_a, b, b_type,
        ldb, stride_b, _ZERO.ctypes.data, c, R_32F, ldc, stride_c, batch, COMPUTE_32F,
        GEMM_DEFAULT), "cublasGemmStridedBatchedEx")
