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


# One server-sent event (OpenAPI 3.1 reads a stream's schema per event): `data` is a JSON
# chunk (x-chunk-schema), an error object after a late failure, or the final "[DONE]".
_SSE_EVENT = {"type": "object", "required": ["data"],
              "properties": {"data": {"type": "string"}, "event": {"type": "string"},
                             "id": {"type": "string"}, "retry": {"type": "integer"}}}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _errors(*statuses: int) -> dict[str, Any]:
    out = {str(s): {"description": _ERROR_TEXT[s], "content": _json(schemas.ERROR)}
           for s in statuses}
    if "413" in out:  # bodies over twice the limit are refused by waitress itself, in text
        out["413"]["content"]["text/plain"] = {"schema": {"type": "string"}}
    return out


def _generation(summary: str, fields, extra: dict, success: dict,
                chunk: dict) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": _json(object_schema(fields, extra=extra))},
        "responses": {
            "200": {"description": "The completion, or with stream: true server-sent events "
                                   "whose data lines are chunks (then [DONE]).",
                    "content": {**_json(success),
                                "text/event-stream": {"schema": _SSE_EVENT,
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


def _add_model_facts(node: Any, model_id: str, vocab_size: int) -> Any:
    """A copy of `node` where token ids get the vocabulary's maximum and the request field
    "model" the served id (so that schema-valid requests are ones this model accepts)."""
    if isinstance(node, list):
        return [_add_model_facts(v, model_id, vocab_size) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _add_model_facts(v, model_id, vocab_size) for k, v in node.items()}
    if out.pop("x-token-id", False):
        out["maximum"] = vocab_size - 1
    model = out.get("properties", {}).get("model")
    if isinstance(model, dict) and "anyOf" in model:
        model["anyOf"][0]["enum"] = [model_id]
    return out


def build_openapi(*, auth: bool, model_id: str | None = None,
                  vocab_size: int | None = None) -> dict[str, Any]:
    """The document; `auth`: an API key is configured (bearer auth on every route but
    /health). With the served model's id and vocabulary size (known once it is loaded), the
    "model" fields and token ids are narrowed to what this model accepts."""
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
            "/v1/chat/completions": _generation(
                "Chat completion.", params.CHAT_FIELDS, params.CHAT_SCHEMA_EXTRA,
                schemas.CHAT_COMPLETION, schemas.CHAT_CHUNK),
            "/v1/completions": _generation(
                "Text completion.", params.COMPLETION_FIELDS, params.COMPLETION_SCHEMA_EXTRA,
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
    if model_id is not None and vocab_size is not None:
        doc["paths"] = _add_model_facts(doc["paths"], model_id, vocab_size)
    return doc
