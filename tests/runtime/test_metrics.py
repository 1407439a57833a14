"""Metrics: fixed buckets, aggregate-only snapshot, counters consistent with what happened."""
from __future__ import annotations

import random

import pytest

from ninfer.runtime import Engine
from ninfer.runtime.metrics import COUNTERS, EngineMetrics, Histogram

from .helpers import check_stream, drive, random_specs


def test_histogram_buckets():
    h = Histogram((1.0, 2.0, 5.0))
    for v in (0.5, 1.0, 1.5, 5.0, 7.0, 9.0):
        h.observe(v)
    snap = h.snapshot()
    assert snap["counts"] == [2, 1, 1, 2] and snap["count"] == 6
    assert snap["sum"] == pytest.approx(24.0)


def test_unknown_names_are_errors():
    m = EngineMetrics(4)
    with pytest.raises(KeyError):
        m.inc("no_such_counter")
    with pytest.raises(KeyError):
        m.set_gauges(no_such_gauge=1)


def test_snapshot_after_a_run(program_factory):
    rng = random.Random(21)
    specs = random_specs(rng, 5, program_factory().limits.vocab_size, max_tokens=(3, 9))
    program = program_factory()
    engine = Engine(program, max_concurrency=3, start_worker=False)
    handles = [engine.submit(s.build()) for s in specs]
    drive(engine, handles)
    results = [check_stream(h.poll()).result for h in handles]
    snap = engine.metrics_snapshot()
    c = snap["counters"]
    assert set(c) == set(COUNTERS)
    assert c["submitted"] == c["admitted"] == c["finished_length"] == 5
    assert c["prompt_tokens"] == sum(len(s.prompt) for s in specs)
    assert c["generation_tokens"] == sum(r.completion_tokens for r in results) == c["decode_rows"]
    h = snap["histograms"]
    assert h["ttft_s"]["count"] == 5
    assert h["itl_s"]["count"] == c["generation_tokens"] - 5
    assert h["decode_batch_size"]["sum"] == c["decode_rows"]
    assert h["decode_batch_size"]["bounds"] == [1.0, 2.0, 3.0]
    assert snap["kv_pages"]["used"] == 0 and snap["slots"]["used"] == 0
    assert snap["queue_depth"] == snap["resident"] == snap["paused"] == snap["outstanding"] == 0
    assert snap["engine_status"] == "running" and snap["max_outstanding"] == 3 + 64
    text = repr(snap)
    assert all(str(s.prompt) not in text for s in specs)  # aggregate only, no request content
