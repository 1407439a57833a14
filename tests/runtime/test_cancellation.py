"""Cancellation in every request state ends with a typed outcome and frees everything."""
from __future__ import annotations

import random

import pytest

from ninfer.runtime import (
    Engine, GenerationFailed, GenerationFinished, RequestCancelled,
)
from ninfer.runtime.record import RequestState

from .helpers import Spec, check_stream, drive, run_alone


def record_of(engine, handle):
    for rec in engine._core.settlement.open_records.values():
        if rec.request.request_id == handle.request_id:
            return rec
    return None


def step_until(engine, predicate, limit=2000):
    for _ in range(limit):
        if predicate():
            return
        engine.step()
    raise AssertionError("state never reached")


def _prompt(rng, n):
    return tuple(rng.randrange(64) for _ in range(n))


@pytest.mark.parametrize("state", ["waiting", "prefill", "decode", "paused", "resuming"])
def test_cancel_in_every_state(program_factory, state):
    rng = random.Random(hash(state) % 1000)
    older = Spec(_prompt(rng, 12), 40, seed=11)
    target = Spec(_prompt(rng, 20 if state in ("prefill", "resuming") else 12), 40, seed=12)
    # Tight KV (two requests cannot both reach full length) and no host snapshot memory, so the
    # younger request is paused as a Replay and resumes by re-executing its history.
    program = program_factory(kv_tokens=72, snapshots=0.0)
    initial = program.capacity()
    engine = Engine(program, max_concurrency=1 if state == "waiting" else 2, start_worker=False)
    h_old = engine.submit(older.build())
    if state == "prefill":
        h_old.cancel()  # leave the target alone, so it is in prefill after one step
    h = engine.submit(target.build())
    rec = record_of_after_intake(engine, h)
    if state == "waiting":
        step_until(engine, lambda: rec.state is RequestState.WAITING and record_of(engine, h_old)
                   is not None and record_of(engine, h_old).state is RequestState.RESIDENT)
    elif state == "prefill":
        step_until(engine, lambda: rec.state is RequestState.RESIDENT
                   and program.pending_prefill(rec.seq) > 0 and _ran(program, rec))
    elif state == "decode":
        step_until(engine, lambda: len(rec.token_ids) >= 2)
    elif state == "paused":
        step_until(engine, lambda: rec.state is RequestState.PAUSED)
    else:
        step_until(engine, lambda: rec.state is RequestState.RESIDENT
                   and engine._core.scheduler.protected is rec
                   and program.pending_prefill(rec.seq) > 0)
    tokens_before = tuple(rec.token_ids)
    h.cancel()
    drive(engine, [h, h_old])
    term = check_stream(h.poll())
    if state == "waiting":
        assert isinstance(term, GenerationFailed) and isinstance(term.error, RequestCancelled)
    else:
        assert isinstance(term, GenerationFinished) and term.result.finish_reason == "cancelled"
        assert term.result.token_ids == tokens_before
        full = run_alone(program_factory, target)
        assert full.token_ids[:len(tokens_before)] == tokens_before
    old_term = check_stream(h_old.poll())
    if state != "prefill":
        assert old_term.result.token_ids == run_alone(program_factory, older).token_ids
    snap = engine.metrics_snapshot()
    assert snap["outstanding"] == 0 and snap["counters"]["cancelled"] >= 1
    if state in ("paused", "resuming"):
        assert snap["pauses"]["replay"] >= 1
    if state == "resuming":
        assert snap["resumes"]["replay"] >= 1
    assert program.capacity() == initial
    if hasattr(program, "live_sequences"):
        assert program.live_sequences() == 0


def record_of_after_intake(engine, handle):
    """Intake happens on the worker's first cycle; hold on to the record from then on."""
    engine.step()
    rec = record_of(engine, handle)
    assert rec is not None
    return rec


def _ran(program, rec) -> bool:
    return program.pending_prefill(rec.seq) < len(rec.request.prompt_token_ids) - 1
