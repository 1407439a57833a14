"""MoE ops: `moe_route` (softmax, top-k, renormalise), `moe_experts` and `moe_block` (the two
plus the gated shared expert's add), and the CUDA decode path `moe_route_with_swiglu` (the
routing beside the shared expert's gate_up in one launch; docs/ops.md)."""
from __future__ import annotations

from ninfer import envs
from ninfer.core.dtypes import DType
from ninfer.ops import _checks as check
from ninfer.ops._backend import Backend, backend_of
from ninfer.ops.linear import check_swiglu_operands, reads_bf16_x, swiglu_reads_bf16_x

_ROWS = check.Layout.ROWS


def supports(weight_dtype: DType) -> bool:
    return weight_dtype in check.WEIGHT_DTYPES


def moe_route(logits, top_k: int, weights_out, ids_out, *, workspace=None) -> None:
    """Softmax over all E experts in fp32, the top_k largest (largest first, ties to the lower
    id), renormalised to sum 1. logits: f32[N, E] rows strided; weights_out: f32[N, K];
    ids_out: i32[N, K]. `workspace` (CUDA MoeWorkspace; ignored on the CPU): the same launch
    also writes the grouping of ids_out into its group tables, for a following
    `moe_block(..., routed=True, workspace=workspace)` (same weights and ids)."""
    backend = backend_of(logits, weights_out, ids_out)
    _check_route("moe_route", logits, top_k, weights_out, ids_out)
    check.kernels(backend, "moe").moe_route(logits, top_k, weights_out, ids_out,
                                            **check.scratch(backend, workspace=workspace))


def moe_experts(x, gate_up, down, ids, weights, out, *, workspace=None,
                batch_invariant: bool = False, bf16_act: bool = False) -> None:
    """out[n] = sum_k weights[n, k] * down[e] @ (silu(g) * u), [g | u] = gate_up[e] @ x[n],
    e = ids[n, k], terms added in ascending expert id. x: f32[N, H], or on CUDA bf16 bits
    (uint16, C-contiguous: the result of the f32 x holding those values); gate_up: Weight[E, 2Im,
    H]; down: Weight[E, H, Im]; ids: i32[N, K]; weights: f32[N, K]; out: f32[N, H] (overwritten).
    `bf16_act` (CUDA, bf16 weights): silu(g) * u rounded to bf16 before the down projection, as
    the prefill path and transformers in bf16 keep it.
    """
    backend = backend_of(x, gate_up, down, ids, weights, out)
    _check_experts("moe_experts", x, gate_up, down, ids, weights, out, backend)
    check.kernels(backend, "moe").moe_experts(x, gate_up, down, ids, weights, out,
                                              **check.scratch(backend, workspace=workspace,
                                                             batch_invariant=batch_invariant or None),
                                              **_bf16_act("moe_experts", backend, bf16_act))


