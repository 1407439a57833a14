"""`linear`: out = x @ w^T with fp32 accumulation in a fixed per-element order (docs/ops.md),
and the CUDA-only `linear_swiglu` (gate/up projection fused with SwiGLU for decode) and norm
fold (`linear_residual_norm`, `RowNorm`: a Qwen RMSNorm carried between two GEMVs)."""
from __future__ import annotations

import dataclasses

from ninfer.core.dtypes import DType
from ninfer.ops import _checks as check
from ninfer.ops._backend import Backend, backend_of


def supports(weight_dtype: DType) -> bool:
    return weight_dtype in check.WEIGHT_DTYPES


def reads_bf16_x(rows: int, weight, *, batch_invariant: bool = False) -> bool:
    """Whether `linear` with `rows` rows and this weight takes x as bf16 bits (uint16): CUDA, a
    bf16 weight, and either the cuBLAS path (which rounds an f32 x to exactly those bits: the
    same `out`) or the bf16-x GEMV (NINFER_GEMV_BF16_X; `out` is that of the f32 x holding the
    same values). Where it holds, the op producing x may write it as bf16."""
    if weight.dtype is not DType.BFLOAT16 or backend_of(weight) is not Backend.CUDA:
        return False
    return check.kernels(Backend.CUDA, "linear").takes_bf16_x(rows, weight, batch_invariant)


def swiglu_reads_bf16_x(gate_up) -> bool:
    """Whether `linear_swiglu` with this gate_up takes x (and writes out) as bf16 bits: what the
    GEMV path of `linear` takes (the fused SwiGLU always runs the GEMV, for any N)."""
    return reads_bf16_x(1, gate_up, batch_invariant=True)


@dataclasses.dataclass(frozen=True)
class RowNorm:
    """A Qwen RMSNorm left to the linears that read its output (the norm fold's consumer side).
    Their x holds bf16(r * (1 + w)) (`linear_residual_norm` wrote it) instead of
    bf16(r / rms(r) * (1 + w)); `parts` f32 [N, P] holds the row blocks' sums of r^2 (the same
    call's), so rms(r) = sqrt(sum(parts[n]) / dim + eps) and each output row is divided by it.
    A CUDA device array; the linear reads it when it runs."""

    parts: object
    dim: int
    eps: float


def norm_fold_applies(rows: int, weight) -> bool:
    """Whether `linear_residual_norm` runs for `rows` rows of this weight, and `linear` /
    `linear_swiglu` take `row_norm` for it: CUDA, a bf16 weight, the bf16-x GEMV (decode rows)."""
    if weight.dtype is not DType.BFLOAT16 or backend_of(weight) is not Backend.CUDA:
        return False
    return check.kernels(Backend.CUDA, "linear").norm_fold_ok(rows, weight)


def residual_norm_parts(weight) -> int:
    """The columns of `parts` that `linear_residual_norm` writes for this weight (CUDA)."""
    return check.kernels(Backend.CUDA, "linear").residual_norm_parts(weight)


def linear_residual_norm(x, weight, residual, gain, out, parts) -> None:
    """CUDA-only decode op, the norm fold's producer: residual f32 [N, M] += x @ weight^T (in
    place); out bf16 bits [N, M] = bf16(residual * gain) (gain f32 [M]: a Qwen norm's 1 + w);
    parts f32 [N, >= P] (P = `residual_norm_parts(weight)`): columns 0..P-1 = row-block sums
    of residual^2, in a fixed order (batch invariant). Where `norm_fold_applies(N, weight)`;
    x: bf16 bits [N, K]. The linears that read `out` take `RowNorm(parts[:, :P], M, eps)`."""
    backend = backend_of(x, weight, residual, gain, out, parts)
    if backend is not Backend.CUDA:
        raise TypeError("linear_residual_norm is a CUDA-only op (the CPU backend runs linear "
                        "and add_rms_norm)")
    n, k = check.array("linear_residual_norm", "x", x, check.BF16_BITS, (None, None),
                       check.Layout.CONTIGUOUS)
    m, _ = check.weight("linear_residual_norm", "weight", weight, (None, k))
    if not norm_fold_applies(n, weight):
        raise TypeError(f"linear_residual_norm: needs the bf16-x GEMV (bf16 weight, "
                        f"NINFER_GEMV_BF16_X=1, sm_90) and 1..8 rows; got a "
                        f"{weight.dtype.value} weight, {n} rows")
    check.array("linear_residual_norm", "residual", residual, check.F32, (n, m),
                check.Layout.ROWS)
    check.array("linear_residual_norm", "gain", gain, check.F32, (m,))
    check.array("linear_residual_norm", "out", out, check.BF16_BITS, (n, m))
    check.array("linear_residual_norm", "parts", parts, check.F32, (n, None), check.Layout.ROWS)
    check.kernels(backend, "linear").linear_residual_norm(x, weight, residual, gain, out, parts)


