"""Terminal settlement: ending a request exactly once, after its resources are returned.

Every end goes through `finish` (a normal result: stop, length, cancelled after start) or `fail`
(a typed GenerationError). Both first return the request's resources to the Program (release
the sequence, or discard the paused ResumeState), then take the record out of the scheduler,
then publish the terminal event, so a consumer that sees the end also sees the capacity back.

Cancellation and deadlines take effect at worker boundaries (`due_end`): a request cancelled
before admission fails with RequestCancelled; a started one finishes with reason "cancelled"
and the output it had. A deadline always fails with DeadlineExceeded (carrying the partial
output); the queue timeout applies only before admission.
"""
from __future__ import annotations

from typing import Callable

from ninfer.runtime.contract import Program
from ninfer.runtime.errors import (
    DeadlineExceeded, GenerationError, Overloaded, QueueTimeout, RequestCancelled,
    RequestFailed, RequestRejected,
)
from ninfer.runtime.events import FinishReason, GenerationFailed, GenerationFinished
from ninfer.runtime.metrics import EngineMetrics
from ninfer.runtime.record import RequestRecord, RequestState
from ninfer.runtime.scheduler import Scheduler

_FAIL_COUNTER = {
    RequestRejected: "rejected", QueueTimeout: "expired_queue",
    DeadlineExceeded: "expired_deadline", RequestCancelled: "cancelled", Overloaded: "overloaded",
}


class SessionError(Exception):
    """The request's OutputSession raised or broke its preview rules (ends that request only)."""


def call_session(fn: Callable, *args):
    try:
        return fn(*args)
    except Exception as exc:  # the session is foreign code: contain it to its own request
        raise SessionError(f"output session failed: {type(exc).__name__}: {exc}") from exc


class Settlement:
    def __init__(self, program: Program, scheduler: Scheduler, metrics: EngineMetrics,
                 clock: Callable[[], float]):
        self._program = program
        self._sched = scheduler
        self._metrics = metrics
        self._clock = clock
        self.capacity_event = False  # set when resources return; consumed by resume/admission
        self.open_records: dict[int, RequestRecord] = {}  # ticket -> taken in, not yet ended

    def due_end(self, rec: RequestRecord, now: float) -> str | None:
        """Why `rec` must end at this boundary: "cancelled", "deadline", "queue_timeout" or None."""
        if rec.channel.cancel_requested:
            return "cancelled"
        if rec.deadline is not None and now >= rec.deadline:
            return "deadline"
        if (rec.state is RequestState.WAITING and rec.queue_deadline is not None
                and now >= rec.queue_deadline):
            return "queue_timeout"
        return None

    def end_due(self, rec: RequestRecord, why: str) -> None:
        if why == "cancelled" and rec.started:
            self.finish(rec, "cancelled")
        elif why == "cancelled":
            self.fail(rec, RequestCancelled("cancelled before it started"))
        elif why == "deadline":
            self.fail(rec, DeadlineExceeded(f"deadline of {rec.request.timeout_s} s passed"))
        else:
            self.fail(rec, QueueTimeout(
                f"not admitted within queue_timeout_s={rec.request.queue_timeout_s}"))

    def _return_resources(self, rec: RequestRecord) -> None:
        if rec.state is RequestState.PAUSED:
            self._program.discard_resume_state(rec.resume_state)
            rec.resume_state = None
        elif rec.seq is not None:
            self._program.release(rec.seq)
        rec.seq = None
        if rec.state is not RequestState.WAITING:
            self.capacity_event = True
        self._sched.remove(rec)

    def finish(self, rec: RequestRecord, reason: FinishReason) -> None:
        """End a started request normally. A session failure in finish() fails it instead."""
        final_delta = None
        error = None
        if reason != "stop":  # the session decided "stop" itself; others it must be told
            try:
                final_delta = call_session(rec.session.finish, reason)
            except SessionError as exc:
                error = exc
        if error is not None:
            self.fail(rec, RequestFailed(str(error)))
            return
        self._return_resources(rec)
        now = self._clock()
        self._metrics.inc(f"finished_{reason}")
        if reason == "cancelled":
            self._metrics.inc("cancelled")
        self._metrics.observe_request(now - rec.submitted_at)
        self.open_records.pop(rec.ticket, None)
        rec.channel.publish(GenerationFinished(rec.result(reason, final_delta, now)))

    def fail(self, rec: RequestRecord, error: GenerationError, *, release: bool = True) -> None:
        """End `rec` with a typed error; `release=False` when the Program is unusable."""
        if release:
            self._return_resources(rec)
        else:
            self._sched.remove(rec)
        self.publish_failure(rec, error)

    def publish_failure(self, rec: RequestRecord, error: GenerationError) -> None:
        """Publish `rec`'s terminal error (the record is no longer in the scheduler)."""
        if rec.state is not RequestState.FINISHED:  # never reached the scheduler (intake)
            rec.transition(RequestState.FINISHED)
        now = self._clock()
        if rec.started and error.partial is None:
            reason = "deadline" if isinstance(error, DeadlineExceeded) else "error"
            error.partial = rec.result(reason, None, now)
        self._metrics.inc(_FAIL_COUNTER.get(type(error), "failed"))
        self.open_records.pop(rec.ticket, None)
        rec.channel.publish(GenerationFailed(error))
