"""Float64 NumPy references of every op in docs/ops.md (tests only; slow and allocating).

Each function takes the op's inputs (arrays or `Weight`s, NumPy only) and returns new float64
arrays instead of writing `out` (stateful ops also return the updated state). bf16 operands are
widened exactly before the float64 math. Where the contract fixes an fp32 step that changes
results beyond rounding noise (the RoPE angle), the reference performs that step in fp32 too.
"""
from __future__ import annotations

import numpy as np

from ninfer.core.dtypes import DType, bf16_bits_to_f32, f32_to_bf16_bits
from ninfer.core.tensor import Weight

MASK64 = (1 << 64) - 1


def f64(a) -> np.ndarray:
    """float64 copy of a Weight (bf16 widened) or a float array."""
    if isinstance(a, Weight):
        data = bf16_bits_to_f32(a.data) if a.dtype is DType.BFLOAT16 else a.data
        return np.asarray(data, dtype=np.float64)
    return np.asarray(a, dtype=np.float64)


def pages_f64(pages: np.ndarray) -> np.ndarray:
    """float64 copy of KV pages (uint16 = bf16 bits, or float32)."""
    return f64(bf16_bits_to_f32(pages) if pages.dtype == np.uint16 else pages)


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def embedding(ids, table):
    return f64(table)[np.asarray(ids)]


def rms_norm(x, weight, eps, *, zero_centered: bool):
    x = f64(x)
    w = f64(weight)
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * (1.0 + w) if zero_centered else y * w


def add_rms_norm(residual, x, weight, eps):
    """Returns (updated residual, out)."""
    res = f64(residual) + f64(x)
    return res, rms_norm(res, weight, eps, zero_centered=True)


def gated_rms_norm(x, z, weight, eps):
    return rms_norm(x, weight, eps, zero_centered=False) * _silu(f64(z))


def l2norm_heads(x, eps, scale):
    x = f64(x)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps) * scale


def linear(x, weight):
    return f64(x) @ f64(weight).T


def rope(x, positions, inv_freq, freq_axis):
    """The rotated copy of x [N, Hh, D]. Angles are float32(pos) * inv_freq in fp32 (contract)."""
    x = f64(x).copy()
    half = len(inv_freq)
    pos = np.asarray(positions)[np.asarray(freq_axis)].T.astype(np.float32)  # [N, half]
    angle = f64(pos * np.asarray(inv_freq, np.float32)[None, :])
    cos, sin = np.cos(angle)[:, None, :], np.sin(angle)[:, None, :]
    x1, x2 = x[..., :half].copy(), x[..., half:2 * half].copy()
    x[..., :half] = x1 * cos - x2 * sin
    x[..., half:2 * half] = x2 * cos + x1 * sin
    return x


