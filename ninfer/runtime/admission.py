"""Admission: intake of submitted requests and fresh admission into resident lanes.

Intake opens the request's logical sequence (no physical resources) right away, so a request
the Program cannot represent is rejected within one worker cycle instead of after its queue
wait. The generation budget is max_tokens clipped to the context limit: the Program's
max_context_len, or all KV pages when those hold fewer tokens (the request then ends with
"length" there rather than failing later). Fresh admission runs on events only (a new request, freed capacity), never because decode
advanced, and admits with what the residents' permits left: a request is admitted when its
first unit's pages plus one page of growth headroom per resident fit, and a slot is free.
"""
from __future__ import annotations

from typing import Callable

from ninfer.errors import InvalidInput
from ninfer.runtime.contract import Program
from ninfer.runtime.errors import RequestRejected
from ninfer.runtime.events import GenerationStart
from ninfer.runtime.metrics import EngineMetrics
from ninfer.runtime.record import RequestRecord
from ninfer.runtime.scheduler import Scheduler


class Admission:
    def __init__(self, program: Program, scheduler: Scheduler, metrics: EngineMetrics,
                 clock: Callable[[], float]):
        self._program = program
        self._sched = scheduler
        self._metrics = metrics
        self._clock = clock
        lim = program.limits
        # A sequence can never hold more than all KV pages: that is its context limit too.
        self._context_limit = min(lim.max_context_len, lim.total_pages * lim.page_size)
        self._kv_tokens = lim.total_pages * lim.page_size

    def intake(self, rec: RequestRecord) -> RequestRejected | None:
        """Open `rec`'s sequence and queue it; return the rejection when it cannot be served."""
        try:
            rec.seq = self._program.open_sequence(rec.request.prompt_token_ids, rec.sampling)
        except InvalidInput as exc:
            return RequestRejected(str(exc), param=exc.param)
        if rec.prompt_len + 1 > self._context_limit:
            self._program.release(rec.seq)
            rec.seq = None
            return RequestRejected(
                f"a prompt of {rec.prompt_len} tokens does not fit the engine's KV capacity "
                f"({self._kv_tokens} tokens)", param="prompt")
        rec.budget = min(rec.request.max_tokens, self._context_limit - rec.prompt_len)
        self._sched.enqueue(rec)
        return None

    def admit_fresh(self) -> list[RequestRecord]:
        """Bounded scan of the waiting queue; returns the requests admitted (each holds the
        permit for its first unit)."""
        admitted: list[RequestRecord] = []
        blocked: list[RequestRecord] = []
        for rec in self._sched.admission_candidates():
            if len(self._sched.residents) >= self._sched.max_concurrency:
                break
            if self._try_admit(rec):
                admitted.append(rec)
                for older in blocked:
                    older.bypassed += 1
            else:
                blocked.append(rec)
        return admitted

    def _try_admit(self, rec: RequestRecord) -> bool:
        n = self._program.next_unit_tokens(rec.seq)
        cap = self._program.capacity()
        headroom = len(self._sched.residents)
        pages = self._program.pages_needed(rec.seq, n)
        if cap.free_slots == 0 or pages + headroom > cap.free_pages:
            return False
        if not self._program.reserve_units(rec.seq, n):
            return False
        now = self._clock()
        rec.admitted_at = now
        self._sched.admit(rec)
        self._metrics.inc("admitted")
        self._metrics.inc("prompt_tokens", rec.prompt_len)
        rec.channel.publish(GenerationStart(rec.request.request_id, rec.prompt_len))
        return True
