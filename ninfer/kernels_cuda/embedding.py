"""Launcher for embedding.cu: `embedding(ids, table, out)` (docs/ops.md), with programmatic
dependent launch allowed (`_loader.launch(..., pdl=True)`)."""
from __future__ import annotations

import numpy as np

from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda._loader import KernelSource, get_function, launch

SOURCE = KernelSource("embedding.cu", tuple(f"embedding_kernel<{k.ctype}>" for k in C.WKind))


def embedding(ids, table, out) -> None:
    """out[n] = table[ids[n]]: ids i32[N], table Weight[V,H] (f32 or bf16), out f32[N,H].

    An out-of-range id yields a NaN row (the ops layer validates ids on the host side).
    """
    C.contiguous(C.device_array(ids, "ids", dtype=np.int32, ndim=1), "ids")
    w, kind = C.weight_array(table, "table")
    C.require(w.ndim == 2, "table", f"expected [V, H], got shape {w.shape}")
    vocab, hidden = w.shape
    n = ids.shape[0]
    C.device_array(out, "out", dtype=np.float32, ndim=2, shape=(n, hidden))
    if n == 0:
        return
    fn = get_function(SOURCE, f"embedding_kernel<{kind.ctype}>")
    launch(fn, (n,), (256,), (ids, w, np.int64(C.row_stride(w, "table")), np.int32(vocab),
                              np.int32(hidden), out, np.int64(C.row_stride(out, "out"))),
           name="embedding", pdl=True)
