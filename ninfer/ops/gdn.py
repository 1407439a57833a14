"""Gated DeltaNet ops: `gdn_conv`, `gdn_gates`, `gdn_recurrence` (docs/ops.md).

Stateful ops take segments: rows seg_starts[g]..seg_starts[g+1] are consecutive tokens of the
sequence whose state is slot seg_slots[g] of a StateImage view (`ninfer.core.state_image`).
seg_starts rises from 0 to N; a slot appears at most once per call.
"""
from __future__ import annotations

from ninfer.core.dtypes import DType
from ninfer.ops import _checks as check
from ninfer.ops._backend import backend_of

_ROWS = check.Layout.ROWS
_SLOTS = check.Layout.SLOTS


def supports(weight_dtype: DType) -> bool:
    return weight_dtype in check.WEIGHT_DTYPES


def _segments(op: str, seg_starts, seg_slots) -> None:
    (g,) = check.array(op, "seg_slots", seg_slots, check.I32, (None,))
    check.array(op, "seg_starts", seg_starts, check.I32, (g + 1,))


def gdn_conv(x, weight, conv_state, seg_starts, seg_slots, out) -> None:
    """Causal depthwise conv + SiLU over each segment, continuing from and updating conv_state.

    x: f32[N, C] rows strided; weight: Weight[C, Kc] (w[:, Kc-1] multiplies the current token);
    conv_state: f32[S, Kc-1, C] slot-strided; out: f32[N, C] C-contiguous.
    """
    backend = backend_of(x, weight, conv_state, seg_starts, seg_slots, out)
    n, c = check.array("gdn_conv", "x", x, check.F32, (None, None), _ROWS)
    _, kc = check.weight("gdn_conv", "weight", weight, (c, None))
    if kc < 1:
        raise ValueError("gdn_conv: conv width must be >= 1")
    check.array("gdn_conv", "conv_state", conv_state, check.F32, (None, kc - 1, c), _SLOTS)
    _segments("gdn_conv", seg_starts, seg_slots)
    check.array("gdn_conv", "out", out, check.F32, (n, c))
    check.kernels(backend, "gdn").gdn_conv(x, weight, conv_state, seg_starts, seg_slots, out)


def gdn_gates(a, b, a_log, dt_bias, g_out, beta_out) -> None:
    """g = -exp(a_log) * softplus(a + dt_bias), beta = sigmoid(b), fp32.

    a, b: f32[N, Hv] rows strided; a_log, dt_bias: Weight[Hv]; g_out, beta_out: f32[N, Hv].
    """
    backend = backend_of(a, b, a_log, dt_bias, g_out, beta_out)
    n, hv = check.array("gdn_gates", "a", a, check.F32, (None, None), _ROWS)
    check.array("gdn_gates", "b", b, check.F32, (n, hv), _ROWS)
    check.weight("gdn_gates", "a_log", a_log, (hv,))
    check.weight("gdn_gates", "dt_bias", dt_bias, (hv,))
    check.array("gdn_gates", "g_out", g_out, check.F32, (n, hv))
    check.array("gdn_gates", "beta_out", beta_out, check.F32, (n, hv))
    check.kernels(backend, "gdn").gdn_gates(a, b, a_log, dt_bias, g_out, beta_out)


def gdn_recurrence(q, k, v, g, beta, state, seg_starts, seg_slots, out) -> None:
    """The delta-rule recurrence per segment and value head, token by token, in fp32:
    S = exp(g_t) S; kv = S^T k_t; delta = beta_t (v_t - kv); S += k_t delta^T; o_t = S^T q_t.

    q, k: f32[N, Hk, dk] (L2-normalised; q also scaled), v: f32[N, Hv, dv], all rows strided;
    g, beta: f32[N, Hv]; state: f32[S, Hv, dk, dv] slot-strided (updated in place);
    out: f32[N, Hv, dv]. Value head h uses key head h // (Hv // Hk).
    """
    backend = backend_of(q, k, v, g, beta, state, seg_starts, seg_slots, out)
    n, hk, dk = check.array("gdn_recurrence", "q", q, check.F32, (None, None, None), _ROWS)
    check.array("gdn_recurrence", "k", k, check.F32, (n, hk, dk), _ROWS)
    _, hv, dv = check.array("gdn_recurrence", "v", v, check.F32, (n, None, None), _ROWS)
    if hk == 0 or hv % hk:
        raise ValueError(f"gdn_recurrence: {hv} value heads are not a multiple of {hk} key heads")
    check.array("gdn_recurrence", "g", g, check.F32, (n, hv))
    check.array("gdn_recurrence", "beta", beta, check.F32, (n, hv))
    check.array("gdn_recurrence", "state", state, check.F32, (None, hv, dk, dv), _SLOTS)
    _segments("gdn_recurrence", seg_starts, seg_slots)
    check.array("gdn_recurrence", "out", out, check.F32, (n, hv, dv))
    check.kernels(backend, "gdn").gdn_recurrence(q, k, v, g, beta, state, seg_starts,
                                                 seg_slots, out)
