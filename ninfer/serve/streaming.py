"""Server-sent events for streamed chat and text completions.

`SseStream` is the WSGI response iterable. It turns the engine events of a `HandleGroup` into
``data: {chunk}\\n\\n`` lines and ends with ``data: [DONE]\\n\\n``:

- chat: a first chunk per choice with ``role`` (and empty content), one chunk per published
  `OutputDelta` (``content`` / ``reasoning_content`` / ``tool_calls``), the finish reason on
  the choice's last chunk (taken from the frontend's final delta, so tool calls finish with
  ``tool_calls``), then a usage chunk (``choices: []``) when ``stream_options.include_usage``;
- text completions: the same with ``text``.

A request that fails after its stream began (deadline, engine shutdown) gets one
``data: {"error": {...}}`` event, then [DONE]. The WSGI server calls `close()` when the
exchange ends; if the stream did not finish by then the client went away: every engine request
of the group is cancelled and the disconnect is counted. waitress calls `close()` when a write
fails, and the stream also stops when ``waitress.client_disconnected`` reports a disconnect.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Iterator

from ninfer.runtime.events import GenerationFailed, GenerationFinished, OutputEvent
from ninfer.serve import responses
from ninfer.serve.errors import ApiError, api_error_from
from ninfer.serve.handles import ClientGone, HandleGroup
from ninfer.serve.jobs import prompt_tokens_total

__all__ = ["SseStream", "ChatChunks", "CompletionChunks", "sse_data"]

DONE = b"data: [DONE]\n\n"


def sse_data(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode("utf-8") + b"\n\n"


class _ChoiceState:
    __slots__ = ("pending", "finished", "offset")

    def __init__(self) -> None:
        self.pending: list[tuple] = []  # (token id, logprob, top) not yet covered by a delta
        self.finished = False  # its finish_reason was sent
        self.offset = 0  # text offset (completions logprobs)

    def take(self, count: int | None) -> tuple[list, list, list]:
        """The first `count` pending tokens (all with None) as (ids, logprobs, tops)."""
        taken = self.pending if count is None else self.pending[:count]
        self.pending = [] if count is None else self.pending[count:]
        return [t[0] for t in taken], [t[1] for t in taken], [t[2] for t in taken]


class ChatChunks:
    """Chunk builder of a streamed chat completion."""

    object_prefix = "chatcmpl"

    def __init__(self, model: str, created: int, logprobs: responses.LogprobFormatter | None):
        self.id = responses.new_id(self.object_prefix)
        self._model, self._created, self._logprobs = model, created, logprobs

    def _chunk(self, choices: list[dict], usage: dict | None = None) -> dict:
        return responses.chat_chunk(self.id, self._created, self._model, choices, usage)

    def opening(self, count: int) -> list[dict]:
        return [self._chunk([{"index": i, "delta": responses.chat_delta(None, first=True),
                              "logprobs": None, "finish_reason": None}])
                for i in range(count)]

    def output(self, index: int, delta, state: _ChoiceState, finish_reason: str | None) -> dict:
        ids, lps, tops = state.take(len(delta.token_ids) if finish_reason is None else None)
        logprobs = self._logprobs.chat(ids, lps, tops) if self._logprobs else None
        return self._chunk([{"index": index, "delta": responses.chat_delta(delta, first=False),
                             "logprobs": logprobs, "finish_reason": finish_reason}])

    def usage(self, usage: dict) -> dict:
        return self._chunk([], usage)


class CompletionChunks(ChatChunks):
    """Chunk builder of a streamed text completion."""

    object_prefix = "cmpl"

    def __init__(self, model: str, created: int, logprobs: responses.LogprobFormatter | None,
                 with_top: bool):
        super().__init__(model, created, logprobs)
        self._with_top = with_top

    def _chunk(self, choices: list[dict], usage: dict | None = None) -> dict:
        return responses.completion_chunk(self.id, self._created, self._model, choices, usage)

    def opening(self, count: int) -> list[dict]:
        return []

    def output(self, index: int, delta, state: _ChoiceState, finish_reason: str | None) -> dict:
        ids, lps, tops = state.take(len(delta.token_ids) if finish_reason is None else None)
        logprobs = None
        if self._logprobs is not None:
            logprobs = self._logprobs.completion(ids, lps, tops, with_top=self._with_top,
                                                 offset=state.offset)
            state.offset += sum(len(t) for t in logprobs["tokens"])
        text = delta.content if delta is not None else ""
        return self._chunk([{"index": index, "text": text, "logprobs": logprobs,
                             "finish_reason": finish_reason}])


class SseStream:
    """The WSGI iterable of one streamed response (owns `group` from now on)."""

    def __init__(self, group: HandleGroup, chunks: ChatChunks, *, include_usage: bool,
                 disconnected: Callable[[], bool], on_disconnect: Callable[[], None]):
        self._group = group
        self._chunks = chunks
        self._include_usage = include_usage
        self._disconnected = disconnected
        self._on_disconnect = on_disconnect
        self._completed = False
        self._closed = False
        self._gen = self._generate()

    def __iter__(self) -> Iterator[bytes]:
        return self._gen

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._gen.close()
        self._group.release()
        if not self._completed:
            self._on_disconnect()

    def _generate(self) -> Iterator[bytes]:
        count = len(self._group.choices)
        for chunk in self._chunks.opening(count):
            yield sse_data(chunk)
        states = [_ChoiceState() for _ in range(count)]
        completion_tokens = 0
        try:
            for index, event in self._group.events(self._disconnected):
                if isinstance(event, OutputEvent):
                    chunk = self._on_output(index, event, states[index])
                elif isinstance(event, GenerationFinished):
                    completion_tokens += event.result.completion_tokens
                    chunk = self._on_finished(index, event, states[index])
                elif isinstance(event, GenerationFailed):
                    yield sse_data(_error_of(event).body())
                    break
                else:  # GenerationStart
                    continue
                if chunk is not None:
                    yield sse_data(chunk)
            else:
                if self._include_usage:
                    usage = responses.usage(prompt_tokens_total(self._group.choices),
                                            completion_tokens)
                    yield sse_data(self._chunks.usage(usage))
        except ClientGone:
            return  # close() counts the disconnect
        self._group.release()
        yield DONE
        self._completed = True

    def _on_output(self, index: int, event: OutputEvent, state: _ChoiceState) -> dict | None:
        state.pending.extend(zip(event.token_ids, event.logprobs, event.top_logprobs))
        delta = event.delta
        if delta is None:
            return None
        if delta.finish_reason is not None:
            state.finished = True
        return self._chunks.output(index, delta, state, delta.finish_reason)

    def _on_finished(self, index: int, event: GenerationFinished,
                     state: _ChoiceState) -> dict | None:
        if state.finished:
            return None
        state.finished = True
        final = event.result.final_delta
        reason = final.finish_reason if final is not None and final.finish_reason \
            else event.result.finish_reason
        return self._chunks.output(index, final, state, reason)


def _error_of(event: GenerationFailed) -> ApiError:
    return api_error_from(event.error) or ApiError(500, "the request failed")
