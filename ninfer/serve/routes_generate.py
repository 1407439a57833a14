"""POST /v1/chat/completions and POST /v1/completions.

Flow of one request: parse and validate the body (400 naming the parameter), prepare the prompt
with the frontend, submit one engine request per choice, wait until every choice is admitted
(refusals become 429/400/503 before any byte of a 200 is sent), then either stream the output
(`SseStream`, which owns the engine requests from then on) or wait for the results and build
the completion object. A client that disconnects while waiting cancels its engine requests.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import falcon

from ninfer.serve import responses
from ninfer.serve.body import read_json_object
from ninfer.serve.context import ServerContext
from ninfer.serve.errors import CLIENT_CLOSED, ApiError
from ninfer.serve.handles import ClientGone, HandleGroup
from ninfer.serve.jobs import Choice, chat_choices, completion_choices, prompt_tokens_total
from ninfer.serve.params import GenerationParams, parse_chat, parse_completion
from ninfer.serve.streaming import ChatChunks, CompletionChunks, SseStream

__all__ = ["ChatCompletionsResource", "CompletionsResource"]

JSON = "application/json"


def _never() -> bool:
    return False


def _disconnect_probe(req) -> Callable[[], bool]:
    return req.env.get("waitress.client_disconnected") or _never


class _GenerationResource:
    """The shared flow; subclasses parse, build choices and shape the output."""

    def __init__(self, ctx: ServerContext):
        self._ctx = ctx

    # --- per route ----------------------------------------------------------------------------
    def parse(self, body: dict[str, Any]):
        raise NotImplementedError

    def choices(self, served, params) -> list[Choice]:
        raise NotImplementedError

    def stream_chunks(self, served, gen: GenerationParams, created: int):
        raise NotImplementedError

    def body(self, served, gen: GenerationParams, choices: list[Choice], results: list,
             created: int) -> dict[str, Any]:
        raise NotImplementedError

    # --- shared flow ---------------------------------------------------------------------------
    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        ctx = self._ctx
        served = ctx.host.ready()
        params = self.parse(read_json_object(req, ctx.config.max_request_bytes))
        gen: GenerationParams = params.gen
        served.check_model(gen.model)
        choices = self.choices(served, params)
        disconnected = _disconnect_probe(req)
        created = int(time.time())
        group = HandleGroup(served.engine, choices)
        try:
            group.await_admission(disconnected)
            if gen.stream:
                resp.content_type = "text/event-stream"
                resp.set_header("Cache-Control", "no-cache")
                resp.set_header("X-Accel-Buffering", "no")
                resp.stream = SseStream(group, self.stream_chunks(served, gen, created),
                                        include_usage=gen.include_usage,
                                        disconnected=disconnected,
                                        on_disconnect=ctx.metrics.count_disconnect)
                group = None  # the stream owns the engine requests now
                return
            results = group.collect(disconnected)
        except ClientGone:
            ctx.metrics.count_disconnect()
            raise ApiError(CLIENT_CLOSED, "the client closed the connection",
                           code="client_closed") from None
        finally:
            if group is not None:
                group.release()
        resp.content_type = JSON
        resp.media = self.body(served, gen, choices, results, created)


def _formatter(served, gen: GenerationParams) -> responses.LogprobFormatter | None:
    if gen.top_logprobs is None:
        return None
    return responses.LogprobFormatter(served.frontend.tokenizer)


def _usage(choices: list[Choice], results: list) -> dict[str, int]:
    return responses.usage(prompt_tokens_total(choices),
                           sum(r.completion_tokens for r in results))


def _finish_reason(final, result) -> str:
    return final.finish_reason or result.finish_reason


class ChatCompletionsResource(_GenerationResource):
    def parse(self, body):
        return parse_chat(body)

    def choices(self, served, params):
        return chat_choices(served, params, self._ctx.config.job_limits)

    def stream_chunks(self, served, gen, created):
        return ChatChunks(served.model_id, created, _formatter(served, gen))

    def body(self, served, gen, choices, results, created):
        fmt = _formatter(served, gen)
        out = []
        for choice, result in zip(choices, results):
            final = choice.session.message()
            out.append({
                "index": choice.index,
                "message": responses.chat_message(final),
                "logprobs": fmt.chat(result.token_ids, result.logprobs, result.top_logprobs)
                if fmt else None,
                "finish_reason": _finish_reason(final, result),
            })
        return responses.chat_completion(responses.new_id("chatcmpl"), created,
                                         served.model_id, out, _usage(choices, results))


class CompletionsResource(_GenerationResource):
    def parse(self, body):
        return parse_completion(body)

    def choices(self, served, params):
        return completion_choices(served, params, self._ctx.config.job_limits)

    def stream_chunks(self, served, gen, created):
        return CompletionChunks(served.model_id, created, _formatter(served, gen),
                                with_top=bool(gen.top_logprobs))

    def body(self, served, gen, choices, results, created):
        fmt = _formatter(served, gen)
        out = []
        for choice, result in zip(choices, results):
            final = choice.session.message()
            out.append({
                "index": choice.index,
                "text": final.content,
                "logprobs": fmt.completion(result.token_ids, result.logprobs,
                                           result.top_logprobs, with_top=bool(gen.top_logprobs))
                if fmt else None,
                "finish_reason": _finish_reason(final, result),
            })
        return responses.completion(responses.new_id("cmpl"), created, served.model_id, out,
                                    _usage(choices, results))
