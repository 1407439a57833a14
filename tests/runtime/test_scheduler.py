"""Request lifecycle table and the Scheduler's ordering rules, on bare records."""
from __future__ import annotations

import itertools

import pytest

from ninfer.runtime import GenerationRequest
from ninfer.runtime.contract import SamplingParams
from ninfer.runtime.contract.output import TokenOutputSession
from ninfer.runtime.handle import ResponseChannel
from ninfer.runtime.record import (
    ALLOWED_TRANSITIONS, InvariantViolation, RequestRecord, RequestState,
)
from ninfer.runtime.scheduler import Scheduler


def make_record(ticket: int) -> RequestRecord:
    request = GenerationRequest((1, 2, 3), max_tokens=4)
    return RequestRecord(ticket, request, ResponseChannel(request.request_id, lambda: None, None),
                         TokenOutputSession(), SamplingParams(seed=1), 0.0, None, None)


def test_every_transition_is_checked():
    for src, dst in itertools.product(RequestState, RequestState):
        rec = make_record(0)
        rec.state = src
        if dst in ALLOWED_TRANSITIONS[src]:
            rec.transition(dst)
            assert rec.state is dst
        else:
            with pytest.raises(InvariantViolation):
                rec.transition(dst)
    assert ALLOWED_TRANSITIONS[RequestState.FINISHED] == frozenset()


def _resident_scheduler(n: int, max_concurrency: int = 8) -> tuple[Scheduler, list]:
    s = Scheduler(max_concurrency)
    recs = [make_record(t) for t in range(n)]
    for r in recs:
        s.enqueue(r)
    for r in recs:
        s.admit(r)
    return s, recs


def test_permits_resume_first_then_ticket_order_and_victims_youngest_first():
    s, (a, b, c, d) = _resident_scheduler(4)
    s.pause(b)
    s.pause(d)
    assert s.oldest_paused() is b
    s.resume(d)  # protected, although younger than c
    assert s.permit_order() == [d, a, c]
    assert s.victims(a.ticket) == [c]  # never the protected resume
    with pytest.raises(InvariantViolation):
        s.pause(d)
    with pytest.raises(InvariantViolation):
        s.resume(b)  # one protected resume at a time
    s.end_protection(d)
    assert s.victims(a.ticket) == [d, c] and s.victims(d.ticket) == []
    assert s.has_older_resident(b.ticket) and not s.has_older_resident(a.ticket)


def test_chunk_rotation_is_fair():
    s, recs = _resident_scheduler(3)
    served = []
    for _ in range(6):
        rec = s.chunk_order(recs)[0]
        s.chunk_ran(rec)
        served.append(rec.ticket)
    assert served == [0, 1, 2, 0, 1, 2]
    s.pause(recs[2])
    s.resume(recs[2])
    assert s.chunk_order(recs)[0] is recs[2]  # the protected resume gets the chunk first


def test_admission_bypass_is_bounded():
    s = Scheduler(4, scan_limit=3, max_bypass=2)
    recs = [make_record(t) for t in range(5)]
    for r in recs:
        s.enqueue(r)
    assert list(s.admission_candidates()) == recs[:3]  # bounded scan
    recs[0].bypassed = 2
    assert list(s.admission_candidates()) == recs[:1]  # nothing may pass it any more
    s.admit(recs[0])
    assert list(s.admission_candidates()) == recs[1:4]


def test_admission_respects_max_concurrency():
    s, recs = _resident_scheduler(2, max_concurrency=2)
    extra = make_record(9)
    s.enqueue(extra)
    with pytest.raises(InvariantViolation):
        s.admit(extra)
    s.remove(recs[0])
    assert recs[0].state is RequestState.FINISHED
    s.admit(extra)
    assert [r.ticket for r in s.residents] == [1, 9]
