"""The Falcon WSGI app: routes, API-key check, error mapping, access log, HTTP metrics.

`create_app(host, config)` returns ``(app, context)``. Every error response is an OpenAI error
object (Falcon's own 404/405 included). An unexpected exception becomes a 500 with a generic
message and one log line naming the exception type and where it was raised; request content
(prompts, outputs, even exception messages, which may quote input) is never logged.
"""
from __future__ import annotations

import hmac
import logging
import time
import traceback

import falcon

from ninfer.errors import InvalidInput
from ninfer.runtime.errors import GenerationError
from ninfer.serve import routes_generate, routes_info
from ninfer.serve.context import ServerConfig, ServerContext
from ninfer.serve.errors import ERROR_TYPES, ApiError, api_error_from, error_body, error_json
from ninfer.serve.lifecycle import ModelHost
from ninfer.serve.metrics import ServerMetrics

__all__ = ["create_app"]

_log = logging.getLogger("ninfer.serve")
_access = logging.getLogger("ninfer.serve.access")
PUBLIC_PATHS = frozenset({"/health"})


class _AuthMiddleware:
    """Bearer API key on every route but /health (constant-time comparison)."""

    def __init__(self, api_key: str):
        self._key = api_key.encode("utf-8")

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if req.path in PUBLIC_PATHS:
            return
        header = req.get_header("Authorization") or ""
        scheme, _, token = header.partition(" ")
        given = token.strip().encode("utf-8") if scheme.lower() == "bearer" else b""
        if not hmac.compare_digest(given, self._key):
            raise ApiError(401, "a valid API key is required (Authorization: Bearer <key>)",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


class _ObserveMiddleware:
    """Counts responses by status class and writes the access log (method, path, status,
    seconds; never bodies or query strings)."""

    def __init__(self, metrics: ServerMetrics):
        self._metrics = metrics

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        req.context.started = time.monotonic()
        self._metrics.enter()

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource,
                         req_succeeded: bool) -> None:
        self._metrics.leave()
        status = resp.status_code
        self._metrics.count_response(status)
        elapsed = time.monotonic() - getattr(req.context, "started", time.monotonic())
        _access.info("%s %s %d %.3fs", req.method, req.path, status, elapsed)


def _respond(resp: falcon.Response, error: ApiError) -> None:
    resp.status = error.status
    resp.content_type = "application/json"
    resp.data = error_json(error)
    for name, value in error.headers.items():
        resp.set_header(name, value)


def _on_api_error(req, resp, exc, params) -> None:
    _respond(resp, exc)


def _on_mapped(req, resp, exc, params) -> None:
    error = api_error_from(exc)
    if error is None:
        _on_unexpected(req, resp, exc, params)
    else:
        _respond(resp, error)


def _on_http_error(req, resp, exc: falcon.HTTPError, params) -> None:
    status = exc.status_code
    message = exc.title or "error"
    if exc.description:
        message = f"{message}: {exc.description}"
    if status == 404:
        message = f"no route {req.method} {req.path}"
    elif status == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        message = f"method {req.method} is not allowed on {req.path} (allowed: {allowed})"
    resp.status = status
    resp.content_type = "application/json"
    type_ = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    body = error_body(message, type_, None, exc.code if isinstance(exc.code, str) else None)
    resp.media = body
    for name, value in (exc.headers or {}).items():
        resp.set_header(name, value)


def _on_unexpected(req, resp, exc, params) -> None:
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" at {frame.filename}:{frame.lineno}" if frame else ""
    _log.error("internal error in %s %s: %s%s", req.method, req.path, type(exc).__name__, where)
    _log.debug("traceback", exc_info=exc)
    _respond(resp, ApiError(500, "internal server error", code="internal_error"))


def create_app(host: ModelHost, config: ServerConfig) -> tuple[falcon.App, ServerContext]:
    def engine_snapshot():
        served = host.served
        return served.engine.metrics_snapshot() if served is not None else None

    metrics = ServerMetrics(engine_snapshot, lambda: host.state.value)
    ctx = ServerContext(config=config, host=host, metrics=metrics)
    middleware: list = [_ObserveMiddleware(metrics)]
    if config.api_key is not None:
        middleware.append(_AuthMiddleware(config.api_key))
    app = falcon.App(middleware=middleware)
    app.req_options.strip_url_path_trailing_slash = True
    app.add_error_handler(Exception, _on_unexpected)
    app.add_error_handler(falcon.HTTPError, _on_http_error)
    app.add_error_handler(InvalidInput, _on_mapped)
    app.add_error_handler(GenerationError, _on_mapped)
    app.add_error_handler(ApiError, _on_api_error)
    app.add_route("/v1/chat/completions", routes_generate.ChatCompletionsResource(ctx))
    app.add_route("/v1/completions", routes_generate.CompletionsResource(ctx))
    app.add_route("/v1/models", routes_info.ModelsResource(ctx))
    app.add_route("/v1/models/{model:path}", routes_info.ModelResource(ctx))
    app.add_route("/tokenize", routes_info.TokenizeResource(ctx))
    app.add_route("/detokenize", routes_info.DetokenizeResource(ctx))
    app.add_route("/health", routes_info.HealthResource(ctx))
    app.add_route("/metrics", routes_info.MetricsResource(ctx))
    app.add_route("/openapi.json", routes_info.OpenApiResource(ctx))
    return app, ctx
