"""MoE ops: `moe_route` (softmax, top-k, renormalise) and `moe_experts` (docs/ops.md)."""
from __future__ import annotations

from ninfer.core.dtypes import DType
from ninfer.ops import _checks as check
from ninfer.ops._backend import backend_of


def supports(weight_dtype: DType) -> bool:
    return weight_dtype in check.WEIGHT_DTYPES


def moe_route(logits, top_k: int, weights_out, ids_out) -> None:
    """Softmax over all E experts in fp32, the top_k largest (largest first, ties to the lower
    id), renormalised to sum 1. logits: f32[N, E]; weights_out: f32[N, K]; ids_out: i32[N, K]."""
    backend = backend_of(logits, weights_out, ids_out)
    n, e = check.array("moe_route", "logits", logits, check.F32, (None, None))
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= e:
        raise ValueError(f"moe_route: top_k must be an int in [1, {e}], got {top_k!r}")
    check.array("moe_route", "weights_out", weights_out, check.F32, (n, top_k))
    check.array("moe_route", "ids_out", ids_out, check.I32, (n, top_k))
    check.kernels(backend, "moe").moe_route(logits, top_k, weights_out, ids_out)


def moe_experts(x, gate_up, down, ids, weights, out, *, workspace=None,
                batch_invariant: bool = False) -> None:
    """out[n] = sum_k weights[n, k] * down[e] @ (silu(g) * u), [g | u] = gate_up[e] @ x[n],
    e = ids[n, k], terms added in ascending expert id. x: f32[N, H]; gate_up: Weight[E, 2Im, H];
    down: Weight[E, H, Im]; ids: i32[N, K]; weights: f32[N, K]; out: f32[N, H] (overwritten)."""
    backend = backend_of(x, gate_up, down, ids, weights, out)
    n, h = check.array("moe_experts", "x", x, check.F32, (None, None))
    e, two_im, _ = check.weight("moe_experts", "gate_up", gate_up, (None, None, h))
    if two_im % 2:
        raise ValueError(f"moe_experts: gate_up has an odd number of rows ({two_im})")
    check.weight("moe_experts", "down", down, (e, h, two_im // 2))
    _, k = check.array("moe_experts", "ids", ids, check.I32, (n, None))
    check.array("moe_experts", "weights", weights, check.F32, (n, k))
    check.array("moe_experts", "out", out, check.F32, (n, h))
    check.kernels(backend, "moe").moe_experts(x, gate_up, down, ids, weights, out,
                                              **check.scratch(backend, workspace=workspace,
                                                             batch_invariant=batch_invariant or None))
