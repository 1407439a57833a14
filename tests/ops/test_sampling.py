"""sample: uniform() definition, greedy, penalties, filters, seeded reproducibility, batch
independence, logprobs, and empirical frequencies against the reference kept distribution."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.kernels_numba_cpu.sampling import uniform_array
from ninfer.ops import reference as ref
from ninfer.ops import sample

from .helpers import assert_close, poisoned, randn


def _params(b, **overrides):
    p = dict(temperature=np.ones(b, np.float32), top_k=np.zeros(b, np.int32),
             top_p=np.ones(b, np.float32), min_p=np.zeros(b, np.float32),
             repetition_penalty=np.ones(b, np.float32), presence_penalty=np.zeros(b, np.float32),
             frequency_penalty=np.zeros(b, np.float32), seeds=np.zeros(b, np.uint64),
             counters=np.zeros(b, np.int64), pen_offsets=np.zeros(b + 1, np.int32),
             pen_tokens=np.zeros(0, np.int32), pen_counts=np.zeros(0, np.int32))
    for key, value in overrides.items():
        p[key] = np.asarray(value, p[key].dtype)
    return p


_ORDER = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
          "frequency_penalty", "seeds", "counters", "pen_offsets", "pen_tokens", "pen_counts")


def _run(logits, p, n_top=0):
    b = logits.shape[0]
    tokens, lps = poisoned(b, np.int32), poisoned(b)
    # The top-T outputs are the first T columns of wider buffers (rows strided), as in the model.
    top_ids = poisoned((b, n_top + 2), np.int32)[:, :n_top]
    top_lps = poisoned((b, n_top + 2))[:, :n_top]
    sample(logits, *[p[k] for k in _ORDER], tokens, lps, top_ids, top_lps)
    return tokens, lps, top_ids, top_lps


def _random_params(rng, b, vocab):
    counts = rng.integers(1, 4, b)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    tokens = np.concatenate([rng.choice(vocab, c, replace=False) for c in counts])
    return _params(
        b, temperature=rng.choice([0.0, 0.5, 1.0, 1.7], b), top_k=rng.choice([0, 1, 5, 20], b),
        top_p=rng.choice([1.0, 0.9, 0.5], b), min_p=rng.choice([0.0, 0.05, 0.3], b),
        repetition_penalty=rng.choice([1.0, 1.3, 0.8], b),
        presence_penalty=rng.uniform(-1, 1, b), frequency_penalty=rng.uniform(-1, 1, b),
        seeds=rng.integers(0, 2**63, b, dtype=np.uint64) * 2 + 1,
        counters=rng.integers(0, 1000, b), pen_offsets=offsets, pen_tokens=tokens,
        pen_counts=rng.integers(0, 3, len(tokens)))


def test_uniform_matches_python_uint64_definition(rng):
    seeds = np.concatenate([rng.integers(0, 2**64 - 1, 50, dtype=np.uint64, endpoint=True),
                            np.array([0, 2**64 - 1], np.uint64)])
    counters = np.concatenate([rng.integers(0, 2**40, 50), [0, 7]]).astype(np.int64)
    got = uniform_array(seeds, counters)
    expect = [ref.uniform(int(s), int(c)) for s, c in zip(seeds, counters)]
    assert got.tolist() == expect
    assert np.all((got >= 0) & (got < 1))


@pytest.mark.parametrize("vocab", [50, 3000])
def test_tokens_and_logprobs_match_reference(rng, vocab):
    b = 16
    logits = randn(rng, (b, vocab), scale=3.0)
    logits[3, : vocab // 2] = -np.inf  # masked tokens: e = 0 exactly
    p = _random_params(rng, b, vocab)
    tokens, lps, top_ids, top_lps = _run(logits, p, n_top=4)
    e_tokens, e_lps, e_top_ids, e_top_lps = ref.sample(logits, *[p[k] for k in _ORDER], n_top=4)
    assert tokens.tolist() == e_tokens.tolist()
    assert_close(lps, e_lps)
    assert np.array_equal(top_ids, e_top_ids)
    assert_close(top_lps, e_top_lps)


def test_flat_distribution_needs_deep_bands(rng):
    # Near-uniform logits over a large vocabulary: the draw walks far past the first band.
    b, vocab = 8, 20000
    logits = randn(rng, (b, vocab), scale=6.0)
    p = _params(b, temperature=np.full(b, 4.0), top_p=[1.0, 0.999, 0.99, 0.9] * 2,
                seeds=rng.integers(1, 2**62, b, dtype=np.uint64), counters=np.arange(b))
    tokens = _run(logits, p)[0]
    expect = ref.sample(logits, *[p[k] for k in _ORDER])[0]
    for b in np.nonzero(tokens != expect)[0]:
        # the kernel's f32 cumulative sum over ~14k probabilities may cross u one token off the
        # float64 reference's; allowed only when u lies within that rounding of the boundary
        order, probs = ref.kept_distribution(logits[b], 4.0, 0, float(p["top_p"][b]), 0.0,
                                             1.0, 0.0, 0.0, [], [])
        u = ref.uniform(int(p["seeds"][b]), int(p["counters"][b]))
        rank = {int(t): i for i, t in enumerate(order)}
        got, want = rank[int(tokens[b])], rank[int(expect[b])]
        assert abs(got - want) == 1, (b, got, want)
        assert abs(np.cumsum(probs)[min(got, want)] - u) < 1e-5, (b, got, want, u)


def test_greedy_is_argmax_lowest_id_on_ties_after_penalties(rng):
    logits = randn(rng, (3, 40))
    logits[0, [7, 30]] = 50.0  # tie: lowest id wins
    logits[1, 11] = 50.0
    logits[2, 5] = 50.0
    # Row 2: a repetition penalty of 100 turns the 50.0 logit into 0.5 -> argmax moves.
    p = _params(3, temperature=np.zeros(3), pen_offsets=[0, 0, 0, 1], pen_tokens=[5],
                pen_counts=[0], repetition_penalty=[1.0, 1.0, 100.0])
    tokens, lps, _, _ = _run(logits, p)
    second = int(np.argmax(np.where(np.arange(40) == 5, -np.inf, logits[2])))
    assert tokens.tolist() == [7, 11, second]
    assert_close(lps, [ref.log_softmax(logits[i])[tokens[i]] for i in range(3)])


def test_seeded_draws_are_reproducible_and_batch_independent(rng):
    b, vocab = 9, 64
    logits = randn(rng, (b, vocab), scale=2.0)
    p = _random_params(rng, b, vocab)
    first = _run(logits, p)[0]
    assert np.array_equal(first, _run(logits, p)[0])
    for i in range(b):
        one = {k: (v[i:i + 1] if k not in ("pen_offsets", "pen_tokens", "pen_counts") else v)
               for k, v in p.items()}
        lo, hi = p["pen_offsets"][i], p["pen_offsets"][i + 1]
        one["pen_offsets"] = np.array([0, hi - lo], np.int32)
        one["pen_tokens"], one["pen_counts"] = p["pen_tokens"][lo:hi], p["pen_counts"][lo:hi]
        assert _run(logits[i:i + 1], one)[0][0] == first[i], f"row {i}"


def test_the_counter_selects_a_fresh_draw(rng):
    b, vocab = 32, 64
    logits = np.repeat(randn(rng, (1, vocab), scale=0.3), b, axis=0)  # high entropy
    p = _params(b, seeds=np.full(b, rng.integers(0, 2**63), np.uint64), counters=np.arange(b))
    draws = _run(logits, p)[0]
    next_draws = _run(logits, dict(p, counters=p["counters"] + b))[0]
    assert np.mean(draws != next_draws) > 0.5
    assert len(set(draws.tolist())) > b // 3, "one seed, consecutive counters: varied tokens"


CASES = [
    dict(temperature=0.7),
    dict(top_k=4),
    dict(top_p=0.6),
    dict(min_p=0.25),
    dict(temperature=1.5, top_k=6, top_p=0.9, min_p=0.05),
    dict(repetition_penalty=1.5, presence_penalty=0.7, frequency_penalty=0.4),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(c))
def test_empirical_frequencies_follow_the_kept_distribution(rng, case):
    vocab, draws = 12, 6000
    row = randn(rng, (vocab,), scale=1.5)
    pen_tokens = np.array([int(np.argmax(row)), 3], np.int32)
    pen_counts = np.array([2, 1], np.int32)
    scalar = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                  presence_penalty=0.0, frequency_penalty=0.0) | case
    penalised = any(k.endswith("penalty") for k in case)
    logits = np.repeat(row[None], draws, axis=0)
    p = _params(draws, **{k: np.full(draws, v) for k, v in scalar.items()},
                seeds=np.full(draws, rng.integers(0, 2**63), np.uint64),
                counters=np.arange(draws),
                pen_offsets=np.arange(draws + 1) * (2 if penalised else 0),
                pen_tokens=np.tile(pen_tokens, draws if penalised else 0),
                pen_counts=np.tile(pen_counts, draws if penalised else 0))
    tokens = _run(logits, p)[0]
    order, probs = ref.kept_distribution(row, *scalar.values(), pen_tokens if penalised else [],
                                         pen_counts if penalised else [])
    expect = np.zeros(vocab)
    expect[order] = probs
    freq = np.bincount(tokens, minlength=vocab) / draws
    assert set(np.nonzero(freq)[0]) <= set(order.tolist()), "drew a filtered token"
    bound = 5 * np.sqrt(expect * (1 - expect) / draws) + 2e-3
    assert np.all(np.abs(freq - expect) <= bound), (freq, expect)


def test_sample_checks(rng):
    logits = randn(rng, (2, 10))
    p = _params(2, pen_offsets=[0, 1, 1], pen_tokens=[10], pen_counts=[1])
    with pytest.raises(ValueError, match="pen_tokens outside"):
        _run(logits, p)
    with pytest.raises(TypeError, match="seeds must be uint64"):
        _run(logits, dict(_params(2), seeds=np.zeros(2, np.int64)))
    with pytest.raises(ValueError, match="top alternatives"):
        _run(logits, _params(2), n_top=11)
    with pytest.raises(ValueError, match="0 < top_p <= 1"):
        _run(logits, _params(2, top_p=[0.5, 0.0]))


def test_nan_row_still_yields_a_valid_token_id(rng):
    logits = randn(rng, (2, 30))
    logits[1] = np.nan
    tokens = _run(logits, _params(2, seeds=[3, 4]))[0]
    assert 0 <= tokens[1] < 30
