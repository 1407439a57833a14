"""`sample`: logprobs of the raw logits, penalties, temperature, top-k/top-p/min-p and a seeded
counter-based draw, per row (docs/ops.md, "sample")."""
from __future__ import annotations

from ninfer.ops import _checks as check
from ninfer.ops._backend import backend_of


def sample(logits, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
           frequency_penalty, seeds, counters, pen_offsets, pen_tokens, pen_counts, tokens_out,
           logprobs_out, top_ids_out, top_logprobs_out, *, workspace=None,
           top_count=None) -> None:
    """Sample one token per row of logits f32[B, V] (see docs/ops.md for the exact order).

    Per-row parameters are arrays of length B: temperature, top_p, min_p, repetition/presence/
    frequency penalties f32; top_k i32 (0 = off); seeds u64; counters i64 (index of the token being
    drawn). Penalty entries of row b are pen_tokens/pen_counts[pen_offsets[b]:pen_offsets[b+1]]
    (i32). Writes tokens_out i32[B], logprobs_out f32[B] (raw log-softmax of the chosen token) and
    the T best raw alternatives top_ids_out i32[B, T], top_logprobs_out f32[B, T] (T may be 0;
    rows may be strided, e.g. the first T columns of a wider buffer).
    `workspace`, `top_count` (CUDA only, ignored on the CPU): preallocated scratch, and a device
    int32[1] limiting this call's alternatives to its value (the rest read -1 / -inf).
    """
    args = (logits, temperature, top_k, top_p, min_p, repetition_penalty, presence_penalty,
            frequency_penalty, seeds, counters, pen_offsets, pen_tokens, pen_counts, tokens_out,
            logprobs_out, top_ids_out, top_logprobs_out)
    backend = backend_of(*args)
    b, v = check.array("sample", "logits", logits, check.F32, (None, None))
    if v == 0:
        raise ValueError("sample: logits has an empty vocabulary axis")
    for name, arr, dtype in (("temperature", temperature, check.F32), ("top_k", top_k, check.I32),
                             ("top_p", top_p, check.F32), ("min_p", min_p, check.F32),
                             ("repetition_penalty", repetition_penalty, check.F32),
                             ("presence_penalty", presence_penalty, check.F32),
                             ("frequency_penalty", frequency_penalty, check.F32),
                             ("seeds", seeds, check.U64), ("counters", counters, check.I64),
                             ("tokens_out", tokens_out, check.I32),
                             ("logprobs_out", logprobs_out, check.F32)):
        check.array("sample", name, arr, dtype, (b,))
    check.array("sample", "pen_offsets", pen_offsets, check.I32, (b + 1,))
    (m,) = check.array("sample", "pen_tokens", pen_tokens, check.I32, (None,))
    check.array("sample", "pen_counts", pen_counts, check.I32, (m,))
    _, t = check.array("sample", "top_ids_out", top_ids_out, check.I32, (b, None),
                       check.Layout.ROWS)
    if t > v:
        raise ValueError(f"sample: {t} top alternatives requested from a vocabulary of {v}")
    check.array("sample", "top_logprobs_out", top_logprobs_out, check.F32, (b, t),
                check.Layout.ROWS)
    check.kernels(backend, "sampling").sample(*args,
                                             **check.scratch(backend, scratch=workspace,
                                                                            top_count=top_count))
