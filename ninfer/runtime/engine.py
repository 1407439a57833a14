"""Engine: the public facade. One Program, one worker thread, `max_concurrency` lanes.

`submit()` may be called from any thread; only the worker thread touches request state, the
scheduler and the Program (the constructor reads only the Program's static `limits`).

Capacity rule: every accepted request holds one *outstanding* slot from submit until both the
worker ended it and its consumer released it (see `handle.py`). At most
`max_concurrency + max_queue` requests are outstanding; a submit beyond that returns a handle
that has already ended with `Overloaded` (carrying a retry-after hint) - `submit` never raises
for load, so callers have one code path. A pause keeps the slot.

`start_worker=False` builds the engine without a thread: the caller then drives it with
`step()` on one thread of its choice (deterministic tests, debugging). `clock` is the monotonic
clock deadlines are measured with.
"""
from __future__ import annotations

import enum
import itertools
import logging
import threading
import time
from typing import Callable

from ninfer.errors import InvalidInput
from ninfer.runtime.contract import Program
from ninfer.runtime.contract.output import TokenOutputSession
from ninfer.runtime.engine_core import EngineCore
from ninfer.runtime.errors import EngineFailed, EngineShutdown, GenerationError, Overloaded
from ninfer.runtime.events import GenerationFailed, GenerationResult
from ninfer.runtime.handle import GenerationHandle, ResponseChannel
from ninfer.runtime.metrics import EngineMetrics
from ninfer.runtime.record import RequestRecord
from ninfer.runtime.request import GenerationRequest

_log = logging.getLogger("ninfer.engine")


class EngineStatus(enum.Enum):
    RUNNING = "running"
    SHUTDOWN = "shutdown"
    FAILED = "failed"


def _noop() -> None:
    pass


