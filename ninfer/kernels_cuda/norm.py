"""Launchers for norm.cu: rms_norm, add_rms_norm, gated_rms_norm, l2norm_heads (docs/ops.md).

Inputs are f32 CuPy arrays, 2-D `[N, D]` or 3-D `[N, heads, D]` with a contiguous last axis and
arbitrary row/head strides; the norm runs over the last axis. Weights are f32 or bf16. `out` is
f32, or (every mode but L2) uint16 holding bf16 bits: the f32 result rounded to nearest even,
bit for bit what `linear.to_bf16` makes of the f32 output (the operand of a cuBLAS bf16 GEMM).
Every launch allows programmatic dependent launch (`_loader.launch(..., pdl=True)`).
"""
from __future__ import annotations

import numpy as np

from ninfer import envs
from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda._loader import KernelSource, get_function, launch

RMS, RMS_ZC, GATED, L2, ADD_RMS_ZC = range(5)
_NV = (0, 1, 2, 4, 8, 16)
WARP_ROWS = 4  # rows per block when one warp holds a row (RB)
MAX_WARP_VALUES = 8  # values per lane of a warp-held row: (T / 32) * NV
# every (NV, T, RB) that `launch_shape` returns for some D >= 1 and some NINFER_NORM_MAX_NV
_SHAPES = ((1, 32, 4), (1, 64, 4), (1, 128, 4), (1, 256, 4), (2, 256, 1), (4, 256, 1),
           (8, 256, 1), (16, 256, 1), (4, 512, 1), (8, 512, 1), (8, 640, 1), (4, 1024, 1),
           (8, 1024, 1), (0, 1024, 1))
MAX_NV = envs.norm_max_nv()  # NINFER_NORM_MAX_NV: elements per thread at most for D <= 4096
_OUT_TYPES = {np.dtype(np.float32): "float", np.dtype(np.uint16): "unsigned short"}
_BF16_OUT_MODES = (RMS, RMS_ZC, GATED, ADD_RMS_ZC)
SOURCE = KernelSource("norm.cu", tuple(
    f"norm_kernel<{k.ctype}, {ot}, {mode}, {nv}, {t}, {rb}>" for k in C.WKind
    for ot in _OUT_TYPES.values() for mode in range(5) for nv, t, rb in _SHAPES
    if ot == "float" or mode in _BF16_OUT_MODES))
# one block per row for the shapes that run one warp per row (tests: both layouts, same bits)
REFERENCE_SOURCE = KernelSource("norm.cu", tuple(
    f"norm_kernel<{k.ctype}, float, {mode}, {nv}, {t}, 1>" for k in C.WKind for mode in range(5)
    for nv, t, rb in _SHAPES if rb > 1))
_PARAMS = C.struct(("x", "ptr"), ("z", "ptr"), ("residual", "ptr"), ("w", "ptr"), ("out", "ptr"),
                   ("x_rs", "i64"), ("x_hs", "i64"), ("z_rs", "i64"), ("z_hs", "i64"),
                   ("r_rs", "i64"), ("out_rs", "i64"), ("out_hs", "i64"), ("heads", "i32"),
                   ("dim", "i32"), ("eps", "f32"), ("scale", "f32"), ("rows", "i64"))
assert _PARAMS.itemsize == 120