def moe_block(x, logits, top_k: int, gate_up, down, weights_out, ids_out, out, *, shared=None,
              shared_gate=None, shared_down=None, workspace=None, batch_invariant: bool = False,
              routed: bool = False, bf16_act: bool = False, norm_fold=None) -> None:
    """`moe_route(logits, top_k, weights_out, ids_out)`, then `moe_experts(x, gate_up, down,
    ids_out, weights_out, out)`, then (when `shared` is given) `sigmoid_scale_add(out, shared,
    shared_gate)`: bitwise those ops' results, in fewer launches on CUDA. logits: f32[N, E] rows
    strided; shared: f32[N, H]; shared_gate: f32[N, 1] rows strided (both or neither). x and
    `bf16_act` as `moe_experts` takes them (x f32, or bf16 bits on CUDA: `moe_reads_bf16_x`).

    `routed=True`: the routing already ran, `moe_route(logits, top_k, weights_out, ids_out,
    workspace=workspace)` with this same workspace (CUDA: its group tables hold the grouping of
    ids_out); weights_out / ids_out are read, not written, and logits are not read. Bitwise the
    routed=False results. Lets a caller run the routing early (before the shared expert).

    `shared_down` (CUDA decode, only where `moe_block_folds_shared_down` says so): Weight[H, Is];
    `shared` is then the shared expert's activation f32[N, Is] and the block adds
    sigmoid(shared_gate) * linear(shared, shared_down)[n] itself, bitwise that op's result, in
    its down launch instead of a `linear` launch of its own.

    `norm_fold` (CUDA decode, where `moe_block_folds_norm`; the norm fold's producer, as
    `ops.linear.linear_residual_norm` for a linear): (residual f32 [N, H], gain f32 [H], xg
    bf16 bits [N, H], parts f32 [N, >= moe_norm_fold_parts(H)]): `out` is not written; the
    block's output is added into the residual stream instead, xg = bf16(residual * gain), and
    parts[n, g] = the sum of residual^2 over columns [16 g, 16 g + 16) (the same bits for every
    row count). The next linears read xg with `RowNorm(parts[:, :P], H, eps)`."""
    backend = backend_of(x, logits, gate_up, down, weights_out, ids_out, out)
    _check_route("moe_block", logits, top_k, weights_out, ids_out)
    n, h = _check_experts("moe_block", x, gate_up, down, ids_out, weights_out, out, backend)
    if logits.shape != (n, gate_up.shape[0]):
        raise ValueError(f"moe_block: logits must have shape [{n}, {gate_up.shape[0]}], "
                         f"got {list(logits.shape)}")
    if (shared is None) != (shared_gate is None):
        raise ValueError("moe_block: shared and shared_gate go together")
    if shared_down is not None:
        if shared is None:
            raise ValueError("moe_block: shared_down needs shared (the shared activation)")
        _, inner = check.weight("moe_block", "shared_down", shared_down, (h, None))
        if backend is not Backend.CUDA:  # (the CUDA launcher refuses what it cannot fold)
            raise ValueError("moe_block: shared_down folds only into the CUDA fused decode path "
                             "(check moe_block_folds_shared_down; else run linear first)")
    if shared is not None:
        backend_of(x, shared, shared_gate)
        check.array("moe_block", "shared", shared, check.F32,
                    (n, h if shared_down is None else inner))
        check.array("moe_block", "shared_gate", shared_gate, check.F32, (n, 1), _ROWS)
    fold = {} if shared_down is None else {"shared_down": shared_down}
    if norm_fold is not None:
        if backend is not Backend.CUDA:
            raise TypeError("moe_block: norm_fold is CUDA-only (the norm fold's producer)")
        fold["norm_fold"] = norm_fold
    check.kernels(backend, "moe").moe_block(
        x, logits, top_k, gate_up, down, weights_out, ids_out, out, shared=shared,
        shared_gate=shared_gate, routed=bool(routed), **fold,
        **check.scratch(backend, workspace=workspace, batch_invariant=batch_invariant or None),
        **_bf16_act("moe_block", backend, bf16_act))


def _bf16_act(op: str, backend, bf16_act: bool) -> dict:
    """The kernels' bf16_act argument (none when off, so the CPU kernels need not take it)."""
    if not bf16_act:
        return {}
    if backend is not Backend.CUDA:
        raise TypeError(f"{op}: bf16_act is CUDA-only (the CPU backend computes in f32)")
    return {"bf16_act": True}


def moe_reads_bf16_x(rows: int, router_gate, shared_gate_up, experts_gate_up, *,
                     batch_invariant: bool = False) -> bool:
    """Whether an MoE layer's input may be bf16 bits (uint16) for `rows` rows: CUDA, bf16
    weights, NINFER_MOE_BF16_X, and the router (`linear`) and the shared expert's fused gate_up
    (`linear_swiglu` / `moe_route_with_swiglu`) take a bf16 x. `moe_block` takes it on every
    path (results of the f32 x holding those values); where it applies the bulk-copy gate_up
    stage reads the bits themselves, one mma per k16 step instead of the hi + lo pair."""
    weights = (router_gate, shared_gate_up, experts_gate_up)
    if not envs.moe_bf16_x() or any(w.dtype is not DType.BFLOAT16 for w in weights):
        return False
    if experts_gate_up.shape[-1] % 16:  # the kernels' 16-byte rows
        return False
    if backend_of(*weights) is not Backend.CUDA:
        return False
    return (reads_bf16_x(rows, router_gate, batch_invariant=batch_invariant)
            and swiglu_reads_bf16_x(shared_gate_up))


def moe_block_folds_norm(rows: int, top_k: int, hidden: int, gate_up, *,
                         batch_invariant: bool = False) -> bool:
    """Whether `moe_block` with `rows` rows takes `norm_fold` (CUDA; the grouped-GEMV decode
    path; False on the CPU)."""
    if backend_of(gate_up) is not Backend.CUDA:
        return False
    return check.kernels(Backend.CUDA, "moe").norm_folds(rows, top_k, hidden,
                                                         batch_invariant=batch_invariant)


