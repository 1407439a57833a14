"""Overload, deadlines, queue timeout, outstanding capacity and request-level rejections."""
from __future__ import annotations

import dataclasses
import gc
import random

import pytest

from ninfer.errors import InvalidInput
from ninfer.runtime import (
    DeadlineExceeded, Engine, GenerationFailed, GenerationFinished, GenerationRequest, Overloaded,
    QueueTimeout, RequestCancelled, RequestRejected,
)
from ninfer.runtime.contract import SamplingParams

from .helpers import FakeClock, ProbeProgram, Spec, check_stream, drive, run_alone


def _spec(rng, prompt_len=6, max_tokens=12, **kw) -> Spec:
    return Spec(tuple(rng.randrange(64) for _ in range(prompt_len)), max_tokens, **kw)


def test_queue_full_is_overloaded(program_factory):
    rng = random.Random(1)
    engine = Engine(program_factory(), max_concurrency=1, max_queue=1, start_worker=False)
    accepted = [engine.submit(_spec(rng).build()) for _ in range(2)]
    refused = engine.submit(_spec(rng).build())
    assert refused.done and engine.outstanding == 2
    with pytest.raises(Overloaded) as info:
        refused.wait(0)
    assert info.value.retry_after_s > 0
    assert engine.metrics_snapshot()["counters"]["overloaded"] == 1
    drive(engine, accepted)
    assert engine.outstanding == 2  # ended, but the consumers have not released them yet
    for h in accepted:
        assert isinstance(check_stream(h.poll()), GenerationFinished)
    assert engine.outstanding == 0
    again = engine.submit(_spec(rng).build())
    drive(engine, [again])
    assert again.wait(0).finish_reason == "length"


def test_deadline_in_queue_and_while_running(program_factory):
    rng = random.Random(2)
    clock = FakeClock()
    program = program_factory()
    initial = program.capacity()
    engine = Engine(program, max_concurrency=1, start_worker=False, clock=clock)
    running = _spec(rng, max_tokens=30, timeout_s=5.0)
    h_run = engine.submit(running.build())
    h_queued = engine.submit(_spec(rng, timeout_s=5.0).build())
    for _ in range(4):
        engine.step()
    clock.advance(6.0)
    engine.step()
    queued = check_stream(h_queued.poll())
    assert isinstance(queued, GenerationFailed) and isinstance(queued.error, DeadlineExceeded)
    assert queued.error.partial is None  # never started: no GenerationStart either
    ran = check_stream(h_run.poll())
    assert isinstance(ran, GenerationFailed) and isinstance(ran.error, DeadlineExceeded)
    partial = ran.error.partial
    assert partial.finish_reason == "deadline" and 1 <= partial.completion_tokens < 30
    reference = run_alone(program_factory, dataclasses.replace(running, timeout_s=None))
    assert reference.token_ids[:partial.completion_tokens] == \
        partial.token_ids
    snap = engine.metrics_snapshot()
    assert snap["counters"]["expired_deadline"] == 2 and snap["outstanding"] == 0
    assert program.capacity() == initial  # permits returned


def test_queue_timeout_applies_only_before_admission(program_factory):
    rng = random.Random(3)
    clock = FakeClock()
    engine = Engine(program_factory(), max_concurrency=1, start_worker=False, clock=clock)
    h_first = engine.submit(_spec(rng, max_tokens=20, queue_timeout_s=2.0).build())
    h_second = engine.submit(_spec(rng, queue_timeout_s=2.0).build())
    engine.step()
    clock.advance(3.0)
    drive(engine, [h_first, h_second])
    assert check_stream(h_first.poll()).result.finish_reason == "length"
    second = check_stream(h_second.poll())
    assert isinstance(second, GenerationFailed) and isinstance(second.error, QueueTimeout)
    assert engine.metrics_snapshot()["counters"]["expired_queue"] == 1


def test_deadline_threaded(program_factory):
    rng = random.Random(4)
    program = program_factory()
    initial = program.capacity()
    engine = Engine(ProbeProgram(program, run_delay_s=0.005), max_concurrency=2)
    h = engine.submit(_spec(rng, max_tokens=50, timeout_s=0.1).build())
    with pytest.raises(DeadlineExceeded):
        h.wait(10)
    engine.shutdown()
    assert engine.outstanding == 0
    assert program.capacity() == initial