class Engine:
    def __init__(self, program: Program, *, max_concurrency: int = 8, max_queue: int = 64,
                 default_timeout_s: float | None = None,
                 default_queue_timeout_s: float | None = None, start_worker: bool = True,
                 clock: Callable[[], float] = time.monotonic, admission_scan: int = 8,
                 max_bypass: int = 8):
        limits = program.limits
        if not 1 <= max_concurrency <= 8:
            raise InvalidInput(f"max_concurrency must be in 1..8, got {max_concurrency}",
                               param="max_concurrency")
        if max_concurrency > min(limits.max_batch, limits.total_slots):
            raise InvalidInput(
                f"max_concurrency={max_concurrency} exceeds the Program's max_batch="
                f"{limits.max_batch} / total_slots={limits.total_slots}", param="max_concurrency")
        if max_queue < 0:
            raise InvalidInput(f"max_queue must be >= 0, got {max_queue}", param="max_queue")
        self.max_concurrency = max_concurrency
        self.max_outstanding = max_concurrency + max_queue
        self._default_timeout_s = default_timeout_s
        self._default_queue_timeout_s = default_queue_timeout_s
        self._clock = clock
        self._metrics = EngineMetrics(max_concurrency)
        self._core = EngineCore(program, max_concurrency=max_concurrency, metrics=self._metrics,
                                clock=clock, scan_limit=admission_scan, max_bypass=max_bypass)
        self._cond = threading.Condition()
        self._inbox: list[RequestRecord] = []
        self._kicked = False
        self._outstanding = 0
        self._status = EngineStatus.RUNNING
        self._failure: str | None = None
        self._closed = False
        self._tickets = itertools.count()
        self._thread: threading.Thread | None = None
        if start_worker:
            self._thread = threading.Thread(target=self._worker_main, name="ninfer-engine",
                                            daemon=True)
            self._thread.start()

    # --- any thread ----------------------------------------------------------------------------
    @property
    def outstanding(self) -> int:
        """Requests holding an outstanding slot (accepted and not yet ended-and-released)."""
        with self._cond:
            return self._outstanding

    @property
    def status(self) -> EngineStatus:
        return self._status

    def submit(self, request: GenerationRequest) -> GenerationHandle:
        """Queue `request`; the handle ends at once with a typed error when it is refused."""
        if not isinstance(request, GenerationRequest):
            raise InvalidInput("submit() takes a GenerationRequest", param="request")
        now = self._clock()
        with self._cond:
            refusal = self._refusal_locked()
            if refusal is None:
                self._outstanding += 1
                channel = ResponseChannel(request.request_id, self._kick, self._release_slot)
                self._inbox.append(self._record(request, channel, now))
                self._metrics.inc("submitted")
                self._cond.notify()
                return GenerationHandle(channel)
        channel = ResponseChannel(request.request_id, _noop, None)
        channel.publish(GenerationFailed(refusal))
        return GenerationHandle(channel)

    def generate(self, request: GenerationRequest) -> GenerationResult:
        """Submit and block until the result; raises the request's typed GenerationError."""
        with self.submit(request) as handle:
            return handle.wait()

    def metrics_snapshot(self) -> dict:
        snap = self._metrics.snapshot()
        with self._cond:
            snap["outstanding"] = self._outstanding
        snap["max_outstanding"] = self.max_outstanding
        snap["max_concurrency"] = self.max_concurrency
        snap["engine_status"] = self._status.value
        return snap

    def shutdown(self, wait: bool = True, timeout: float | None = None) -> None:
        """Stop accepting work; every outstanding request ends with EngineShutdown."""
        with self._cond:
            if self._status is EngineStatus.RUNNING:
                self._status = EngineStatus.SHUTDOWN
            self._cond.notify()
        if self._thread is None:
            self._close_manual()
        elif wait and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # --- helpers ---------------------------------------------------------------------------
    def _refusal_locked(self) -> GenerationError | None:
        if self._status is EngineStatus.FAILED:
            return EngineFailed(f"the engine failed: {self._failure}")
        if self._status is EngineStatus.SHUTDOWN:
            return EngineShutdown("the engine is shut down")
        if self._outstanding >= self.max_outstanding:
            self._metrics.inc("overloaded")
            hint = min(60.0, max(0.5, self._metrics.mean_request_s() or 1.0))
            return Overloaded(f"{self._outstanding} requests outstanding (limit "
                              f"{self.max_outstanding})", retry_after_s=hint)
        return None

    def _record(self, request: GenerationRequest, channel: ResponseChannel,
                now: float) -> RequestRecord:
        timeout = request.timeout_s if request.timeout_s is not None else self._default_timeout_s
        queue_timeout = request.queue_timeout_s if request.queue_timeout_s is not None \
            else self._default_queue_timeout_s
        return RequestRecord(
            ticket=next(self._tickets), request=request, channel=channel,
            session=request.session if request.session is not None else TokenOutputSession(),
            sampling=request.sampling.with_seed(), submitted_at=now,
            deadline=None if timeout is None else now + timeout,
            queue_deadline=None if queue_timeout is None else now + queue_timeout)

    def _kick(self) -> None:
        with self._cond:
            self._kicked = True
            self._cond.notify()

    def _release_slot(self) -> None:
        with self._cond:
            self._outstanding -= 1
            if self._outstanding < 0:
                raise RuntimeError("outstanding capacity released twice")

    def _take_arrivals(self) -> tuple[list[RequestRecord], EngineStatus]:
        with self._cond:
            arrivals, self._inbox = self._inbox, []
            self._kicked = False
            return arrivals, self._status

    def _fail(self, exc: BaseException) -> None:
        _log.error("engine failed; ending every outstanding request", exc_info=exc)
        with self._cond:
            self._status = EngineStatus.FAILED
            self._failure = f"{type(exc).__name__}: {exc}"
        message = f"the engine failed: {self._failure}"
        self._close(lambda: EngineFailed(message))

    def _close(self, make_error: Callable[[], GenerationError],
               arrivals: list[RequestRecord] | None = None) -> None:
        """End everything outstanding (once); `arrivals` were taken from the inbox already."""
        if self._closed:
            return
        self._closed = True
        more, _ = self._take_arrivals()
        self._core.close(make_error, (arrivals or []) + more)

    # --- worker ----------------------------------------------------------------------------
    def step(self) -> bool:
        """Run one worker cycle on the calling thread (engines built with start_worker=False).

        Returns False when the cycle changed nothing (the engine is idle until an event).
        """
        if self._thread is not None:
            raise RuntimeError("step() drives engines built with start_worker=False only")
        arrivals, status = self._take_arrivals()
        if status is not EngineStatus.RUNNING or self._closed:
            self._close_manual(arrivals)
            return False
        try:
            return self._core.cycle(arrivals)
        except Exception as exc:  # noqa: BLE001 - any escape is an engine failure
            self._fail(exc)
            return False

    def _close_manual(self, arrivals: list[RequestRecord] | None = None) -> None:
        if self._status is EngineStatus.SHUTDOWN:
            self._close(lambda: EngineShutdown("the engine was shut down"), arrivals)

    def _worker_main(self) -> None:
        try:
            while True:
                arrivals, status = self._take_arrivals()
                if status is not EngineStatus.RUNNING:
                    self._close(lambda: EngineShutdown("the engine was shut down"), arrivals)
                    return
                if self._core.cycle(arrivals):
                    continue
                timer = self._core.next_timer()
                with self._cond:
                    if not self._inbox and not self._kicked \
                            and self._status is EngineStatus.RUNNING:
                        self._cond.wait(timer)
        except BaseException as exc:  # noqa: BLE001 - fail loudly, end every request
            self._fail(exc)
