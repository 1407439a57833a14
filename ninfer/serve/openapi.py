"""The OpenAPI 3.1 document served at /openapi.json, built from the same field tables that
validate requests (`params.py`) and the response schemas (`schemas.py`)."""
from __future__ import annotations

from typing import Any

from ninfer import __version__
from ninfer.serve import params, schemas
from ninfer.serve.fields import object_schema

__all__ = ["build_openapi"]

_ERROR_TEXT = {
    400: "Invalid request (the error names the parameter).",
    401: "Missing or wrong API key.",
    404: "Unknown model or route.",
    413: "Request body too large.",
    429: "The server is at capacity; see Retry-After.",
    503: "The model is loading, failed to load, or the server is stopping.",
    504: "The request's deadline passed.",
}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _errors(*statuses: int) -> dict[str, Any]:
    return {str(s): {"description": _ERROR_TEXT[s], "content": _json(schemas.ERROR)}
            for s in statuses}


def _generation(summary: str, fields, success: dict, chunk: dict) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": _json(object_schema(fields))},
        "responses": {
            "200": {"description": "The completion, or with stream: true server-sent events "
                                   "whose data lines are chunks (then [DONE]).",
                    "content": {**_json(success),
                                "text/event-stream": {"schema": {"type": "string"},
                                                      "x-chunk-schema": chunk}}},
            **_errors(400, 401, 404, 413, 429, 503, 504),
        },
    }}


def _get(summary: str, schema: dict[str, Any], *errors: int,
         media: str = "application/json") -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": {
        "200": {"description": "OK", "content": {media: {"schema": schema}}},
        **_errors(*errors)}}}


def _post(summary: str, fields, schema: dict[str, Any]) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": _json(object_schema(fields))},
        "responses": {"200": {"description": "OK", "content": _json(schema)},
                      **_errors(400, 401, 404, 413, 503)},
    }}


def build_openapi(*, auth: bool) -> dict[str, Any]:
    """The document; `auth`: an API key is configured (bearer auth on every route but
    /health)."""
    health = {"get": {"summary": "Readiness (no API key needed).", "security": [],
                      "responses": {
                          "200": {"description": "Ready", "content": _json(schemas.HEALTH)},
                          "503": {"description": "Loading, failed or stopping",
                                  "content": _json(schemas.HEALTH)}}}}
    model_by_id = _get("One model.", schemas.MODEL, 401, 404, 503)
    model_by_id["get"]["parameters"] = [{"name": "model", "in": "path", "required": True,
                                         "schema": {"type": "string"}}]
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "ninfer OpenAI-compatible API", "version": __version__},
        "paths": {
            "/v1/chat/completions": _generation("Chat completion.", params.CHAT_FIELDS,
                                                schemas.CHAT_COMPLETION, schemas.CHAT_CHUNK),
            "/v1/completions": _generation("Text completion.", params.COMPLETION_FIELDS,
                                           schemas.COMPLETION, schemas.COMPLETION_CHUNK),
            "/v1/models": _get("The served model.", schemas.MODEL_LIST, 401, 503),
            "/v1/models/{model}": model_by_id,
            "/tokenize": _post("Text or messages to token ids.", params.TOKENIZE_FIELDS,
                               schemas.TOKENIZE_RESPONSE),
            "/detokenize": _post("Token ids to text.", params.DETOKENIZE_FIELDS,
                                 schemas.DETOKENIZE_RESPONSE),
            "/health": health,
            "/metrics": _get("Prometheus metrics (text format).", {"type": "string"}, 401,
                             media="text/plain"),
            "/openapi.json": _get("This document.", {"type": "object"}, 401),
        },
        "components": {"schemas": {"Error": schemas.ERROR}},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
    return doc
