"""The routes around generation: models, tokenize/detokenize, health, metrics, openapi."""
from __future__ import annotations

import json

import falcon

from ninfer.serve.body import read_json_object
from ninfer.serve.context import ServerContext
from ninfer.serve.errors import ApiError
from ninfer.serve.fields import parse_fields, token_ids
from ninfer.serve.lifecycle import HostState, ServedModel
from ninfer.serve.metrics import CONTENT_TYPE
from ninfer.serve.openapi import build_openapi
from ninfer.serve.params import DETOKENIZE_FIELDS, TOKENIZE_FIELDS

__all__ = [
    "DetokenizeResource", "HealthResource", "MetricsResource", "ModelResource",
    "ModelsResource", "OpenApiResource", "TokenizeResource",
]


def _model_card(served: ServedModel) -> dict:
    return {"id": served.model_id, "object": "model", "created": served.created,
            "owned_by": "ninfer", "max_model_len": served.max_context_len}


class ModelsResource:
    def __init__(self, ctx: ServerContext):
        self._ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"object": "list", "data": [_model_card(self._ctx.host.ready())]}


class ModelResource:
    def __init__(self, ctx: ServerContext):
        self._ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response, model: str) -> None:
        served = self._ctx.host.ready()
        served.check_model(model)
        resp.media = _model_card(served)


class TokenizeResource:
    def __init__(self, ctx: ServerContext):
        self._ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        served = self._ctx.host.ready()
        v = parse_fields(read_json_object(req, self._ctx.config.max_request_bytes),
                         TOKENIZE_FIELDS)
        served.check_model(v["model"])
        frontend = served.frontend
        if (v["prompt"] is None) == (v["messages"] is None):
            raise ApiError(400, "give exactly one of prompt and messages", param="prompt",
                           code="invalid_value")
        if v["prompt"] is not None:
            chat_only = [k for k in ("add_generation_prompt", "tools", "chat_template_kwargs")
                         if v[k] is not None]
            if chat_only:
                raise ApiError(400, f"{chat_only[0]} needs messages", param=chat_only[0],
                               code="invalid_value")
            ids = list(frontend.tokenizer.encode(v["prompt"]))
        else:
            prepared = frontend.prepare_chat(
                v["messages"], tools=v["tools"], chat_template_kwargs=v["chat_template_kwargs"],
                add_generation_prompt=v["add_generation_prompt"] is not False)
            ids = list(prepared.token_ids)
        out = {"tokens": ids, "count": len(ids), "max_model_len": served.max_context_len}
        if v["return_token_strs"]:
            out["token_strs"] = [frontend.tokenizer.token_text(t) for t in ids]
        resp.media = out


class DetokenizeResource:
    def __init__(self, ctx: ServerContext):
        self._ctx = ctx

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        served = self._ctx.host.ready()
        v = parse_fields(read_json_object(req, self._ctx.config.max_request_bytes),
                         DETOKENIZE_FIELDS)
        served.check_model(v["model"])
        tokenizer = served.frontend.tokenizer
        ids = token_ids(v["tokens"])
        if ids is None:
            raise ApiError(400, "tokens must be a list of integers", param="tokens",
                           code="invalid_value")
        ids = tokenizer.check_ids(ids, param="tokens")  # InvalidInput names "tokens"
        resp.media = {"prompt": tokenizer.decode(ids)}


class HealthResource:
    """200 when ready; 503 (with the reason) while loading, after a failure, when stopping."""

    def __init__(self, ctx: ServerContext):
        self._ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        host = self._ctx.host
        served = host.served
        if host.state is HostState.READY and served is not None:
            resp.media = {"status": "ready", "model": served.model_id, "reason": None}
            return
        error = host.unavailable_error()
        resp.status = 503
        for name, value in error.headers.items():
            resp.set_header(name, value)
        resp.media = {"status": host.state.value, "model": None,
                      "reason": host.failure_reason, **error.body()}


class MetricsResource:
    def __init__(self, ctx: ServerContext):
        self._ctx = ctx

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = CONTENT_TYPE
        resp.data = self._ctx.metrics.render()


class OpenApiResource:
    """The document; once the model is ready it names the model and its token-id range."""

    def __init__(self, ctx: ServerContext):
        self._ctx = ctx
        self._ready_doc: bytes | None = None

    def _document(self) -> bytes:
        if self._ready_doc is not None:
            return self._ready_doc
        auth = self._ctx.config.api_key is not None
        served = self._ctx.host.served
        if served is None:
            return json.dumps(build_openapi(auth=auth)).encode()
        self._ready_doc = json.dumps(build_openapi(
            auth=auth, model_id=served.model_id,
            vocab_size=served.frontend.vocab_size)).encode()
        return self._ready_doc

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = "application/json"
        resp.data = self._document()