def kv_write(k, v, k_pages, v_pages, block_tables, row_seq, row_pos):
    """Returns copies of (k_pages, v_pages) with the rows stored (bf16 rounded to nearest even)."""
    kp, vp = k_pages.copy(), v_pages.copy()
    page_size = kp.shape[2]
    for n, (s, p) in enumerate(zip(row_seq, row_pos)):
        page, off = block_tables[s, p // page_size], p % page_size
        for dst, src in ((kp, k), (vp, v)):
            row = np.asarray(src[n], np.float32)
            dst[page, :, off, :] = f32_to_bf16_bits(row) if dst.dtype == np.uint16 else row
    return kp, vp


def gather_kv(pages, block_tables, seq, length):
    """float64 [Hkv, length, D] of one sequence's first `length` positions."""
    pages = pages_f64(pages)
    page_size = pages.shape[2]
    pos = np.arange(length)
    return pages[block_tables[seq, pos // page_size], :, pos % page_size, :].transpose(1, 0, 2)


def paged_attention(q, k_pages, v_pages, block_tables, row_seq, row_pos, scale):
    q = f64(q)
    n, heads, d = q.shape
    group = heads // k_pages.shape[1]
    out = np.zeros((n, heads, d))
    for t in range(n):
        keys = gather_kv(k_pages, block_tables, row_seq[t], row_pos[t] + 1)
        vals = gather_kv(v_pages, block_tables, row_seq[t], row_pos[t] + 1)
        for h in range(heads):
            s = keys[h // group] @ q[t, h] * scale
            p = np.exp(s - s.max())
            out[t, h] = (p / p.sum()) @ vals[h // group]
    return out


def sigmoid_mul(x, gate):
    return f64(x) * _sigmoid(f64(gate))


def swiglu(gate_up):
    gu = f64(gate_up)
    inter = gu.shape[1] // 2
    return _silu(gu[:, :inter]) * gu[:, inter:]


def sigmoid_scale_add(acc, y, gate):
    return f64(acc) + _sigmoid(f64(gate)) * f64(y)


def add_inplace(acc, x):
    return f64(acc) + f64(x)


def gdn_conv(x, weight, conv_state, seg_starts, seg_slots):
    """Returns (out [N, C], updated conv_state [S, Kc-1, C])."""
    x, w, state = f64(x), f64(weight), f64(conv_state).copy()
    kc = w.shape[1]
    out = np.zeros_like(x)
    for g, slot in enumerate(seg_slots):
        seg = x[seg_starts[g]:seg_starts[g + 1]]
        win = np.concatenate([state[slot], seg], axis=0)
        for t in range(len(seg)):
            out[seg_starts[g] + t] = _silu(np.einsum("jc,cj->c", win[t:t + kc], w))
        state[slot] = win[len(win) - (kc - 1):]
    return out, state


def gdn_gates(a, b, a_log, dt_bias):
    """Returns (g, beta)."""
    z = f64(a) + f64(dt_bias)
    softplus = np.where(z > 20.0, z, np.log1p(np.exp(np.minimum(z, 20.0))))
    return -np.exp(f64(a_log)) * softplus, _sigmoid(f64(b))


def gdn_recurrence(q, k, v, g, beta, state, seg_starts, seg_slots):
    """Returns (out [N, Hv, dv], updated state [S, Hv, dk, dv])."""
    q, k, v, g, beta = f64(q), f64(k), f64(v), f64(g), f64(beta)
    st = f64(state).copy()
    ratio = v.shape[1] // q.shape[1]
    out = np.zeros_like(v)
    for seg, slot in enumerate(seg_slots):
        for t in range(seg_starts[seg], seg_starts[seg + 1]):
            for h in range(v.shape[1]):
                s = st[slot, h] * np.exp(g[t, h])
                kt = k[t, h // ratio]
                delta = beta[t, h] * (v[t, h] - kt @ s)
                s = s + np.outer(kt, delta)
                out[t, h] = q[t, h // ratio] @ s
                st[slot, h] = s
    return out, st


def moe_route(logits, top_k):
    """Returns (weights f64[N, K], ids int32[N, K]): largest first, ties to the lower id."""
    x = f64(logits)
    p = np.exp(x - x.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    ids = np.argsort(-p, axis=1, kind="stable")[:, :top_k].astype(np.int32)
    w = np.take_along_axis(p, ids, axis=1)
    return w / w.sum(axis=1, keepdims=True), ids


def moe_experts(x, gate_up, down, ids, weights, *, act_bf16: bool = False):
    """`act_bf16`: silu(g) * u rounded to bf16 (nearest even, from its f32 value) before the
    down projection, as `moe_experts(..., bf16_act=True)` on CUDA."""
    x, gu_w, dn_w, wts = f64(x), f64(gate_up), f64(down), f64(weights)
    inter = gu_w.shape[1] // 2
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        for k in np.argsort(ids[t], kind="stable"):
            gu = gu_w[ids[t, k]] @ x[t]
            act = _silu(gu[:inter]) * gu[inter:]
            if act_bf16:
                act = f64(bf16_bits_to_f32(f32_to_bf16_bits(act.astype(np.float32))))
            out[t] += wts[t, k] * (dn_w[ids[t, k]] @ act)
    return out


def uniform(seed: int, n: int) -> float:
    """docs/ops.md `uniform(seed, n)` with Python integers (the definition, mod 2^64)."""
    z = (int(seed) + (int(n) + 1) * 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    z ^= z >> 31
    return (z >> 11) * 2.0 ** -53


def log_softmax(row):
    x = f64(row)
    m = x.max()
    return x - m - np.log(np.sum(np.exp(x - m)))


def penalised(row, repetition, presence, frequency, pen_tokens, pen_counts):
    """The logits after repetition, frequency and presence penalties (step 2 of `sample`)."""
    x = f64(row).copy()
    for tok, cnt in zip(pen_tokens, pen_counts):
        val = x[tok] / repetition if x[tok] > 0 else x[tok] * repetition
        x[tok] = val - (frequency * cnt + presence * (cnt > 0))
    return x


def kept_distribution(row, temperature, top_k, top_p, min_p, repetition, presence, frequency,
                      pen_tokens, pen_counts):
    """(candidate ids in draw order, their renormalised probabilities) after every filter.

    Greedy rows (temperature 0) return the argmax with probability 1.
    """
    x = penalised(row, repetition, presence, frequency, pen_tokens, pen_counts)
    if temperature == 0:
        return np.array([int(np.argmax(x))]), np.ones(1)
    x = x / temperature
    p = np.exp(x - x.max())
    p /= p.sum()
    order = np.lexsort((np.arange(len(p)), -p))  # p descending, ties to the lower id
    keep = len(order) if top_k <= 0 else min(top_k, len(order))
    cum = np.cumsum(p[order][:keep])
    reached = np.nonzero(cum >= top_p)[0]
    if top_p < 1.0 and len(reached):
        keep = int(reached[0]) + 1
    order = order[:keep]
    order = order[p[order] >= min_p * p.max()]
    return order, p[order] / p[order].sum()


def sample(logits, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
           frequency_penalty, seeds, counters, pen_offsets, pen_tokens, pen_counts, n_top=0):
    """Returns (tokens, logprobs, top_ids [B, n_top], top_logprobs [B, n_top])."""
    b_rows = logits.shape[0]
    tokens = np.zeros(b_rows, np.int32)
    logprobs = np.zeros(b_rows)
    top_ids = np.zeros((b_rows, n_top), np.int32)
    top_lp = np.zeros((b_rows, n_top))
    for b in range(b_rows):
        lp = log_softmax(logits[b])
        top_ids[b] = np.lexsort((np.arange(len(lp)), -lp))[:n_top]
        top_lp[b] = lp[top_ids[b]]
        sl = slice(pen_offsets[b], pen_offsets[b + 1])
        order, probs = kept_distribution(
            logits[b], float(temperature[b]), int(top_k[b]), float(top_p[b]), float(min_p[b]),
            float(repetition_penalty[b]), float(presence_penalty[b]),
            float(frequency_penalty[b]), pen_tokens[sl], pen_counts[sl])
        u = uniform(int(seeds[b]), int(counters[b]))
        above = np.nonzero(np.cumsum(probs) > u)[0]
        tokens[b] = order[above[0]] if len(above) else order[-1]
        logprobs[b] = lp[tokens[b]]
    return tokens, logprobs, top_ids, top_lp
