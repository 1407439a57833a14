"""QwenOutputSession: the text-aware OutputSession of the Qwen frontend.

Implements the runtime protocol (`ninfer.runtime.contract.output.OutputSession`):
``preview(token_ids, logprobs)`` decides on a clone of the parser state, ``commit(preview)``
installs that clone and returns the `OutputDelta` to publish, ``finish(reason)`` flushes
held-back text when the engine ends the request. Used by the engine worker thread only.

Token pipeline (per accepted token)::

    stop token id? --no--> IncrementalDetokenizer -> StopStringMatcher -> ReasoningSplitter
                                                     (content channel) -> ToolCallParser

A stop token id (EOS, request stop ids) ends the request; its text is not output. A stop
string ends it with the output truncated right before the string. Every stage holds back only
what it cannot decide yet, so published text is never retracted.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

from ninfer.models.common.qwen.channel import Channel
from ninfer.models.common.qwen.deltas import FinalOutput, OutputDelta, ToolCall, ToolCallDelta
from ninfer.models.common.qwen.detokenize import IncrementalDetokenizer
from ninfer.models.common.qwen.reasoning import ReasoningSplitter, ReasoningStart
from ninfer.models.common.qwen.stop import StopStringMatcher
from ninfer.models.common.qwen.tool_parser import ParserEvent, ToolCallParser
from ninfer.runtime.contract.output import OutputPreview

__all__ = ["QwenOutputSession"]


class _Pipeline:
    """Parser state of one session; `clone()` copies it for a preview."""

    __slots__ = ("detok", "stop", "split", "tools")

    def __init__(self, detok, stop, split, tools):
        self.detok: IncrementalDetokenizer = detok
        self.stop: StopStringMatcher = stop
        self.split: ReasoningSplitter = split
        self.tools: ToolCallParser | None = tools

    def clone(self) -> "_Pipeline":
        tools = self.tools.clone() if self.tools is not None else None
        return _Pipeline(self.detok.clone(), self.stop.clone(), self.split.clone(), tools)

    def route(self, text: str, out: list[ParserEvent]) -> None:
        """Text past the stop matcher -> channels and tool calls."""
        if text:
            self._split_events(self.split.feed(text), out)

    def _split_events(self, events, out: list[ParserEvent]) -> None:
        for channel, piece in events:
            if channel is Channel.CONTENT and self.tools is not None:
                out.extend(self.tools.feed(piece))
            else:
                out.append((channel, piece))

    def token(self, token_id: int, out: list[ParserEvent]) -> bool:
        """Feed one non-stop token; True when a stop string matched."""
        text = self.detok.feed(token_id)
        if not text:
            return False
        safe, matched = self.stop.feed(text)
        self.route(safe, out)
        return matched

    def end(self, out: list[ParserEvent], *, flush_text: bool) -> None:
        """End of output. `flush_text`: held text is output (False after a stop string)."""
        if flush_text:
            safe, matched = self.stop.feed(self.detok.flush())
            self.route(safe if matched else safe + self.stop.flush(), out)
        self._split_events(self.split.finish(), out)
        if self.tools is not None:
            out.extend(self.tools.finish())


@dataclasses.dataclass(frozen=True, slots=True)
class _Payload:
    version: int
    pipeline: _Pipeline
    events: tuple
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]


class QwenOutputSession:
    """Per-request output semantics. Construct through `QwenFrontend.new_session`.

    - `stop_token_ids`: ids that end the request (already resolved: EOS unless ignore_eos,
      plus the request's ids).
    - `forced_prefix`: text the prompt already holds that the output is parsed as if the model
      had written it (tool_choice required/named); its effect (e.g. the call's name) is
      published with the first delta.
    - `call_id_prefix`: tool call ids are ``call_<prefix><index>``.
    """

    def __init__(
        self,
        detokenizer: IncrementalDetokenizer,
        *,
        stop_strings: tuple[str, ...] = (),
        stop_token_ids: frozenset[int] = frozenset(),
        reasoning: ReasoningStart = ReasoningStart.OFF,
        tools: Mapping[str, Mapping[str, Any]] | None = None,
        forced_prefix: str = "",
        call_id_prefix: str = "",
    ):
        parser = ToolCallParser(tools, call_id_prefix) if tools is not None else None
        split = ReasoningSplitter(reasoning, tool_calls=parser is not None)
        self._pipe = _Pipeline(detokenizer, StopStringMatcher(stop_strings), split, parser)
        self._stop_ids = stop_token_ids
        self._version = 0
        self._finish_reason: str | None = None
        self._carry_events: list[ParserEvent] = []  # events not yet published
        self._carry_tokens: list[int] = []
        self._carry_logprobs: list[float] = []
        # the whole message, for non-streaming responses
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, list[Any]] = {}  # index -> [id, name, [argument fragments]]
        self._token_ids: list[int] = []
        self._logprobs: list[float] = []
        self._pipe.route(forced_prefix, self._carry_events)

    @property
    def finished(self) -> bool:
        return self._finish_reason is not None

    # --- OutputSession protocol -----------------------------------------------------------
    def preview(self, token_ids: Sequence[int], logprobs: Sequence[float]) -> OutputPreview:
        """Decide how many of `token_ids` to accept; changes no visible state."""
        if self.finished:
            raise RuntimeError("preview() on a finished output session")
        pipe = self._pipe.clone()
        events: list[ParserEvent] = []
        accepted, reason = 0, None
        for tid in token_ids:
            accepted += 1
            if tid in self._stop_ids:
                pipe.end(events, flush_text=True)
                reason = "stop"
                break
            if pipe.token(tid, events):
                pipe.end(events, flush_text=False)
                reason = "stop"
                break
        payload = _Payload(
            self._version, pipe, tuple(events),
            tuple(token_ids[:accepted]), tuple(logprobs[:accepted]),
        )
        return OutputPreview(accepted, reason, payload)

    def commit(self, preview: OutputPreview) -> OutputDelta | None:
        """Make `preview` the session's state; return the delta to publish, or None when
        nothing became visible (its tokens then ride on the next delta)."""
        payload = preview.payload
        if not isinstance(payload, _Payload) or payload.version != self._version:
            raise RuntimeError("commit() of a preview that is stale or from another session")
        self._pipe = payload.pipeline
        self._version += 1
        self._carry_events.extend(payload.events)
        self._carry_tokens.extend(payload.token_ids)
        self._carry_logprobs.extend(payload.logprobs)
        return self._publish(preview.finish_reason)

    def finish(self, finish_reason: str) -> OutputDelta | None:
        """The engine ended the request (length, cancellation, ...): flush and close.

        Returns the final delta, or None when the session had already finished itself.
        """
        if self.finished:
            return None
        self._version += 1  # outstanding previews are void
        self._pipe.end(self._carry_events, flush_text=True)
        return self._publish(finish_reason)

    # --- results ----------------------------------------------------------------------------
    def message(self) -> FinalOutput:
        """Everything published so far, as one message (non-streaming responses)."""
        calls = tuple(
            ToolCall(index, cid, name, "".join(args))
            for index, (cid, name, args) in sorted(self._calls.items())
        )
        return FinalOutput(
            content="".join(self._content),
            reasoning_content="".join(self._reasoning),
            tool_calls=calls,
            token_ids=tuple(self._token_ids),
            logprobs=tuple(self._logprobs),
            finish_reason=self._finish_reason,
        )

    def _publish(self, finish_reason: str | None) -> OutputDelta | None:
        if finish_reason == "stop" and self._pipe.tools is not None and self._pipe.tools.calls:
            finish_reason = "tool_calls"
        if not self._carry_events and finish_reason is None:
            return None
        delta = _merge(self._carry_events, finish_reason, self._carry_tokens, self._carry_logprobs)
        if not delta.has_text and finish_reason is None:
            return None
        self._carry_events.clear()
        self._carry_tokens.clear()
        self._carry_logprobs.clear()
        self._record(delta)
        return delta

    def _record(self, delta: OutputDelta) -> None:
        self._content.append(delta.content)
        self._reasoning.append(delta.reasoning)
        for call in delta.tool_calls:
            if call.id is not None:
                self._calls[call.index] = [call.id, call.name, []]
            self._calls[call.index][2].append(call.arguments)
        self._token_ids.extend(delta.token_ids)
        self._logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            self._finish_reason = delta.finish_reason


def _merge(events: Sequence[ParserEvent], finish_reason: str | None,
           token_ids: Sequence[int], logprobs: Sequence[float]) -> OutputDelta:
    """Fold parser events into one delta; argument fragments of one call are joined."""
    content: list[str] = []
    reasoning: list[str] = []
    calls: list[ToolCallDelta] = []
    for event in events:
        if isinstance(event, ToolCallDelta):
            last = calls[-1] if calls else None
            if last is not None and event.id is None and last.index == event.index:
                calls[-1] = dataclasses.replace(last, arguments=last.arguments + event.arguments)
            else:
                calls.append(event)
        elif event[0] is Channel.CONTENT:
            content.append(event[1])
        else:
            reasoning.append(event[1])
    return OutputDelta(
        content="".join(content),
        reasoning="".join(reasoning),
        tool_calls=tuple(calls),
        token_ids=tuple(token_ids),
        logprobs=tuple(logprobs),
        finish_reason=finish_reason,
    )
