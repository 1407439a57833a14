"""Launcher for sampling.cu: `sample(...)` exactly per docs/ops.md.

Two launches: `sample_stats_kernel` (row statistics over NB slices of each row, many blocks per
row) then `sample_kernel` (one block per row). The slice partials and then the penalised logits
are written to `scratch` (f32[>= B, V]); pass a preallocated one (e.g. the decode graph's), or
None to allocate per call (not capturable). Tokens match the CPU sampler's
for the same seeds: both compute e_j = exp(l_j / T - l_max / T) in fp32 and walk candidates in
descending e with ties to the lower id (see sampling.cu for where the GPU uses fixed-point
masses instead of the CPU's sequential fp64 sums: flat distributions without top_k only).
Both launches allow programmatic dependent launch (`_loader.launch(..., pdl=True)`).
"""
from __future__ import annotations

import numpy as np

from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda._loader import KernelSource, get_function, launch

MAX_TOP = 2048  # S_CAP in select.cuh
SOURCE = KernelSource("sampling.cu", ("sample_stats_kernel", "sample_kernel"))
_PARAMS = C.struct(*[(f, "ptr") for f in (
    "logits", "scratch", "temperature", "top_k", "top_p", "min_p", "rep", "presence",
    "frequency", "seeds", "counters", "pen_offsets", "pen_tokens", "pen_counts", "tokens_out",
    "logprobs_out", "top_ids_out", "top_logprobs_out")],
    ("logits_rs", "i64"), ("scratch_rs", "i64"), ("top_rs", "i64"), ("vocab", "i32"),
    ("n_top", "i32"), ("n_slices", "i32"), ("pad", "i32"), ("top_count", "ptr"))
assert _PARAMS.itemsize == 192
MAX_SLICES = 64  # SAMPLE_MAX_SLICES in sampling.cu (sample_kernel stages 4 words per slice)
SLICE_MIN = 1024  # logits per slice at least (below that one block does the row)


def n_slices(vocab: int) -> int:
    """Slices of a row for the statistics pass (their 4 * NB partial words fit in the row)."""
    return max(1, min(MAX_SLICES, vocab // SLICE_MIN))


def _vec(x, name, dtype, n):
    C.contiguous(C.device_array(x, name, dtype=dtype, shape=(n,)), name)
    return C.ptr(x)


def sample(logits, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
           frequency_penalty, seeds, counters, pen_offsets, pen_tokens, pen_counts, tokens_out,
           logprobs_out, top_ids_out, top_logprobs_out, *, scratch=None, top_count=None) -> None:
    """One token per row of logits f32[B, V]; see ninfer.ops.sampling.sample for the operands.

    `top_count`: optional device int32[1] read at run time: only the first min(T, top_count)
    alternatives are computed (the rest are written as -1 / -inf), so a captured graph with T
    columns pays for the selection only on steps that want it.
    """
    C.device_array(logits, "logits", dtype=np.float32, ndim=2)
    b, vocab = logits.shape
    ptrs = {name: _vec(arr, name, dt, b) for name, arr, dt in (
        ("temperature", temperature, np.float32), ("top_k", top_k, np.int32),
        ("top_p", top_p, np.float32), ("min_p", min_p, np.float32),
        ("rep", repetition_penalty, np.float32), ("presence", presence_penalty, np.float32),
        ("frequency", frequency_penalty, np.float32), ("seeds", seeds, np.uint64),
        ("counters", counters, np.int64), ("tokens_out", tokens_out, np.int32),
        ("logprobs_out", logprobs_out, np.float32))}
    ptrs["pen_offsets"] = _vec(pen_offsets, "pen_offsets", np.int32, b + 1)
    C.contiguous(C.device_array(pen_tokens, "pen_tokens", dtype=np.int32, ndim=1), "pen_tokens")
    ptrs["pen_tokens"] = C.ptr(pen_tokens)
    ptrs["pen_counts"] = _vec(pen_counts, "pen_counts", np.int32, pen_tokens.shape[0])
    C.device_array(top_ids_out, "top_ids_out", dtype=np.int32, ndim=2)
    n_top = top_ids_out.shape[1]
    C.device_array(top_logprobs_out, "top_logprobs_out", dtype=np.float32, shape=(b, n_top))
    C.require(vocab >= 4, "logits", f"vocabulary of {vocab} < 4 entries")
    C.require(n_top <= min(MAX_TOP, vocab), "top_ids_out",
              f"at most {min(MAX_TOP, vocab)} alternatives")
    top_rs = C.row_stride(top_ids_out, "top_ids_out") if n_top else 0
    if n_top:
        C.require(C.row_stride(top_logprobs_out, "top_logprobs_out") == top_rs,
                  "top_logprobs_out", "must have the row stride of top_ids_out")
    if b == 0:
        return
    if scratch is None:
        scratch = C.cupy().empty((b, vocab), dtype=np.float32)
    C.device_array(scratch, "scratch", dtype=np.float32, ndim=2)
    C.require(scratch.shape[0] >= b and scratch.shape[1] == vocab, "scratch",
              f"needs shape [>= {b}, {vocab}]")
    tc = 0
    if top_count is not None:
        C.contiguous(C.device_array(top_count, "top_count", dtype=np.int32, shape=(1,)),
                     "top_count")
        tc = C.ptr(top_count)
    params = C.pack(_PARAMS, logits=C.ptr(logits), scratch=C.ptr(scratch), top_count=tc,
                    top_ids_out=C.ptr(top_ids_out), top_logprobs_out=C.ptr(top_logprobs_out),
                    logits_rs=C.row_stride(logits, "logits"),
                    scratch_rs=C.row_stride(scratch, "scratch"), top_rs=top_rs, vocab=vocab,
                    n_top=n_top, n_slices=n_slices(vocab), **ptrs)
    launch(get_function(SOURCE, "sample_stats_kernel"), (n_slices(vocab), b), (256,), (params,),
           name="sample_stats", pdl=True)
    launch(get_function(SOURCE, "sample_kernel"), (b,), (1024,), (params,), name="sample",
           pdl=True)
