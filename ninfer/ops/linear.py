"""`linear`: out = x @ w^T with fp32 accumulation in a fixed per-element order (docs/ops.md)."""
from __future__ import annotations

from ninfer.core.dtypes import DType
from ninfer.ops import _checks as check
from ninfer.ops._backend import backend_of


def supports(weight_dtype: DType) -> bool:
    return weight_dtype in check.WEIGHT_DTYPES


def linear(x, weight, out, *, workspace=None, batch_invariant: bool = False) -> None:
    """out[N, M] = x[N, K] @ weight[M, K]^T.

    x: f32, rows strided (last axis contiguous); weight: Weight (f32 or bf16), C-contiguous;
    out: f32[N, M] C-contiguous, written, must not alias x. Batch invariant: each out[n, m]
    depends only on x[n] and weight[m].
    """
    backend = backend_of(x, weight, out)
    n, k = check.array("linear", "x", x, check.F32, (None, None), check.Layout.ROWS)
    m, _ = check.weight("linear", "weight", weight, (None, k))
    check.array("linear", "out", out, check.F32, (n, m))
    check.kernels(backend, "linear").linear(x, weight, out,
                                            **check.scratch(backend, workspace=workspace,
                                                          batch_invariant=batch_invariant or None))
