"""Scheduler: execution membership and fairness rules (engine worker only).

It owns the waiting queue (submission order), the resident lanes and the paused queue, and
answers ordering questions; it never calls the Program. Rules:

- Unit permits go to the protected resume first, then residents in ticket (submission) order.
- Prefill/Replay chunks rotate among residents that need one (the protected resume first), so a
  long prompt cannot starve the others' prompts.
- Pressure victims are the youngest residents younger than the one in need, never the protected
  resume: an older request never loses its state to a younger one or to a trial resume.
- Resume tries the oldest paused request; at most one resume is protected at a time.
- Fresh admission scans at most `scan_limit` waiting requests; a request may be bypassed by
  younger ones at most `max_bypass` times, after which nothing younger is admitted before it.
"""
from __future__ import annotations

import bisect
from collections import deque
from typing import Iterable, Iterator

from ninfer.runtime.record import InvariantViolation, RequestRecord, RequestState


def _ticket(rec: RequestRecord) -> int:
    return rec.ticket


class Scheduler:
    def __init__(self, max_concurrency: int, *, scan_limit: int = 8, max_bypass: int = 8):
        self.max_concurrency = max_concurrency
        self.scan_limit = scan_limit
        self.max_bypass = max_bypass
        self.waiting: deque[RequestRecord] = deque()
        self.residents: list[RequestRecord] = []  # sorted by ticket
        self.paused: list[RequestRecord] = []  # sorted by ticket (oldest first)
        self.protected: RequestRecord | None = None
        self._last_chunk_ticket = -1  # prefill rotation cursor

    # --- membership changes --------------------------------------------------------------------
    def enqueue(self, rec: RequestRecord) -> None:
        self.waiting.append(rec)

    def admit(self, rec: RequestRecord) -> None:
        if len(self.residents) >= self.max_concurrency:
            raise InvariantViolation("admission beyond max_concurrency")
        self.waiting.remove(rec)
        rec.transition(RequestState.RESIDENT)
        bisect.insort(self.residents, rec, key=_ticket)

    def pause(self, rec: RequestRecord) -> None:
        if rec is self.protected:
            raise InvariantViolation("the protected resume cannot be paused")
        self.residents.remove(rec)
        rec.transition(RequestState.PAUSED)
        bisect.insort(self.paused, rec, key=_ticket)

    def resume(self, rec: RequestRecord) -> None:
        if self.protected is not None:
            raise InvariantViolation("a second protected resume")
        self.paused.remove(rec)
        rec.transition(RequestState.RESIDENT)
        bisect.insort(self.residents, rec, key=_ticket)
        self.protected = rec

    def end_protection(self, rec: RequestRecord) -> None:
        if self.protected is rec:
            self.protected = None

    def remove(self, rec: RequestRecord) -> None:
        """Take a record out of whichever queue holds it (it is ending)."""
        {RequestState.WAITING: self.waiting, RequestState.RESIDENT: self.residents,
         RequestState.PAUSED: self.paused}[rec.state].remove(rec)
        self.end_protection(rec)
        rec.transition(RequestState.FINISHED)

    # --- ordering questions ----------------------------------------------------------------
    def live(self) -> Iterator[RequestRecord]:
        yield from self.waiting
        yield from self.residents
        yield from self.paused

    def permit_order(self) -> list[RequestRecord]:
        first = [self.protected] if self.protected is not None else []
        return first + [r for r in self.residents if r is not self.protected]

    def chunk_order(self, candidates: Iterable[RequestRecord]) -> list[RequestRecord]:
        """Residents needing prefill, in the order they should be offered this step's chunk."""
        cands = sorted(candidates, key=_ticket)
        first = [r for r in cands if r is self.protected]
        rest = [r for r in cands if r is not self.protected]
        after = [r for r in rest if r.ticket > self._last_chunk_ticket]
        return first + after + [r for r in rest if r.ticket <= self._last_chunk_ticket]

    def chunk_ran(self, rec: RequestRecord) -> None:
        if rec is not self.protected:
            self._last_chunk_ticket = rec.ticket

    def victims(self, ticket: int) -> list[RequestRecord]:
        """Residents that may be paused to make room for request `ticket`: youngest first."""
        return [r for r in reversed(self.residents)
                if r.ticket > ticket and r is not self.protected]

    def oldest_paused(self) -> RequestRecord | None:
        return self.paused[0] if self.paused else None

    def has_older_resident(self, ticket: int) -> bool:
        return bool(self.residents) and self.residents[0].ticket < ticket

    def admission_candidates(self) -> Iterator[RequestRecord]:
        """Waiting requests fresh admission may try now, oldest first (bounded bypass)."""
        for rec in list(self.waiting)[: self.scan_limit]:
            yield rec
            if rec.state is RequestState.WAITING and rec.bypassed >= self.max_bypass:
                return  # it was not admitted and may not be bypassed any more
