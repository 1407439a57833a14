"""`embedding`: gather rows of the embedding table (docs/ops.md)."""
from __future__ import annotations

from ninfer.core.dtypes import DType
from ninfer.ops import _checks as check
from ninfer.ops._backend import backend_of


def supports(table_dtype: DType) -> bool:
    return table_dtype in check.WEIGHT_DTYPES


def embedding(ids, table, out) -> None:
    """out[n] = table[ids[n]]. ids: i32[N]; table: Weight[V, H]; out: f32[N, H] (written).

    Ids outside [0, V) raise ValueError on the CPU; callers validate them before a GPU launch.
    """
    backend = backend_of(ids, table, out)
    (n,) = check.array("embedding", "ids", ids, check.I32, (None,))
    _, hidden = check.weight("embedding", "table", table, (None, None))
    check.array("embedding", "out", out, check.F32, (n, hidden))
    check.kernels(backend, "embedding").embedding(ids, table, out)
