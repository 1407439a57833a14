"""EngineCore: the worker cycle (engine worker thread only).

One cycle (seed order). Program calls are synchronous here, so a resource transaction (resume,
pause, revocation, release) completes inside the call that starts it; none spans cycles.
1. intake of newly submitted requests (opened with the Program, or rejected);
2. cancellation, deadline and queue-timeout processing at this boundary (terminal settlement
   returns resources before the end is published);
3. on a capacity event, the oldest paused request's full resume (at most one protected resume);
4. unit permits row by row (the protected resume first, then ticket order);
5. fresh admission with what remains (on events only, bounded scan);
6. ONE `Program.run` (compact decode batch + at most one prefill/Replay chunk), then
   preview -> commit -> publish -> settlement (see `step.py`).

Anything that breaks an engine invariant or fails inside the Program propagates out of
`cycle()`; the Engine then calls `fail_all`, which ends every outstanding request with
EngineFailed. Request-level problems (rejections, a session that raises) end one request.
"""
from __future__ import annotations

from typing import Callable

from ninfer.runtime.admission import Admission
from ninfer.runtime.contract import Program
from ninfer.runtime.errors import GenerationError, RequestRejected
from ninfer.runtime.metrics import EngineMetrics
from ninfer.runtime.pressure import PressurePolicy
from ninfer.runtime.record import RequestRecord
from ninfer.runtime.scheduler import Scheduler
from ninfer.runtime.settlement import Settlement
from ninfer.runtime.step import StepRunner


class EngineCore:
    def __init__(self, program: Program, *, max_concurrency: int, metrics: EngineMetrics,
                 clock: Callable[[], float], scan_limit: int = 8, max_bypass: int = 8):
        self.program = program
        self.metrics = metrics
        self.clock = clock
        self.scheduler = Scheduler(max_concurrency, scan_limit=scan_limit, max_bypass=max_bypass)
        self.settlement = Settlement(program, self.scheduler, metrics, clock)
        self.pressure = PressurePolicy(program, self.scheduler, metrics)
        self.admission = Admission(program, self.scheduler, metrics, clock)
        self.steps = StepRunner(program, self.scheduler, self.pressure, self.settlement,
                                metrics, clock)
        self._arrivals: list[RequestRecord] = []  # handed over, not yet taken in
        self._admission_event = False

    def cycle(self, arrivals: list[RequestRecord]) -> bool:
        """Run one worker cycle. Returns False when nothing changed (idle until an event)."""
        sched = self.scheduler
        self._arrivals.extend(arrivals)
        changed = bool(self._arrivals)
        while self._arrivals:
            rec = self._arrivals.pop(0)
            self.settlement.open_records[rec.ticket] = rec
            rejection = self.admission.intake(rec)
            if rejection is not None:
                self.settlement.publish_failure(rec, rejection)
            self._admission_event = True

        now = self.clock()
        for rec in list(sched.live()):
            why = self.settlement.due_end(rec, now)
            if why is not None:
                self.settlement.end_due(rec, why)
                changed = True

        resume_event = self.settlement.capacity_event
        if resume_event:
            self.settlement.capacity_event = False
            self._admission_event = True
        if sched.paused and sched.protected is None and (resume_event or not sched.residents):
            if self.pressure.try_resume() is not None:
                changed = True
            elif not sched.residents:  # nothing will ever free room for it
                self.settlement.fail(sched.oldest_paused(), RequestRejected(
                    "the paused request no longer fits the engine's KV capacity"))
                changed = True

        actions_before = self.pressure.actions
        decode, chunk = self.steps.take_permits()
        admitted = []
        if self._admission_event:  # with what the residents' permits left
            self._admission_event = False
            admitted = self.admission.admit_fresh()
        planned = self.steps.build_plan(decode, chunk, admitted)
        if planned is not None:
            self.steps.execute(*planned)
            changed = True
        # Ends and pauses while taking permits (a stranded request, a pressure victim) are
        # changes too; a capacity event they raised must get the next cycle.
        changed = (changed or bool(admitted) or self.pressure.actions != actions_before
                   or self.settlement.capacity_event)
        if changed:
            self.update_gauges()
        return changed

    def next_timer(self) -> float | None:
        """Seconds until the nearest deadline or queue timeout of a live request (None: none)."""
        times = []
        for rec in self.scheduler.live():
            if rec.deadline is not None:
                times.append(rec.deadline)
            if rec.queue_deadline is not None and not rec.started:
                times.append(rec.queue_deadline)
        return max(0.0, min(times) - self.clock()) if times else None

    def update_gauges(self) -> None:
        cap = self.program.capacity()
        s = self.scheduler
        self.metrics.set_gauges(
            queue_depth=len(s.waiting), resident=len(s.residents), paused=len(s.paused),
            kv_pages_used=cap.total_pages - cap.free_pages, kv_pages_free=cap.free_pages,
            slots_used=cap.total_slots - cap.free_slots, slots_free=cap.free_slots,
            host_snapshot_bytes_used=cap.host_snapshot_bytes_total - cap.host_snapshot_bytes_free,
            host_snapshot_bytes_free=cap.host_snapshot_bytes_free)

    def close(self, make_error: Callable[[], GenerationError],
              arrivals: list[RequestRecord]) -> None:
        """End every outstanding request with `make_error()` (shutdown or engine failure).

        Pending model work is aborted and resources are returned first, so that a working
        Program's counts are back to their initial values; after a Program failure this cleanup
        is best effort and every request still gets its terminal event.
        """
        if self.steps.pending is not None and not self.steps.pending.consumed:
            try:
                self.program.abort_pending(self.steps.pending)
            except Exception:  # noqa: BLE001 - the engine is already failing
                pass
            self.steps.pending = None
        for rec in self._arrivals + list(arrivals):
            self.settlement.open_records[rec.ticket] = rec
        self._arrivals.clear()
        for rec in list(self.settlement.open_records.values()):
            if rec.channel.response_done:
                continue
            try:
                self.settlement.fail(rec, make_error())
            except Exception:  # noqa: BLE001 - Program or bookkeeping broken: just end it
                if not rec.channel.response_done:
                    self.settlement.publish_failure(rec, make_error())
        self.settlement.open_records.clear()
        try:
            self.update_gauges()
        except Exception:  # noqa: BLE001
            pass
