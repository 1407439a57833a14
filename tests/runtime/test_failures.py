"""Engine failure, shutdown, and a failing output session (request-level)."""
from __future__ import annotations

import dataclasses
import random

import pytest

from ninfer.runtime import (
    EngineFailed, EngineShutdown, EngineStatus, Engine, GenerationFailed, GenerationFinished,
    GenerationStart, RequestFailed,
)
from ninfer.runtime.contract.output import TokenOutputSession

from .helpers import ProbeProgram, Spec, check_stream, collect, drive, random_specs, run_alone


def test_program_failure_fails_every_request(program_factory):
    rng = random.Random(10)
    specs = random_specs(rng, 5, program_factory().limits.vocab_size, max_tokens=(10, 20))
    engine = Engine(ProbeProgram(program_factory(), fail_at_run=4), max_concurrency=2)
    handles = [engine.submit(s.build()) for s in specs]
    terms = [collect(h)[1] for h in handles]
    assert all(isinstance(t, GenerationFailed) and isinstance(t.error, EngineFailed)
               for t in terms), terms
    assert "injected Program failure" in str(terms[0].error)
    assert any(t.error.partial is not None for t in terms)  # started ones carry their output
    assert engine.status is EngineStatus.FAILED
    late = engine.submit(specs[0].build())
    with pytest.raises(EngineFailed):
        late.wait(0)
    assert engine.outstanding == 0
    assert engine.metrics_snapshot()["engine_status"] == "failed"
    engine.shutdown()


def test_shutdown_ends_everything(program_factory):
    rng = random.Random(11)
    specs = random_specs(rng, 6, program_factory().limits.vocab_size, max_tokens=(40, 50))
    program = program_factory()
    initial = program.capacity()
    engine = Engine(ProbeProgram(program, run_delay_s=0.01), max_concurrency=2)
    handles = [engine.submit(s.build()) for s in specs]
    handles[0].next_event(10)  # GenerationStart: the worker is running requests
    engine.shutdown(wait=True)
    for i, h in enumerate(handles):
        term = check_stream(([GenerationStart("", 0)] if i == 0 else []) + h.poll())
        assert isinstance(term, GenerationFailed) and isinstance(term.error, EngineShutdown)
    assert isinstance(check_stream(engine.submit(specs[0].build()).poll()).error, EngineShutdown)
    assert program.capacity() == initial and engine.outstanding == 0


class _FailingSession(TokenOutputSession):
    def __init__(self, fail_on_preview: int):
        super().__init__()
        self._calls = 0
        self._fail_on = fail_on_preview

    def preview(self, token_ids, logprobs):
        self._calls += 1
        if self._calls == self._fail_on:
            raise ValueError("boom")
        return super().preview(token_ids, logprobs)


def test_session_failure_ends_only_its_request(program_factory):
    """The batch is aborted (its rows Replay) and the other requests' tokens are unchanged."""
    rng = random.Random(12)
    specs = random_specs(rng, 3, program_factory().limits.vocab_size, max_tokens=(12, 16),
                         seeded=True)
    alone = [run_alone(program_factory, s) for s in specs]
    bad = Spec(specs[0].prompt, 12, seed=1)
    program = program_factory()
    initial = program.capacity()
    engine = Engine(program, max_concurrency=4, start_worker=False)
    handles = [engine.submit(s.build()) for s in specs]
    request = bad.build()
    h_bad = engine.submit(dataclasses.replace(request, session=_FailingSession(3)))
    drive(engine, handles + [h_bad])
    term = check_stream(h_bad.poll())
    assert isinstance(term, GenerationFailed) and isinstance(term.error, RequestFailed)
    assert term.error.partial.completion_tokens == 2
    for h, ref in zip(handles, alone):
        result = check_stream(h.poll())
        assert isinstance(result, GenerationFinished)
        assert result.result.token_ids == ref.token_ids
    snap = engine.metrics_snapshot()
    assert snap["counters"]["aborted_batches"] == 1 and snap["counters"]["failed"] == 1
    assert program.capacity() == initial
