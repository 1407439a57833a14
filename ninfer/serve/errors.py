"""HTTP errors in OpenAI's shape, and the mapping from ninfer's typed errors.

Every error response body is ``{"error": {"message", "type", "param", "code"}}``. `ApiError` is
the one exception the routes raise for a response that is not a success; `api_error_from`
maps what the layers below raise (`InvalidInput`, the runtime's `GenerationError`s) onto it.
Messages come from our own code and name parameters, never request content.
"""
from __future__ import annotations

import json
import math
from typing import Any, Mapping

from ninfer.errors import InvalidInput
from ninfer.runtime.errors import (
    DeadlineExceeded, EngineFailed, EngineShutdown, GenerationError, Overloaded, QueueTimeout,
    RequestCancelled, RequestFailed, RequestRejected,
)

__all__ = ["ApiError", "api_error_from", "error_body", "error_json", "ERROR_TYPES"]

# HTTP status -> the error object's `type`
ERROR_TYPES: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    499: "client_closed_request",
    500: "server_error",
    503: "service_unavailable",
    504: "timeout_error",
}
CLIENT_CLOSED = 499  # nginx's convention; the client never sees it, logs and metrics do


class ApiError(Exception):
    """A non-success response: status, OpenAI error fields and extra headers."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    @property
    def type(self) -> str:
        return ERROR_TYPES.get(self.status, "server_error" if self.status >= 500
                               else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type_: str, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_json(error: ApiError) -> bytes:
    return json.dumps(error.body()).encode("utf-8")


def _retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


def api_error_from(exc: BaseException) -> ApiError | None:
    """The response for an error raised below the server; None for an unexpected one."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, InvalidInput):
        return ApiError(400, str(exc), param=exc.param, code="invalid_value")
    if not isinstance(exc, GenerationError):
        return None
    if isinstance(exc, Overloaded):
        return ApiError(429, f"the server is at capacity: {exc}; retry later",
                        code="overloaded",
                        headers={"Retry-After": _retry_after(exc.retry_after_s)})
    if isinstance(exc, RequestRejected):
        return ApiError(400, str(exc), param=exc.param, code="request_rejected")
    if isinstance(exc, QueueTimeout):
        return ApiError(503, f"the request waited too long for capacity: {exc}",
                        code="queue_timeout", headers={"Retry-After": "1"})
    if isinstance(exc, DeadlineExceeded):
        return ApiError(504, f"the request did not finish in time: {exc}",
                        code="deadline_exceeded")
    if isinstance(exc, RequestCancelled):
        return ApiError(CLIENT_CLOSED, "the request was cancelled", code="cancelled")
    if isinstance(exc, (EngineFailed, EngineShutdown)):
        return ApiError(503, str(exc), code="engine_unavailable")
    if isinstance(exc, RequestFailed):
        return ApiError(500, "the request failed inside the engine", code="request_failed")
    return ApiError(500, "the request failed", code="generation_error")