def moe_norm_fold_parts(hidden: int) -> int:
    """The columns of `parts` that `moe_block`'s norm fold writes (one per 16 of H; CUDA)."""
    return check.kernels(Backend.CUDA, "moe").norm_fold_parts(hidden)


def moe_block_folds_shared_down(x, top_k: int, gate_up, down, shared_down, shared_act, *,
                                batch_invariant: bool = False) -> bool:
    """Whether `moe_block(..., shared=shared_act, shared_down=shared_down)` runs the shared
    expert's down projection inside its own launches (CUDA decode: the fused down kernel; False
    on the CPU and wherever the caller must run the `linear`)."""
    if backend_of(x, gate_up, down, shared_down) is not Backend.CUDA:
        return False
    return check.kernels(Backend.CUDA, "moe").shared_down_folds(
        x, top_k, gate_up, down, shared_down, shared_act, batch_invariant=batch_invariant)


def moe_route_with_swiglu_applies(logits, top_k: int, x, gate_up, *, workspace=None) -> bool:
    """Whether `moe_route_with_swiglu` runs as one launch for these operands (CUDA; False on
    the CPU)."""
    if backend_of(logits, x, gate_up) is not Backend.CUDA:
        return False
    return check.kernels(Backend.CUDA, "moe").route_with_swiglu_applies(logits, top_k, x,
                                                                       gate_up, workspace)


def moe_route_with_swiglu(logits, top_k: int, weights_out, ids_out, x, gate_up, act_out, *,
                          workspace) -> None:
    """CUDA-only decode fast path: `moe_route(logits, top_k, weights_out, ids_out,
    workspace=workspace)` and `linear_swiglu(x, gate_up, act_out)` (the MoE layer's shared
    expert gate_up: bf16 [2I, H] = [gate; up]; act_out f32 [N, I]), bitwise those two ops'
    results, in one launch where `moe_route_with_swiglu_applies` (the routing runs on an extra
    block of the GEMV; else the two launches). ids_out contiguous; workspace: the CUDA
    MoeWorkspace a following `moe_block(..., routed=True)` reads."""
    backend = backend_of(logits, weights_out, ids_out, x, gate_up, act_out)
    if backend is not Backend.CUDA:
        raise TypeError("moe_route_with_swiglu is a CUDA-only op (the CPU backend runs "
                        "moe_route, then linear + swiglu)")
    _check_route("moe_route_with_swiglu", logits, top_k, weights_out, ids_out)
    bf16 = getattr(x, "dtype", None) == check.BF16_BITS
    check_swiglu_operands("moe_route_with_swiglu", x, gate_up, act_out, rows=logits.shape[0],
                          out_name="act_out", bf16=bf16)
    if bf16 and act_out.dtype == check.BF16_BITS:
        raise TypeError("moe_route_with_swiglu: act_out is f32 (the folded shared down reads it)")
    check.kernels(backend, "moe").route_with_swiglu(logits, top_k, weights_out, ids_out, x,
                                                    gate_up, act_out, workspace=workspace)


def _check_route(op: str, logits, top_k, weights_out, ids_out) -> None:
    n, e = check.array(op, "logits", logits, check.F32, (None, None), _ROWS)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= e:
        raise ValueError(f"{op}: top_k must be an int in [1, {e}], got {top_k!r}")
    check.array(op, "weights_out", weights_out, check.F32, (n, top_k))
    check.array(op, "ids_out", ids_out, check.I32, (n, top_k))


def _check_experts(op: str, x, gate_up, down, ids, weights, out, backend) -> tuple[int, int]:
    n, h = check.f32_or_bf16(op, "x", x, backend, (None, None))
    e, two_im, _ = check.weight(op, "gate_up", gate_up, (None, None, h))
    if two_im % 2:
        raise ValueError(f"{op}: gate_up has an odd number of rows ({two_im})")
    check.weight(op, "down", down, (e, h, two_im // 2))
    _, k = check.array(op, "ids", ids, check.I32, (n, None))
    check.array(op, "weights", weights, check.F32, (n, k))
    check.array(op, "out", out, check.F32, (n, h))
    return n, h
