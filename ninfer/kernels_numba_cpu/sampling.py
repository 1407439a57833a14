"""CPU kernel for `sample` (docs/ops.md, "sample"): logprobs, penalties, filters, seeded draw.

One row per parallel task; a row's token depends only on that row's inputs. Exponentials are
fp32 (e_j = exp(l_j - max), so p_j = e_j / Z with e_max = 1); sums and cumulative masses are
accumulated in float64. Candidates are visited in descending-e order (ties: lower id first)
without sorting the whole vocabulary: the order is built band by band (e in [2^-8, 1], then
[2^-16, 2^-8), ..., finally [0, 2^-128) and NaN), each band sorted stably, and a walk stops as
soon as it has what it needs. The concatenated bands are exactly the full sorted order.
"""
from __future__ import annotations

import numpy as np
from numba import float64, njit, prange, uint64

from ninfer.kernels_numba_cpu._layout import flat
from ninfer.kernels_numba_cpu._prim import F0
from ninfer.kernels_numba_cpu._threads import launch

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_BAND_BITS = 8
_LAST_BAND = 16


@njit(inline="always")
def uniform(seed, n):
    """The counter-based draw in [0, 1) shared with CUDA (mod-2^64 arithmetic)."""
    z = uint64(seed) + (uint64(n) + uint64(1)) * _GOLDEN
    z = (z ^ (z >> uint64(30))) * _MIX1
    z = (z ^ (z >> uint64(27))) * _MIX2
    z = z ^ (z >> uint64(31))
    return float64(z >> uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True)
def uniform_array(seeds, counters):
    out = np.empty(seeds.shape[0], np.float64)
    for i in range(seeds.shape[0]):
        out[i] = uniform(seeds[i], counters[i])
    return out


@njit(inline="always")
def _in_band(v, band):
    """Whether e value `v` belongs to band `band` (the last band also takes NaN)."""
    if band >= _LAST_BAND:
        return not v >= 2.0 ** (-_BAND_BITS * _LAST_BAND)
    if band > 0 and not v < 2.0 ** (-_BAND_BITS * band):
        return False
    return v >= 2.0 ** (-_BAND_BITS * (band + 1))


@njit(inline="always")
def _add_band(e, order, count, band):
    """Append the ids with e in band `band`, in descending e (ties by id); return the new count."""
    start = count
    for j in range(e.shape[0]):
        if _in_band(e[j], band):
            order[count] = j
            count += 1
    if count - start > 1:
        seg = order[start:count]
        keys = np.empty(count - start, np.float32)
        for i in range(count - start):
            keys[i] = -e[seg[i]]
        perm = np.argsort(keys, kind="mergesort")
        sorted_seg = seg[perm]
        order[start:count] = sorted_seg
    return count


@njit(inline="always")
def _top_alternatives(row, lse, top_ids, top_lp, base, n_top):
    """The n_top largest raw logits (ties to the lower id) as logprobs, written at top_*[base:]."""
    if n_top == 0:
        return
    vals = np.empty(n_top, np.float32)
    ids = np.empty(n_top, np.int32)
    filled = 0
    for j in range(row.shape[0]):
        v = row[j]
        if filled == n_top and not v > vals[n_top - 1]:
            continue
        pos = filled if filled < n_top else n_top - 1
        while pos > 0 and v > vals[pos - 1]:
            vals[pos] = vals[pos - 1]
            ids[pos] = ids[pos - 1]
            pos -= 1
        vals[pos] = v
        ids[pos] = j
        if filled < n_top:
            filled += 1
    for i in range(n_top):
        top_ids[base + i] = ids[i]
        top_lp[base + i] = np.float32(float64(vals[i]) - lse)


@njit
def _draw(lg, best, temp, top_k, top_p, min_p, u):
    """Step 3 of docs/ops.md for one row with temperature > 0: softmax at `temp`, top-k, top-p,
    min-p, then the first candidate whose cumulative kept mass exceeds u * kept mass."""
    vocab = lg.shape[0]
    top = lg[best] / temp
    e = np.empty(vocab, np.float32)
    total = 0.0
    n_min = 0
    for j in range(vocab):
        e[j] = np.exp(lg[j] / temp - top)
        total += e[j]
        if e[j] >= min_p:
            n_min += 1
    keep = max(n_min, 1)  # n_min is 0 only for a NaN row: keep something valid
    if 0 < top_k < keep:
        keep = top_k
    order = np.empty(vocab, np.int32)
    count = 0
    band = 0
    kept_mass = total
    if top_p < np.float32(1.0) or keep < vocab:
        target = float64(top_p) * total
        cum = 0.0
        for i in range(keep):
            while count <= i:
                count = _add_band(e, order, count, band)
                band += 1
            cum += e[order[i]]
            if top_p < np.float32(1.0) and cum >= target:
                keep = i + 1
                break
        kept_mass = cum
    threshold = u * kept_mass
    cum = 0.0
    for i in range(keep):
        while count <= i:
            count = _add_band(e, order, count, band)
            band += 1
        cum += e[order[i]]
        if cum > threshold:
            return order[i]
    return order[keep - 1]


