"""`linear`: out = x @ w^T with fp32 accumulation in a fixed per-element order (docs/ops.md),
and the CUDA-only `linear_swiglu` (gate/up projection fused with SwiGLU for decode)."""
from __future__ import annotations

from ninfer.core.dtypes import DType
from ninfer.ops import _checks as check
from ninfer.ops._backend import Backend, backend_of


def supports(weight_dtype: DType) -> bool:
    return weight_dtype in check.WEIGHT_DTYPES


def reads_bf16_x(rows: int, weight, *, batch_invariant: bool = False) -> bool:
    """Whether `linear` with `rows` rows and this weight rounds x to bf16 (nearest even) before
    multiplying: CUDA, bf16 weight, the cuBLAS path. Exactly then x may be passed as those bf16
    bits (uint16) instead, with bitwise the same `out`."""
    if weight.dtype is not DType.BFLOAT16 or backend_of(weight) is not Backend.CUDA:
        return False
    return check.kernels(Backend.CUDA, "linear").takes_cublas(rows, batch_invariant)


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
                        f"the GEMV takes, not batch invariant); got a {weight.dtype.value} "
                        f"weight, {n} rows, batch_invariant={batch_invariant}")
    check.array("linear", "out", out, check.F32, (n, m))
    check.kernels(backend, "linear").linear(x, weight, out,
                                            **check.scratch(backend, workspace=workspace,
                                                          batch_invariant=batch_invariant or None))


def linear_swiglu(x, gate_up, out) -> None:
    """CUDA-only decode fast path: out[N, I] = silu(x @ gate^T) * (x @ up^T) in one launch, with
    gate_up a bf16 Weight [2I, K] = [gate; up]. Bitwise equal to `linear` into [N, 2I] followed
    by `swiglu`; meant for few rows (decode): it streams the weights once per 8 rows."""
    backend = backend_of(x, gate_up, out)
    if backend is not Backend.CUDA:
        raise TypeError("linear_swiglu is a CUDA-only op (the CPU backend uses linear + swiglu)")
    check_swiglu_operands("linear_swiglu", x, gate_up, out)
    check.kernels(backend, "linear").linear_swiglu(x, gate_up, out)


def check_swiglu_operands(op: str, x, gate_up, out, *, rows: int | None = None,
                          out_name: str = "out") -> None:
    """The operands of a fused gate_up + SwiGLU (`linear_swiglu`, `moe_route_with_swiglu`):
    x f32 [N, K] (rows strided; N = `rows` when given), gate_up a bf16 Weight [2I, K] =
    [gate; up], out f32 [N, I]."""
    n, k = check.array(op, "x", x, check.F32, (rows, None), check.Layout.ROWS)
    m2, _ = check.weight(op, "gate_up", gate_up, (None, k))
    if gate_up.dtype is not DType.BFLOAT16 or m2 % 2:
        raise TypeError(f"{op}: gate_up must be bf16 [2I, {k}], got "
                        f"{gate_up.dtype.value} {gate_up.shape}")
    check.array(op, out_name, out, check.F32, (n, m2 // 2))
