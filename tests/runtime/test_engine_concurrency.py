"""Batch invariance and pressure: a request's tokens do not depend on what else runs."""
from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from ninfer.runtime import Engine, GenerationFinished

from .helpers import ProbeProgram, check_stream, collect, drive, random_specs, run_alone


def _vocab(program_factory) -> int:
    return program_factory().limits.vocab_size


@pytest.mark.parametrize("seeded", [False, True], ids=["greedy", "seeded"])
def test_eight_concurrent_match_alone(program_factory, seeded):
    rng = random.Random(1234 + seeded)
    specs = random_specs(rng, 8, _vocab(program_factory), seeded=seeded, prompt_len=(1, 12),
                         max_tokens=(12, 30))
    alone = [run_alone(program_factory, s) for s in specs]
    # A short delay per step keeps the eight submitting threads ahead of the worker.
    engine = Engine(ProbeProgram(program_factory(), run_delay_s=0.002), max_concurrency=8)
    try:
        with ThreadPoolExecutor(8) as pool:  # submit from eight threads at once
            handles = list(pool.map(lambda s: engine.submit(s.build()), specs))
        results = [collect(h)[1] for h in handles]
    finally:
        engine.shutdown()
    for spec, ref, term in zip(specs, alone, results):
        assert isinstance(term, GenerationFinished), term
        assert term.result.token_ids == ref.token_ids
        assert term.result.logprobs == ref.logprobs
        assert term.result.finish_reason == "length"
        assert term.result.completion_tokens == spec.max_tokens
    snap = engine.metrics_snapshot()
    batch_hist = snap["histograms"]["decode_batch_size"]
    assert max(i + 1 for i, c in enumerate(batch_hist["counts"]) if c) >= 4, batch_hist
    assert snap["counters"]["finished_length"] == 8 and snap["outstanding"] == 0


def test_pressure_pauses_both_kinds_and_matches(program_factory):
    """KV for ~2.5 requests, host memory for ~1 snapshot, 8 requests: both pause kinds happen,
    every request completes with exactly its unpressured tokens and deltas."""
    rng = random.Random(99)
    specs = random_specs(rng, 8, _vocab(program_factory), prompt_len=(10, 24),
                         max_tokens=(20, 32), seeded=True)
    alone = [run_alone(program_factory, s) for s in specs]
    longest = max(len(s.prompt) + s.max_tokens for s in specs)
    budget = dict(kv_tokens=int(2.5 * longest), snapshots=1.0)
    program = program_factory(**budget)
    initial = program.capacity()
    engine = Engine(program, max_concurrency=8, start_worker=False)
    handles = [engine.submit(s.build()) for s in specs]
    drive(engine, handles)
    for h, ref in zip(handles, alone):
        term = check_stream(h.poll())
        assert isinstance(term, GenerationFinished), term
        assert term.result.token_ids == ref.token_ids
        assert term.result.logprobs == ref.logprobs
    snap = engine.metrics_snapshot()
    assert snap["pauses"]["snapshot"] >= 1 and snap["pauses"]["replay"] >= 1, snap["pauses"]
    assert snap["resumes"]["snapshot"] >= 1 and snap["resumes"]["replay"] >= 1, snap["resumes"]
    assert snap["outstanding"] == 0 and snap["resident"] == 0 and snap["paused"] == 0
    assert snap["kv_pages"]["free"] == initial.free_pages
    assert program.capacity() == initial


def test_pressure_threaded_matches(program_factory):
    """The same under the real worker thread (arrival timing varies; outputs may not)."""
    rng = random.Random(7)
    specs = random_specs(rng, 8, _vocab(program_factory), prompt_len=(8, 20),
                         max_tokens=(16, 28), seeded=True)
    alone = [run_alone(program_factory, s) for s in specs]
    longest = max(len(s.prompt) + s.max_tokens for s in specs)
    program = program_factory(kv_tokens=int(2.5 * longest), snapshots=1.0)
    initial = program.capacity()
    engine = Engine(program, max_concurrency=8)
    handles = [engine.submit(s.build()) for s in specs]
    results = [collect(h)[1] for h in handles]
    engine.shutdown()
    assert [r.result.token_ids for r in results] == [a.token_ids for a in alone]
    assert program.capacity() == initial
    assert sum(engine.metrics_snapshot()["pauses"].values()) >= 1


def test_device_snapshots_are_revoked_under_pressure():
    """Paused Snapshots that keep device pages are revoked (-> Replay) before a resident is
    paused, and the revoked requests still finish with their unpressured tokens."""
    from .conftest import make_fake_program

    def factory(**kw):
        return make_fake_program(snapshot_location="device", **kw)

    rng = random.Random(5)
    specs = random_specs(rng, 6, 64, prompt_len=(10, 20), max_tokens=(20, 30), seeded=True)
    alone = [run_alone(factory, s) for s in specs]
    longest = max(len(s.prompt) + s.max_tokens for s in specs)
    program = factory(kv_tokens=int(2.5 * longest))
    engine = Engine(program, max_concurrency=6, start_worker=False)
    handles = [engine.submit(s.build()) for s in specs]
    drive(engine, handles)
    assert [check_stream(h.poll()).result.token_ids for h in handles] == \
        [a.token_ids for a in alone]
    snap = engine.metrics_snapshot()
    assert snap["counters"]["snapshot_revocations"] >= 1, snap["counters"]
    assert program.live_sequences() == 0
    program.check_integrity()
    assert program.capacity().free_pages == program.limits.total_pages
