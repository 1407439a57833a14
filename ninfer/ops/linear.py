"""`linear`: out = x @ w^T with fp32 accumulation in a fixed per-element order (docs/ops.md),
and the CUDA-only `linear_swiglu` (gate/up projection fused with SwiGLU for decode)."""
from __future__ import annotations

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


def linear(x, weight, out, *, workspace=None, batch_invariant: bool = False) -> None:
    """out[N, M] = x[N, K] @ weight[M, K]^T.

    x: f32, rows strided (last axis contiguous), or bf16 bits (uint16, C-contiguous) where
    `reads_bf16_x` holds; weight: Weight (f32 or bf16), C-contiguous; out: f32[N, M]
    C-contiguous, written, must not alias x. Batch invariant: each out[n, m] depends only on
    x[n] and weight[m].
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
                                                          batch_invariant=batch_invariant or None))


def linear_swiglu(x, gate_up, out) -> None:
    """CUDA-only decode fast path: out[N, I] = silu(x @ gate^T) * (x @ up^T) in one launch, with
    gate_up a bf16 Weight [2I, K] = [gate; up]. Bitwise equal to `linear` into [N, 2I] followed
    by `swiglu`; meant for few rows (decode): it streams the weights once per 8 rows. Where
    `swiglu_reads_bf16_x(gate_up)`, x may be bf16 bits (uint16, C-contiguous) and then so may
    out (the f32 result rounded to nearest even)."""
    backend = backend_of(x, gate_up, out)
    if backend is not Backend.CUDA:
        raise TypeError("linear_swiglu is a CUDA-only op (the CPU backend uses linear + swiglu)")
    check_swiglu_operands("linear_swiglu", x, gate_up, out,
                          bf16=x.dtype == check.BF16_BITS or out.dtype == check.BF16_BITS)
    check.kernels(backend, "linear").linear_swiglu(x, gate_up, out)


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
