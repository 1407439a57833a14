"""GPU sampling vs the CPU sampler (same seeds -> the same tokens) and vs the float64 reference
(logprobs, top alternatives), over greedy, temperature, top-k, top-p (peaked and flat
distributions), min-p and penalties, at a small and at the real vocabulary size."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.kernels_cuda import sampling as ksamp
from ninfer.kernels_numba_cpu import sampling as csamp
from ninfer.ops import reference as ref

from cuda_testutil import assert_same_bits, cp, dev, host, poisoned

pytestmark = pytest.mark.gpu

# (temperature, top_k, top_p, min_p, repetition, presence, frequency)
CONFIGS = [
    (0.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0),     # greedy
    (0.0, 0, 1.0, 0.0, 1.3, 0.5, 0.2),     # greedy with penalties
    (1.0, 0, 1.0, 0.0, 1.0, 0.0, 0.0),     # plain temperature (whole distribution)
    (0.7, 20, 0.95, 0.0, 1.0, 1.5, 0.0),   # Qwen non-thinking defaults
    (1.0, 40, 1.0, 0.0, 1.1, 0.0, 0.3),
    (0.6, 0, 0.9, 0.0, 1.0, 0.0, 0.0),     # top_p only
    (1.0, 0, 1.0, 0.05, 1.0, 0.0, 0.0),    # min_p only
    (1.3, 3000, 0.8, 0.0, 1.0, 0.0, 0.0),  # top_k beyond the GPU candidate cap
]


def _inputs(rng, b, vocab, scale):
    logits = (rng.standard_normal((b, vocab)) * scale).astype(np.float32)
    logits[:, rng.integers(0, vocab, 3)] += 4.0  # a few likely tokens
    cfg = [CONFIGS[i % len(CONFIGS)] for i in range(b)]
    cols = list(zip(*cfg))
    params = dict(
        temperature=np.array(cols[0], np.float32), top_k=np.array(cols[1], np.int32),
        top_p=np.array(cols[2], np.float32), min_p=np.array(cols[3], np.float32),
        repetition_penalty=np.array(cols[4], np.float32),
        presence_penalty=np.array(cols[5], np.float32),
        frequency_penalty=np.array(cols[6], np.float32),
        seeds=rng.integers(0, 2**63, b).astype(np.uint64),
        counters=rng.integers(0, 1000, b).astype(np.int64))
    pen_tokens, pen_counts, offsets = [], [], [0]
    for _ in range(b):
        toks = rng.choice(vocab, 5, replace=False)
        pen_tokens += list(toks)
        pen_counts += list(rng.integers(0, 4, 5))
        offsets.append(len(pen_tokens))
    params.update(pen_offsets=np.array(offsets, np.int32),
                  pen_tokens=np.array(pen_tokens, np.int32),
                  pen_counts=np.array(pen_counts, np.int32))
    return logits, params


ORDER = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
         "frequency_penalty", "seeds", "counters", "pen_offsets", "pen_tokens", "pen_counts")


@pytest.mark.parametrize("vocab,scale", [(1000, 1.0), (248_320, 2.0), (5000, 0.05)])
def test_tokens_match_cpu_sampler(rng, vocab, scale):
    b, n_top = 2 * len(CONFIGS), 5
    logits, params = _inputs(rng, b, vocab, scale)
    cpu_tok = np.full(b, -7, np.int32)
    cpu_lp = np.full(b, np.nan, np.float32)
    cpu_ids = np.full((b, n_top), -7, np.int32)
    cpu_tlp = np.full((b, n_top), np.nan, np.float32)
    csamp.sample(logits, *[params[k] for k in ORDER], cpu_tok, cpu_lp, cpu_ids, cpu_tlp)
    tok, lp = poisoned(b, np.int32), poisoned(b)
    ids, tlp = poisoned((b, n_top), np.int32), poisoned((b, n_top))
    ksamp.sample(dev(logits), *[dev(params[k]) for k in ORDER], tok, lp, ids, tlp)
    np.testing.assert_array_equal(host(tok), cpu_tok)
    np.testing.assert_array_equal(host(ids), cpu_ids)
    np.testing.assert_allclose(host(lp), cpu_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(host(tlp), cpu_tlp, rtol=1e-5, atol=1e-5)
    _, exp_lp, exp_ids, exp_tlp = ref.sample(logits, *[params[k] for k in ORDER], n_top=n_top)
    np.testing.assert_array_equal(host(ids), exp_ids)
    np.testing.assert_allclose(host(tlp), exp_tlp, rtol=1e-5, atol=1e-5)
    chosen = host(tok)
    ref_lp = np.array([ref.log_softmax(logits[i])[chosen[i]] for i in range(b)])
    np.testing.assert_allclose(host(lp), ref_lp, rtol=1e-5, atol=1e-4)


def test_draw_frequencies_follow_the_kept_distribution(rng):
    """Many counters on one row: the token histogram matches the reference distribution."""
    vocab, draws = 50, 4000
    logits = (rng.standard_normal((1, vocab)) * 1.5).astype(np.float32)
    logits = np.repeat(logits, draws, axis=0)
    b = draws
    params = dict(temperature=np.full(b, 0.9, np.float32), top_k=np.full(b, 10, np.int32),
                  top_p=np.full(b, 0.9, np.float32), min_p=np.zeros(b, np.float32),
                  repetition_penalty=np.ones(b, np.float32),
                  presence_penalty=np.zeros(b, np.float32),
                  frequency_penalty=np.zeros(b, np.float32),
                  seeds=np.full(b, 1234, np.uint64), counters=np.arange(b, dtype=np.int64),
                  pen_offsets=np.zeros(b + 1, np.int32), pen_tokens=np.zeros(0, np.int32),
                  pen_counts=np.zeros(0, np.int32))
    tok = poisoned(b, np.int32)
    ksamp.sample(dev(logits), *[dev(params[k]) for k in ORDER], tok, poisoned(b),
                 poisoned((b, 0), np.int32), poisoned((b, 0)))
    order, probs = ref.kept_distribution(logits[0], 0.9, 10, 0.9, 0.0, 1.0, 0.0, 0.0, [], [])
    hist = np.bincount(host(tok), minlength=vocab)[order] / draws
    assert set(np.unique(host(tok))) <= set(order.tolist())
    assert np.abs(hist - probs).max() < 0.04


def _greedy_params(rng, b):
    """Host sampling parameters of b greedy rows without penalties (the fast path)."""
    zeros = np.zeros(b, np.float32)
    return dict(temperature=zeros, top_k=np.zeros(b, np.int32), top_p=np.ones(b, np.float32),
                min_p=zeros, repetition_penalty=np.ones(b, np.float32),
                presence_penalty=zeros, frequency_penalty=zeros,
                seeds=rng.integers(0, 2**63, b).astype(np.uint64),
                counters=np.zeros(b, np.int64), pen_offsets=np.zeros(b + 1, np.int32),
                pen_tokens=np.zeros(0, np.int32), pen_counts=np.zeros(0, np.int32))


@pytest.mark.parametrize("vocab", [997, 248_320])
def test_greedy_fast_path_ties_and_logprobs(rng, vocab):
    """Greedy rows without penalties take the sliced statistics path: the argmax is the lowest
    id among equal maxima, also when they fall in different slices, and the logprob is the
    float64 log-softmax of the raw logits."""
    b = 4
    logits = rng.standard_normal((b, vocab)).astype(np.float32)
    top = np.float32(9.0)
    logits[0, [vocab - 1, 3]] = top            # tie across the first and last slice
    logits[1, [vocab // 2 + 1, vocab // 2]] = top  # tie inside one slice
    logits[2, vocab - 1] = top                 # the very last id
    params = _greedy_params(rng, b)
    tok, lp = poisoned(b, np.int32), poisoned(b)
    ids, tlp = poisoned((b, 0), np.int32), poisoned((b, 0))
    ksamp.sample(dev(logits), *[dev(params[k]) for k in ORDER], tok, lp, ids, tlp)
    expect = np.argmax(logits, axis=1)  # numpy: first occurrence = lowest id
    np.testing.assert_array_equal(host(tok), expect)
    assert host(tok)[0] == 3 and host(tok)[1] == vocab // 2 and host(tok)[2] == vocab - 1
    ref_lp = np.array([ref.log_softmax(logits[i].astype(np.float64))[expect[i]]
                       for i in range(b)])
    np.testing.assert_allclose(host(lp), ref_lp, rtol=1e-5, atol=1e-5)


# The greedy fast path's statistics fold as it was before sample_kernel staged the slice partials
# in shared memory (one thread, slice order, partials and exps read serially): the same token and
# logprob bits are required.
_FORMER_FOLD = r"""
extern "C" __global__ void former_fold(const float* logits, long long logits_rs,
                                       const float* scratch, long long scratch_rs, int ns,
                                       int* tok_out, float* lp_out) {
  const int b = blockIdx.x;
  const float* row = logits + b * logits_rs;
  const unsigned* part = reinterpret_cast<const unsigned*>(scratch + b * scratch_rs);
  float m = __int_as_float(0xff800000);
  int arg = 0x7fffffff;
  for (int i = 0; i < ns; ++i) {
    const float mi = __uint_as_float(part[i]);
    if (mi > m || arg == 0x7fffffff) { m = mi; arg = (int)part[ns + i]; }
  }
  double z = 0.0;
  for (int i = 0; i < ns; ++i) {
    const unsigned long long zb = (unsigned long long)part[2 * ns + 2 * i] |
                                  ((unsigned long long)part[2 * ns + 2 * i + 1] << 32);
    const float mi = __uint_as_float(part[i]);
    if (mi > __int_as_float(0xff800000))
      z += __longlong_as_double((long long)zb) * exp((double)mi - (double)m);
  }
  const double lse = (double)m + log(z);
  tok_out[b] = arg;
  lp_out[b] = (float)((double)row[arg] - lse);
}
"""


@pytest.mark.parametrize("vocab", [997, 4096, 65_537, 248_320])
def test_greedy_fast_path_equals_the_serial_fold_bitwise(rng, vocab):
    """sample_kernel's parallel staging of the slice statistics gives bitwise the token and
    logprob of the former one-thread fold over the same partials (left in the scratch rows by
    the greedy fast path), on rows with slices of -inf and ties across slices."""
    b = 6
    logits = (rng.standard_normal((b, vocab)) * 3.0).astype(np.float32)
    logits[1, : vocab // 2] = -np.inf               # whole slices of -inf
    logits[2, [5, vocab - 2]] = logits[2].max() + 1.0  # a tie across slices
    logits[3] *= 40.0                                # a peaked row (exp terms underflow)
    params = _greedy_params(rng, b)
    logits_d, scratch = dev(logits), poisoned((b, vocab))
    tok, lp = poisoned(b, np.int32), poisoned(b)
    ids, tlp = poisoned((b, 0), np.int32), poisoned((b, 0))
    ksamp.sample(logits_d, *[dev(params[k]) for k in ORDER], tok, lp, ids, tlp, scratch=scratch)
    fold = cp().RawModule(code=_FORMER_FOLD, options=("--std=c++17",)).get_function(
        "former_fold")
    f_tok, f_lp = poisoned(b, np.int32), poisoned(b)
    fold((b,), (1,), (logits_d, np.int64(vocab), scratch, np.int64(vocab),
                      np.int32(ksamp.n_slices(vocab)), f_tok, f_lp))
    assert np.isfinite(host(lp)).all(), host(lp)
    np.testing.assert_array_equal(host(tok), np.argmax(logits, axis=1))
    assert_same_bits(tok, f_tok, f"tokens, V={vocab}")
    assert_same_bits(lp, f_lp, f"logprobs, V={vocab}")