def test_abandon_releases_capacity_once(program_factory):
    rng = random.Random(5)
    engine = Engine(program_factory(), max_concurrency=1, max_queue=2, start_worker=False)
    h_run = engine.submit(_spec(rng, max_tokens=20).build())
    h_wait = engine.submit(_spec(rng).build())
    h_done = engine.submit(_spec(rng, max_tokens=2).build())
    engine.step()
    assert engine.outstanding == 3
    h_run.abandon()
    h_wait.abandon()
    h_wait.abandon()  # idempotent
    assert engine.outstanding == 3  # capacity returns only once the worker ended them
    drive(engine, [h_run, h_wait, h_done])
    assert engine.outstanding == 1  # h_done ended but its consumer has not released it
    h_done.wait(0)
    h_done.abandon()
    h_done.wait(0)
    assert engine.outstanding == 0
    assert check_stream(h_run.poll()).result.finish_reason == "cancelled"
    waited = check_stream(h_wait.poll())
    assert isinstance(waited.error, RequestCancelled)
    assert engine.metrics_snapshot()["counters"]["cancelled"] == 2


def test_dropped_handle_is_abandoned(program_factory):
    rng = random.Random(6)
    engine = Engine(program_factory(), max_concurrency=1, start_worker=False)
    engine.submit(_spec(rng, max_tokens=20).build())  # handle dropped at once
    gc.collect()
    for _ in range(50):
        engine.step()
    assert engine.outstanding == 0
    assert engine.metrics_snapshot()["counters"]["cancelled"] == 1


def test_request_level_rejections(program_factory):
    program = program_factory(kv_tokens=32)
    lim = program.limits
    engine = Engine(program, max_concurrency=2, start_worker=False)
    bad_id = engine.submit(GenerationRequest((1, lim.vocab_size), max_tokens=4))
    too_long = engine.submit(GenerationRequest((1,) * lim.max_context_len, max_tokens=4))
    over_kv = engine.submit(GenerationRequest((1,) * min(40, lim.max_context_len - 1),
                                              max_tokens=4))
    ok = engine.submit(GenerationRequest((1, 2, 3), SamplingParams(temperature=0), 4))
    drive(engine, [bad_id, too_long, over_kv, ok])
    for h in (bad_id, too_long, over_kv):
        term = check_stream(h.poll())
        assert isinstance(term, GenerationFailed) and isinstance(term.error, RequestRejected)
        assert term.error.param == "prompt"
    assert check_stream(ok.poll()).result.completion_tokens == 4
    assert engine.metrics_snapshot()["counters"]["rejected"] == 3
    with pytest.raises(InvalidInput):
        GenerationRequest((1, 2), max_tokens=0)
    with pytest.raises(InvalidInput):
        GenerationRequest(())
    with pytest.raises(InvalidInput):
        Engine(program_factory(), max_concurrency=9)


def test_stop_token_and_context_limit(program_factory):
    rng = random.Random(8)
    program = program_factory()
    lim = program.limits
    spec = _spec(rng, max_tokens=40, seed=3)
    ref = run_alone(program_factory, spec)
    stop_at = ref.token_ids[5]
    stopping = Spec(spec.prompt, 40, seed=3, stop_ids=(stop_at,))
    capped = _spec(rng, prompt_len=lim.max_context_len - 5, max_tokens=1000)
    engine = Engine(program, max_concurrency=2, start_worker=False)
    h_stop, h_cap = engine.submit(stopping.build()), engine.submit(capped.build())
    drive(engine, [h_stop, h_cap])
    stopped = check_stream(h_stop.poll()).result
    first = ref.token_ids.index(stop_at)
    assert stopped.finish_reason == "stop" and stopped.token_ids == ref.token_ids[:first + 1]
    capped_result = check_stream(h_cap.poll()).result
    assert capped_result.finish_reason == "length" and capped_result.completion_tokens == 5



def test_stranded_request_is_rejected_not_hung(program_factory):
    """A Program whose pages run out before its advertised capacity: the lone request that
    cannot get its next unit ends with RequestRejected (with its partial output); no stall."""
    program = program_factory(kv_tokens=32)
    lim = program.limits
    probe = ProbeProgram(program, limits=dataclasses.replace(lim, total_pages=lim.total_pages * 4))
    engine = Engine(probe, max_concurrency=1, start_worker=False)
    h = engine.submit(GenerationRequest((1, 2, 3), SamplingParams(temperature=0), 60))
    drive(engine, [h])
    term = check_stream(h.poll())
    assert isinstance(term, GenerationFailed) and isinstance(term.error, RequestRejected)
    assert term.error.partial.completion_tokens == 32 - 3 + 1  # last token needs no KV
    assert program.capacity().free_pages == lim.total_pages