@njit(parallel=True, cache=True, fastmath=False)
def _sample_kernel(logits, temperature, top_k, top_p, min_p, rep, presence, frequency, seeds,
                   counters, pen_offsets, pen_tokens, pen_counts, tokens_out, logprobs_out,
                   top_ids, ids_stride, top_lp, lp_stride, n_top):
    n_rows, vocab = logits.shape
    for b in prange(n_rows):
        row = logits[b]
        # 1. Raw log-softmax (before penalties and filters).
        m = row[0]
        for j in range(1, vocab):
            if row[j] > m:
                m = row[j]
        z = 0.0
        for j in range(vocab):
            z += np.exp(row[j] - m)
        lse = float64(m) + np.log(z)
        _top_alternatives(row, lse, top_ids[b * ids_stride:], top_lp[b * lp_stride:], 0, n_top)
        # 2. Penalties on a private copy.
        lg = row.copy()
        for i in range(pen_offsets[b], pen_offsets[b + 1]):
            cnt = pen_counts[i]
            v = lg[pen_tokens[i]]
            v = v / rep[b] if v > F0 else v * rep[b]
            v -= frequency[b] * np.float32(cnt) + (presence[b] if cnt > 0 else F0)
            lg[pen_tokens[i]] = v
        # 3. Greedy (lowest id on ties), or the filtered draw.
        best = 0
        for j in range(1, vocab):
            if lg[j] > lg[best]:
                best = j
        token = best
        if temperature[b] != F0:
            token = _draw(lg, best, temperature[b], top_k[b], top_p[b], min_p[b],
                          uniform(seeds[b], counters[b]))
        tokens_out[b] = token
        logprobs_out[b] = np.float32(float64(row[token]) - lse)


def _check_rows(temperature, top_k, top_p, min_p, repetition_penalty, pen_offsets, pen_tokens,
                pen_counts, vocab):
    """Host-side value checks that keep the kernel inside its arrays and its definition."""
    if not (np.all(temperature >= 0) and np.all(top_k >= 0) and np.all(top_p > 0)
            and np.all(top_p <= 1) and np.all(min_p >= 0) and np.all(min_p <= 1)
            and np.all(repetition_penalty > 0)):
        raise ValueError("sample: need temperature >= 0, top_k >= 0, 0 < top_p <= 1, "
                         "0 <= min_p <= 1 and repetition_penalty > 0 in every row")
    n_entries = pen_tokens.shape[0]
    if pen_offsets[0] != 0 or pen_offsets[-1] != n_entries or np.any(np.diff(pen_offsets) < 0):
        raise ValueError(f"sample: pen_offsets must rise from 0 to M={n_entries}")
    if n_entries and (pen_tokens.min() < 0 or pen_tokens.max() >= vocab):
        raise ValueError(f"sample: pen_tokens outside [0, {vocab})")
    if n_entries and pen_counts.min() < 0:
        raise ValueError("sample: pen_counts must be >= 0")


def sample(logits, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
           frequency_penalty, seeds, counters, pen_offsets, pen_tokens, pen_counts, tokens_out,
           logprobs_out, top_ids_out, top_logprobs_out) -> None:
    if logits.shape[0] == 0:
        return
    _check_rows(temperature, top_k, top_p, min_p, repetition_penalty, pen_offsets, pen_tokens,
                pen_counts, logits.shape[1])
    n_top = top_ids_out.shape[1]
    ids_buf, ids_strides = flat(top_ids_out) if n_top else (np.zeros(0, np.int32), (0, 0))
    lp_buf, lp_strides = flat(top_logprobs_out) if n_top else (np.zeros(0, np.float32), (0, 0))
    launch(_sample_kernel, 16 * logits.size, logits, temperature, top_k, top_p, min_p,
           repetition_penalty, presence_penalty, frequency_penalty, seeds, counters, pen_offsets,
           pen_tokens, pen_counts, tokens_out, logprobs_out, ids_buf, ids_strides[0], lp_buf,
           lp_strides[0], n_top)
