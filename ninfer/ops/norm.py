"""Normalisations: `rms_norm`, `add_rms_norm`, `gated_rms_norm`, `l2norm_heads` (docs/ops.md).

On CUDA the first three may write `out` as bf16 bits (uint16, C-contiguous, not overlapping
any input): the f32 result rounded to nearest even, the operand a following cuBLAS linear reads.
"""
from __future__ import annotations

from ninfer.core.dtypes import DType
from ninfer.ops import _checks as check
from ninfer.ops._backend import backend_of

_ROWS = check.Layout.ROWS


def supports(weight_dtype: DType) -> bool:
    return weight_dtype in check.WEIGHT_DTYPES


def rms_norm(x, weight, eps, out, *, zero_centered: bool) -> None:
    """y = x / sqrt(mean(x^2) + eps) * (1 + w) (zero_centered) or * w, over the last axis.

    x: f32[N, H] or f32[N, heads, D], rows/heads strided; weight: Weight[last dim];
    out: same shape as x, f32 (may be x itself, then equally strided, else last axis
    contiguous) or bf16 bits (CUDA).
    """
    backend = backend_of(x, weight, out)
    check.one_of_ndim("rms_norm", "x", x, (2, 3))
    shape = check.array("rms_norm", "x", x, check.F32, (None,) * x.ndim, _ROWS)
    check.weight("rms_norm", "weight", weight, (shape[-1],))
    check.f32_or_bf16("rms_norm", "out", out, backend, shape, _ROWS)
    check.scalar("rms_norm", "eps", eps, minimum=0.0)
    check.kernels(backend, "norm").rms_norm(x, weight, eps, out, zero_centered=zero_centered)


def add_rms_norm(residual, x, weight, eps, out) -> None:
    """residual += x (in place), then out = zero-centred rms_norm(residual).

    residual, x: f32[N, H] C-contiguous; weight: Weight[H]; out: f32 or bf16 bits (CUDA)
    [N, H] C-contiguous.
    """
    backend = backend_of(residual, x, weight, out)
    shape = check.array("add_rms_norm", "residual", residual, check.F32, (None, None))
    check.array("add_rms_norm", "x", x, check.F32, shape)
    check.weight("add_rms_norm", "weight", weight, (shape[1],))
    check.f32_or_bf16("add_rms_norm", "out", out, backend, shape)
    check.scalar("add_rms_norm", "eps", eps, minimum=0.0)
    check.kernels(backend, "norm").add_rms_norm(residual, x, weight, eps, out)


def gated_rms_norm(x, z, weight, eps, out) -> None:
    """Per head: y = w * (x / sqrt(mean(x^2) + eps)) * silu(z) (plain w, GDN output norm).

    x: f32[N, Hv, dv] C-contiguous; z: f32[N, Hv, dv] rows strided; weight: Weight[dv];
    out: [N, Hv, dv] C-contiguous, f32 (may be x) or bf16 bits (CUDA).
    """
    backend = backend_of(x, z, weight, out)
    shape = check.array("gated_rms_norm", "x", x, check.F32, (None, None, None))
    check.array("gated_rms_norm", "z", z, check.F32, shape, _ROWS)
    check.weight("gated_rms_norm", "weight", weight, (shape[2],))
    check.f32_or_bf16("gated_rms_norm", "out", out, backend, shape)
    check.scalar("gated_rms_norm", "eps", eps, minimum=0.0)
    check.kernels(backend, "norm").gated_rms_norm(x, z, weight, eps, out)


def l2norm_heads(x, eps, scale, out) -> None:
    """y = x * rsqrt(sum(x^2) + eps) * scale per head (eps inside the rsqrt).

    x: f32[N, Hh, d] rows/heads strided; out: f32[N, Hh, d] C-contiguous.
    """
    backend = backend_of(x, out)
    shape = check.array("l2norm_heads", "x", x, check.F32, (None, None, None), _ROWS)
    check.array("l2norm_heads", "out", out, check.F32, shape)
    check.scalar("l2norm_heads", "eps", eps, minimum=0.0)
    check.scalar("l2norm_heads", "scale", scale)
    check.kernels(backend, "norm").l2norm_heads(x, eps, scale, out)
