"""Reading a request's JSON body under a byte limit.

A declared Content-Length over the limit is refused with 413 before any of the body is read;
a body without one (chunked) is read up to one byte past the limit. JSON is parsed strictly:
NaN and Infinity are not JSON and are refused, the top level must be an object, and strings
must be valid Unicode (an escaped unpaired surrogate is refused).
"""
from __future__ import annotations

import json
from typing import Any

from ninfer.serve.errors import ApiError

__all__ = ["read_json_object"]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def read_json_object(req, max_bytes: int) -> dict[str, Any]:
    """The body of Falcon request `req` as a dict; ApiError 413/400 otherwise."""
    declared = req.content_length
    if declared is not None and declared > max_bytes:
        raise ApiError(413, f"the request body has {declared} bytes; the limit is {max_bytes}",
                       code="request_too_large")
    raw = req.bounded_stream.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise ApiError(413, f"the request body exceeds the limit of {max_bytes} bytes",
                       code="request_too_large")
    if not raw.strip():
        raise ApiError(400, "the request body is empty; a JSON object is expected",
                       code="invalid_json")
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        where = f" (line {exc.lineno}, column {exc.colno})" \
            if isinstance(exc, json.JSONDecodeError) else ""
        raise ApiError(400, f"the request body is not valid JSON{where}",
                       code="invalid_json") from None
    if not isinstance(value, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    try:  # JSON may spell unpaired UTF-16 surrogates ("\ud800"): not text, refuse them here
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(400, "the request body contains an unpaired UTF-16 surrogate (not "
                       "valid Unicode text)", code="invalid_json") from None
    return value
