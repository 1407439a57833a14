"""HandleGroup: the engine requests of one HTTP request, and waiting on them.

An HTTP request submits all of its choices at once (`HandleGroup(engine, choices)`) and owns
their handles until `release()`, which abandons every handle: a request still running is
cancelled and its engine capacity returns as soon as the worker ends it. Release is idempotent
and is called exactly when the HTTP exchange ends (response built, stream closed, or client
gone), so a disconnected client never leaves engine work behind.

Waiting never blocks for longer than `POLL_S` without checking `disconnected()` (waitress's
``waitress.client_disconnected``), so a client that goes away while its request is queued or
running is noticed within POLL_S even when no output is being written.
"""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

from ninfer.runtime.engine import Engine
from ninfer.runtime.events import (
    GenerationFailed, GenerationFinished, GenerationResult, GenerationStart,
)
from ninfer.runtime.handle import GenerationHandle
from ninfer.serve.errors import api_error_from
from ninfer.serve.jobs import Choice

__all__ = ["ClientGone", "HandleGroup", "POLL_S", "is_terminal"]

POLL_S = 0.25
Disconnected = Callable[[], bool]


class ClientGone(Exception):
    """The HTTP client disconnected while its request was waiting or running."""


def is_terminal(event) -> bool:
    return isinstance(event, (GenerationFinished, GenerationFailed))


def raise_failure(event: GenerationFailed) -> None:
    error = api_error_from(event.error)
    raise error if error is not None else event.error


class HandleGroup:
    def __init__(self, engine: Engine, choices: Sequence[Choice]):
        self.choices = tuple(choices)
        self.handles: list[GenerationHandle] = []
        self._pushed_back: dict[int, object] = {}  # a first event that is not GenerationStart
        self._released = False
        try:
            for choice in self.choices:
                self.handles.append(engine.submit(choice.request))
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Abandon every handle (cancelling unfinished requests); idempotent."""
        if self._released:
            return
        self._released = True
        for handle in self.handles:
            handle.abandon()

    def __enter__(self) -> "HandleGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _wait(self, handle: GenerationHandle, disconnected: Disconnected):
        while True:
            event = handle.next_event(POLL_S)
            if event is not None:
                return event
            if disconnected():
                raise ClientGone()

    def await_admission(self, disconnected: Disconnected) -> None:
        """Block until every request was admitted (its first event); raise the first failure.

        Refusals (overload, rejection, queue timeout) happen before admission, so after this
        the HTTP status is settled: 200 and the stream may begin.
        """
        first: list = [h.next_event(0) for h in self.handles]  # refusals at submit come first
        for event in first:
            if isinstance(event, GenerationFailed):
                raise_failure(event)
        for i, handle in enumerate(self.handles):
            event = first[i] if first[i] is not None else self._wait(handle, disconnected)
            if isinstance(event, GenerationFailed):
                raise_failure(event)
            if not isinstance(event, GenerationStart):
                self._pushed_back[i] = event

    def collect(self, disconnected: Disconnected) -> list[GenerationResult]:
        """Every request's result, in choice order; raises the first failure."""
        results = []
        for i, handle in enumerate(self.handles):
            event = self._pushed_back.pop(i, None)
            while event is None or not is_terminal(event):
                event = self._wait(handle, disconnected)
            if isinstance(event, GenerationFailed):
                raise_failure(event)
            results.append(event.result)
        return results

    def events(self, disconnected: Disconnected) -> Iterator[tuple[int, object]]:
        """(choice index, event) as they come, over all requests, until every one ended.

        Polls every live request without blocking, then blocks (at most POLL_S) on the first
        live one; a request's events keep their order.
        """
        live = list(range(len(self.handles)))
        for i, event in list(self._pushed_back.items()):
            del self._pushed_back[i]
            yield i, event
            if is_terminal(event):
                live.remove(i)
        while live:
            if disconnected():
                raise ClientGone()
            progressed = False
            for i in list(live):
                while (event := self.handles[i].next_event(0)) is not None:
                    progressed = True
                    yield i, event
                    if is_terminal(event):
                        live.remove(i)
                        break
            if not progressed and live:
                first = live[0]
                event = self.handles[first].next_event(POLL_S)
                if event is not None:
                    yield first, event
                    if is_terminal(event):
                        live.remove(first)