def block_threads(dim: int, max_nv: int = MAX_NV) -> int:
    """Threads per row: a function of D (and NINFER_NORM_MAX_NV) only (batch invariance),
    32..1024."""
    t = 32
    while t < dim and t < 256:
        t *= 2
    if dim > 4096:  # 640 x 8 for 27B's 5120 (16: the former 1024 for every D > 4096)
        return 640 if dim <= 640 * 8 and max_nv <= 8 else 1024
    while t < 1024 and -(-dim // t) > max_nv:
        t *= 2
    return t


def elements_per_thread(dim: int, max_nv: int = MAX_NV) -> int:
    """NV template argument: register-held elements per thread (0 = strided loop); 16 only with
    <= 256 threads (the kernel's register budget)."""
    threads = block_threads(dim, max_nv)
    need = -(-dim // threads)
    nv = next((nv for nv in _NV[1:] if nv >= need), 0)
    return 0 if nv == 16 and threads > 256 else nv


def launch_shape(dim: int, max_nv: int = MAX_NV) -> tuple[int, int, int]:
    """(NV, T, RB) of norm_kernel for rows of D = dim: NV elements per thread of the T-thread
    reduction order (functions of D and max_nv only), RB = rows per block (1: a block per row;
    WARP_ROWS: a warp per row, when a lane can hold the (T / 32) * NV values)."""
    nv, threads = elements_per_thread(dim, max_nv), block_threads(dim, max_nv)
    warp = nv > 0 and (threads // 32) * nv <= MAX_WARP_VALUES
    return nv, threads, WARP_ROWS if warp else 1


def _rows(x, name: str, dtype=np.float32):
    """(N, heads, D, row stride, head stride) of a 2-D or 3-D operand."""
    C.device_array(x, name, dtype=dtype, ndim=(2, 3))
    st = C.inner_contiguous(x, name, 1)
    if x.ndim == 2:
        return x.shape[0], 1, x.shape[1], st[0], 0
    return x.shape[0], x.shape[1], x.shape[2], st[0], st[1]


def _out_type(out, mode: int) -> str:
    """The kernel's OT spelling for `out`: float32, or uint16 (bf16 bits) in every mode but L2."""
    C.device_array(out, "out")
    allowed = _OUT_TYPES if mode in _BF16_OUT_MODES else {np.dtype(np.float32): "float"}
    found = allowed.get(out.dtype)
    C.require(found is not None, "out",
              f"dtype {out.dtype}, expected {' or '.join(map(str, allowed))}")
    return found


def _launch(mode: int, x, out, weight=None, z=None, residual=None, eps=0.0, scale=1.0,
            reference_layout: bool = False):
    """`reference_layout` (tests, f32 out): one block per row even where a warp holds a row."""
    n, heads, dim, x_rs, x_hs = _rows(x, "x")
    out_type = _out_type(out, mode)
    n2, heads2, dim2, o_rs, o_hs = _rows(out, "out", out.dtype)
    C.require((n2, heads2, dim2) == (n, heads, dim), "out",
              f"shape {tuple(out.shape)} does not match x {tuple(x.shape)}")
    z_rs = z_hs = r_rs = 0
    if z is not None:
        nz, hz, dz, z_rs, z_hs = _rows(z, "z")
        C.require((nz, hz, dz) == (n, heads, dim), "z", f"shape {tuple(z.shape)} != x")
    if residual is not None:
        nr, hr, dr, r_rs, _ = _rows(residual, "residual")
        C.require((nr, hr, dr) == (n, 1, dim), "residual", f"shape {tuple(residual.shape)} != x")
    kind = C.WKind.F32
    w_ptr = 0
    if weight is not None:
        w, kind = C.weight_array(weight, "weight")
        C.require(w.shape == (dim,), "weight", f"shape {w.shape}, expected ({dim},)")
        w_ptr = C.ptr(C.contiguous(w, "weight"))
    C.require(eps >= 0.0, "eps", f"must be >= 0, got {eps}")
    if n * heads == 0:
        return
    params = C.pack(_PARAMS, x=C.ptr(x), z=C.ptr(z) if z is not None else 0,
                    residual=C.ptr(residual) if residual is not None else 0, w=w_ptr,
                    out=C.ptr(out), x_rs=x_rs, x_hs=x_hs, z_rs=z_rs, z_hs=z_hs, r_rs=r_rs,
                    out_rs=o_rs, out_hs=o_hs, heads=heads, dim=dim, eps=eps, scale=scale,
                    rows=n * heads)
    nv, threads, rb = launch_shape(dim)
    source = SOURCE
    if reference_layout and rb > 1:
        C.require(out_type == "float", "out", "the reference layout writes f32")
        source, rb = REFERENCE_SOURCE, 1
    fn = get_function(source, f"norm_kernel<{kind.ctype}, {out_type}, {mode}, {nv}, {threads}, "
                              f"{rb}>")
    grid, block = (n * heads, threads) if rb == 1 else (-(-n * heads // rb), 32 * rb)
    launch(fn, (grid,), (block,), (params,), name=f"norm[{mode}]", pdl=True)


def rms_norm(x, weight, eps: float, out, *, zero_centered: bool) -> None:
    """y = x / sqrt(mean(x^2) + eps) * (1 + w if zero_centered else w); `out` (f32 or bf16
    bits) may be `x` when f32."""
    _launch(RMS_ZC if zero_centered else RMS, x, out, weight=weight, eps=float(eps))


def add_rms_norm(residual, x, weight, eps: float, out) -> None:
    """residual += x (in place), then out = zero-centred rms_norm(residual). residual, x
    f32[N,H]; out f32 or bf16 bits [N,H]."""
    C.require(residual.ndim == 2 and x.ndim == 2, "residual", "expects 2-D [N, H] operands")
    _launch(ADD_RMS_ZC, x, out, weight=weight, residual=residual, eps=float(eps))


def gated_rms_norm(x, z, weight, eps: float, out) -> None:
    """Per head: y = w * (x / sqrt(mean(x^2) + eps)) * silu(z); x, z f32[N,Hv,dv]; out f32 or
    bf16 bits [N,Hv,dv]."""
    _launch(GATED, x, out, weight=weight, z=z, eps=float(eps))


def l2norm_heads(x, eps: float, scale: float, out) -> None:
    """y = x / sqrt(sum(x^2) + eps) * scale over the last axis of f32[N,Hh,d] (rows strided)."""
    _launch(L2, x, out, eps=float(eps), scale=float(scale))