def _row_norm(op: str, backend, row_norm: RowNorm | None, normed_out=None) -> dict:
    """The kernels' row_norm (and normed_out) arguments (none when absent, so other kernels
    need not take them)."""
    if row_norm is None:
        if normed_out is not None:
            raise ValueError(f"{op}: normed_out needs row_norm")
        return {}
    if backend is not Backend.CUDA:
        raise TypeError(f"{op}: row_norm is CUDA-only (the norm fold's consumer)")
    return {"row_norm": row_norm} if normed_out is None else {"row_norm": row_norm,
                                                              "normed_out": normed_out}


def linear(x, weight, out, *, workspace=None, batch_invariant: bool = False,
           row_norm: RowNorm | None = None, normed_out=None) -> None:
    """out[N, M] = x[N, K] @ weight[M, K]^T.

    x: f32, rows strided (last axis contiguous), or bf16 bits (uint16, C-contiguous) where
    `reads_bf16_x` holds; weight: Weight (f32 or bf16), C-contiguous; out: f32[N, M]
    C-contiguous, written, must not alias x. Batch invariant: each out[n, m] depends only on
    x[n] and weight[m]. `row_norm` (CUDA, `norm_fold_applies`, bf16 x): out row n divided by
    the row's rms (`RowNorm`). `normed_out` (with `row_norm`): bf16 bits [N, K], apart from x,
    also written: bf16(x / the row's rms), the norm finished for x's other readers (an MoE
    layer's router: NINFER_MOE_ROUTER_NORM).
    """
    backend = backend_of(x, weight, out)
    n, k = check.f32_or_bf16("linear", "x", x, backend, (None, None), check.Layout.ROWS)
    m, _ = check.weight("linear", "weight", weight, (None, k))
    if x.dtype == check.BF16_BITS and not reads_bf16_x(n, weight, batch_invariant=batch_invariant):
        raise TypeError(f"linear: a bf16 x needs the cuBLAS path (bf16 weight, more rows than "
                        f"the GEMV takes, not batch invariant) or the bf16-x GEMV "
                        f"(NINFER_GEMV_BF16_X=1); got a {weight.dtype.value} weight, {n} rows, "
                        f"batch_invariant={batch_invariant}")
    check.array("linear", "out", out, check.F32, (n, m))
    check.kernels(backend, "linear").linear(x, weight, out,
                                            **check.scratch(backend, workspace=workspace,
                                                          batch_invariant=batch_invariant or None),
                                            **_row_norm("linear", backend, row_norm,
                                                        normed_out))


def linear_swiglu(x, gate_up, out, *, row_norm: RowNorm | None = None) -> None:
    """CUDA-only decode fast path: out[N, I] = silu(x @ gate^T) * (x @ up^T) in one launch, with
    gate_up a bf16 Weight [2I, K] = [gate; up]. Bitwise equal to `linear` into [N, 2I] followed
    by `swiglu`; meant for few rows (decode): it streams the weights once per 8 rows. Where
    `swiglu_reads_bf16_x(gate_up)`, x may be bf16 bits (uint16, C-contiguous) and then so may
    out (the f32 result rounded to nearest even). `row_norm`: gate and up rows divided by the
    row's rms before the silu (`RowNorm`; a bf16 x and a bf16 out)."""
    backend = backend_of(x, gate_up, out)
    if backend is not Backend.CUDA:
        raise TypeError("linear_swiglu is a CUDA-only op (the CPU backend uses linear + swiglu)")
    check_swiglu_operands("linear_swiglu", x, gate_up, out,
                          bf16=x.dtype == check.BF16_BITS or out.dtype == check.BF16_BITS)
    check.kernels(backend, "linear").linear_swiglu(x, gate_up, out,
                                                   **_row_norm("linear_swiglu", backend, row_norm))


def check_swiglu_operands(op: str, x, gate_up, out, *, rows: int | None = None,
                          out_name: str = "out", bf16: bool = False) -> None:
    """The operands of a fused gate_up + SwiGLU (`linear_swiglu`, `moe_route_with_swiglu`):
    x f32 [N, K] (rows strided; N = `rows` when given), gate_up a bf16 Weight [2I, K] =
    [gate; up], out f32 [N, I]. `bf16`: x bf16 bits [N, K] (C-contiguous) and out f32 or bf16
    bits [N, I], which `swiglu_reads_bf16_x(gate_up)` must allow."""
    x_dtype = check.BF16_BITS if bf16 else check.F32
    layout = check.Layout.CONTIGUOUS if bf16 else check.Layout.ROWS
    n, k = check.array(op, "x", x, x_dtype, (rows, None), layout)
    m2, _ = check.weight(op, "gate_up", gate_up, (None, k))
    if gate_up.dtype is not DType.BFLOAT16 or m2 % 2:
        raise TypeError(f"{op}: gate_up must be bf16 [2I, {k}], got "
                        f"{gate_up.dtype.value} {gate_up.shape}")
    out_dtype = out.dtype if bf16 and out.dtype == check.BF16_BITS else check.F32
    check.array(op, out_name, out, out_dtype, (n, m2 // 2))
    if bf16 and not swiglu_reads_bf16_x(gate_up):
        raise TypeError(f"{op}: bf16 operands need the bf16-x GEMV (NINFER_GEMV_BF16_X=1, a CUDA "
                        f"sm_90 device, K % 16 == 0)")
