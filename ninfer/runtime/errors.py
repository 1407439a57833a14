"""Typed ways a generation request can end without a normal result.

Each error is the payload of the request's terminal `GenerationFailed` event and is what
`GenerationHandle.wait()` raises. Errors raised after the request started carry the output it had
published so far in `partial` (a `GenerationResult`, else None). HTTP mapping (done by the
server): Overloaded -> 429 (Retry-After), RequestRejected -> 400, QueueTimeout and
DeadlineExceeded -> 408/504, RequestCancelled -> 499, RequestFailed -> 500,
EngineFailed and EngineShutdown -> 503.

Request-level rejections (overload, queue timeout, input too long or unrepresentable) end one
request. `EngineFailed` means an engine invariant broke: every outstanding request gets it and
the engine refuses new work.
"""
from __future__ import annotations

from typing import Any

from ninfer.errors import NinferError


class GenerationError(NinferError):
    """Base class of every typed request end; `partial` is the output published before it."""

    def __init__(self, message: str, *, partial: Any = None):
        super().__init__(message)
        self.partial = partial


class Overloaded(GenerationError):
    """The engine already holds its maximum of outstanding requests; retry after a while."""

    def __init__(self, message: str, *, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueTimeout(GenerationError):
    """The request waited longer than its queue_timeout_s before it was admitted."""


class DeadlineExceeded(GenerationError):
    """The request's deadline (timeout_s, covering queue and execution) passed."""


class RequestCancelled(GenerationError):
    """The request was cancelled before it started (a started request instead finishes
    normally with finish_reason "cancelled" and the output it had)."""


class RequestRejected(GenerationError):
    """The request cannot be served: input too long, unrepresentable ids, or a context that does
    not fit the engine's KV capacity. `param` names the offending field when known."""

    def __init__(self, message: str, *, param: str | None = None, partial: Any = None):
        super().__init__(message, partial=partial)
        self.param = param


class RequestFailed(GenerationError):
    """An internal error ended this request only (e.g. its output session raised)."""


class EngineFailed(GenerationError):
    """An engine invariant broke or the Program failed; the engine accepts no more work."""


class EngineShutdown(GenerationError):
    """The engine was shut down before the request finished."""
