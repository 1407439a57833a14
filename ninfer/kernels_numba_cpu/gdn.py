"""CPU kernels for the Gated DeltaNet ops: `gdn_conv`, `gdn_gates`, `gdn_recurrence`.

Rows are grouped in segments (consecutive tokens of one sequence, whose state lives in one
StateImage slot). Both stateful kernels walk each segment token by token in order, reading and
writing the slot's state in place, so processing a prompt in one call or in chunks performs
exactly the same fp32 operations (the chunked-prefill half of the batch-invariance contract).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ninfer.kernels_numba_cpu._layout import flat, rows3
from ninfer.kernels_numba_cpu._prim import F0, sigmoid, silu, softplus, widen
from ninfer.kernels_numba_cpu._threads import launch

CONV_CHANNEL_BLOCK = 256


@njit(parallel=True, cache=True, fastmath=False)
def _conv_kernel(x, xs0, w, state, ss0, seg_starts, seg_slots, out, n_ch, kc):
    n_seg = seg_slots.shape[0]
    n_blocks = (n_ch + CONV_CHANNEL_BLOCK - 1) // CONV_CHANNEL_BLOCK
    hist = kc - 1
    for task in prange(n_seg * n_blocks):
        g = task // n_blocks
        c0 = (task - g * n_blocks) * CONV_CHANNEL_BLOCK
        c1 = min(n_ch, c0 + CONV_CHANNEL_BLOCK)
        start = seg_starts[g]
        seg_len = seg_starts[g + 1] - start
        so = seg_slots[g] * ss0
        for t in range(seg_len):
            for c in range(c0, c1):
                acc = F0
                for j in range(kc):
                    src = t + j - hist
                    if src < 0:
                        val = state[so + (hist + src) * n_ch + c]
                    else:
                        val = x[(start + src) * xs0 + c]
                    acc += widen(w[c, j]) * val
                out[start + t, c] = silu(acc)
        # Shift the window: ascending i reads state[i + seg_len] before it is overwritten.
        for i in range(hist):
            src = seg_len - hist + i
            for c in range(c0, c1):
                if src >= 0:
                    state[so + i * n_ch + c] = x[(start + src) * xs0 + c]
                else:
                    state[so + i * n_ch + c] = state[so + (i + seg_len) * n_ch + c]


@njit(parallel=True, cache=True, fastmath=False)
def _gates_kernel(a, as0, b, bs0, a_log, dt_bias, g_out, beta_out):
    n, heads = g_out.shape
    for t in prange(n):
        for h in range(heads):
            decay = -np.exp(widen(a_log[h]))
            g_out[t, h] = decay * softplus(a[t * as0 + h] + widen(dt_bias[h]))
            beta_out[t, h] = sigmoid(b[t * bs0 + h])


@njit(parallel=True, cache=True, fastmath=False)
def _recurrence_kernel(q, qs0, qs1, k, ks0, ks1, v, vs0, vs1, g, beta, state, ss0,
                       seg_starts, seg_slots, out, k_heads, dk):
    n_seg = seg_slots.shape[0]
    _, v_heads, dv = out.shape
    ratio = v_heads // k_heads
    for task in prange(n_seg * v_heads):
        seg = task // v_heads
        h = task - seg * v_heads
        kh = h // ratio
        base = seg_slots[seg] * ss0 + h * dk * dv
        kv = np.empty(dv, np.float32)
        o = np.empty(dv, np.float32)
        for t in range(seg_starts[seg], seg_starts[seg + 1]):
            decay = np.exp(g[t, h])
            qo = t * qs0 + kh * qs1
            ko = t * ks0 + kh * ks1
            vo = t * vs0 + h * vs1
            for j in range(dv):
                kv[j] = F0
            for i in range(dk):
                ki = k[ko + i]
                row = base + i * dv
                for j in range(dv):
                    s = state[row + j] * decay
                    state[row + j] = s
                    kv[j] += ki * s
            bt = beta[t, h]
            for j in range(dv):
                kv[j] = bt * (v[vo + j] - kv[j])  # kv now holds delta
            for j in range(dv):
                o[j] = F0
            for i in range(dk):
                ki = k[ko + i]
                qi = q[qo + i]
                row = base + i * dv
                for j in range(dv):
                    s = state[row + j] + ki * kv[j]
                    state[row + j] = s
                    o[j] += qi * s
            for j in range(dv):
                out[t, h, j] = o[j]


def _check_segments(name, seg_starts, seg_slots, n_rows, n_slots):
    n_seg = seg_slots.shape[0]
    if seg_starts[0] != 0 or seg_starts[n_seg] != n_rows or np.any(np.diff(seg_starts) < 0):
        raise ValueError(f"{name}: seg_starts must rise from 0 to N={n_rows}, got {seg_starts}")
    if n_seg and (seg_slots.min() < 0 or seg_slots.max() >= n_slots):
        raise ValueError(f"{name}: seg_slots outside [0, {n_slots})")
    if np.unique(seg_slots).shape[0] != n_seg:
        raise ValueError(f"{name}: a slot appears in two segments of one call")


def gdn_conv(x, weight, conv_state, seg_starts, seg_slots, out) -> None:
    _check_segments("gdn_conv", seg_starts, seg_slots, x.shape[0], conv_state.shape[0])
    if x.shape[0] == 0 or x.shape[1] == 0:
        return
    xb, xs0, _ = rows3(x)
    sb, sst = flat(conv_state)
    launch(_conv_kernel, x.size * weight.shape[1], xb, xs0, weight.data, sb, sst[0], seg_starts,
           seg_slots, out, x.shape[1], weight.shape[1])


def gdn_gates(a, b, a_log, dt_bias, g_out, beta_out) -> None:
    if g_out.size == 0:
        return
    ab, as0, _ = rows3(a)
    bb, bs0, _ = rows3(b)
    launch(_gates_kernel, 8 * g_out.size, ab, as0, bb, bs0, a_log.data, dt_bias.data, g_out,
           beta_out)


def gdn_recurrence(q, k, v, g, beta, state, seg_starts, seg_slots, out) -> None:
    _check_segments("gdn_recurrence", seg_starts, seg_slots, q.shape[0], state.shape[0])
    if q.shape[0] == 0:
        return
    qb, qs0, qs1 = rows3(q)
    kb, ks0, ks1 = rows3(k)
    vb, vs0, vs1 = rows3(v)
    sb, sst = flat(state)
    launch(_recurrence_kernel, 4 * out.size * q.shape[2], qb, qs0, qs1, kb, ks0, ks1, vb, vs0,
           vs1, g, beta, sb, sst[0], seg_starts, seg_slots, out, q.shape[1], q.shape[2])
