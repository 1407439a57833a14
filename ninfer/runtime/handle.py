"""GenerationHandle: the consumer's side of one submitted request (thread-safe).

The worker publishes into a `ResponseChannel`; the consumer reads it through the handle. The
request holds one outstanding-capacity slot until both sides are done, in either order, and the
slot is released exactly once:

- response_done: the worker published the terminal event;
- consumer_released: `wait()` returned or raised the terminal outcome, iteration yielded the
  terminal event, or the handle was abandoned (`abandon()`, leaving its `with` block, or being
  garbage-collected).

`cancel()` and `abandon()` only set flags and wake the worker; the consumer thread never calls
the Program.
"""
from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import Callable, Iterator

from ninfer.runtime.events import (
    GenerationEvent, GenerationFailed, GenerationFinished, GenerationResult, TerminalEvent,
)


class ResponseChannel:
    """Shared state of one request between the worker and the consumer."""

    def __init__(self, request_id: str, wake: Callable[[], None],
                 on_release: Callable[[], None] | None):
        self.request_id = request_id
        self._wake = wake
        self._on_release = on_release  # None: the request never took a capacity slot
        # Reentrant: a handle finalizer (abandon) may run on any thread, even one inside here.
        self._cond = threading.Condition(threading.RLock())
        self._events: deque[GenerationEvent] = deque()
        self._terminal: TerminalEvent | None = None
        self._consumer_released = False
        self._released = False
        self.cancel_requested = False  # read by the worker at its boundaries

    # --- worker side -------------------------------------------------------------------------
    def publish(self, event: GenerationEvent) -> None:
        with self._cond:
            if self._terminal is not None:
                raise RuntimeError(f"{self.request_id}: event after the terminal event")
            self._events.append(event)
            if isinstance(event, (GenerationFinished, GenerationFailed)):
                self._terminal = event
            self._cond.notify_all()
        if self._terminal is event:
            self._maybe_release()

    @property
    def response_done(self) -> bool:
        return self._terminal is not None

    # --- consumer side -----------------------------------------------------------------------
    def cancel(self) -> None:
        self.cancel_requested = True
        self._wake()

    def release_consumer(self) -> None:
        with self._cond:
            self._consumer_released = True
        self._maybe_release()

    def abandon(self) -> None:
        self.cancel_requested = True
        self.release_consumer()
        self._wake()

    def _maybe_release(self) -> None:
        with self._cond:
            if self._released or not (self._consumer_released and self._terminal is not None):
                return
            self._released = True
        if self._on_release is not None:
            self._on_release()

    def wait_terminal(self, timeout: float | None) -> TerminalEvent | None:
        with self._cond:
            self._cond.wait_for(lambda: self._terminal is not None, timeout)
            return self._terminal

    def next_event(self, timeout: float | None) -> GenerationEvent | None:
        with self._cond:
            self._cond.wait_for(lambda: bool(self._events), timeout)
            return self._events.popleft() if self._events else None


class GenerationHandle:
    """What `Engine.submit` returns. Iterate it for events, or `wait()` for the result."""

    def __init__(self, channel: ResponseChannel):
        self._channel = channel
        self._finalizer = weakref.finalize(self, channel.abandon)

    @property
    def request_id(self) -> str:
        return self._channel.request_id

    @property
    def done(self) -> bool:
        """True once the terminal event was published."""
        return self._channel.response_done

    def wait(self, timeout: float | None = None) -> GenerationResult:
        """Block until the request ends; return its result or raise its typed GenerationError.

        Raises TimeoutError when `timeout` passes first (the request keeps running).
        """
        terminal = self._channel.wait_terminal(timeout)
        if terminal is None:
            raise TimeoutError(f"{self.request_id} did not finish within {timeout} s")
        self._channel.release_consumer()
        if isinstance(terminal, GenerationFailed):
            raise terminal.error
        return terminal.result

    def __iter__(self) -> Iterator[GenerationEvent]:
        """Yield events as they come (blocking), ending with the terminal event."""
        while True:
            event = self.next_event(None)
            yield event
            if isinstance(event, (GenerationFinished, GenerationFailed)):
                return

    def next_event(self, timeout: float | None = None) -> GenerationEvent | None:
        """The next event, waiting up to `timeout` seconds (None: forever); None on timeout.

        For consumers that must wake up periodically (e.g. to notice a closed connection).
        """
        event = self._channel.next_event(timeout)
        if isinstance(event, (GenerationFinished, GenerationFailed)):
            self._channel.release_consumer()
        return event

    def poll(self) -> list[GenerationEvent]:
        """The events available now, without blocking (the same stream iteration yields)."""
        events = []
        while (event := self.next_event(0)) is not None:
            events.append(event)
        return events

    def cancel(self) -> None:
        """Ask the worker to stop the request at its next boundary (idempotent)."""
        self._channel.cancel()

    def abandon(self) -> None:
        """Cancel and give up the result: the request's capacity returns once it has ended."""
        self._finalizer.detach()
        self._channel.abandon()

    def __enter__(self) -> "GenerationHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.abandon()
