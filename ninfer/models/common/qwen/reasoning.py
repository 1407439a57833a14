"""Reasoning split: route output text into the reasoning channel or the content channel.

Rules (Qwen3.5 chat format):
- ``<think>`` … ``</think>`` is reasoning; the markers themselves are not text.
- A prompt that ends inside an open ``<think>`` block (thinking on) starts in reasoning.
- With no ``<think>`` in the prompt, the output may open one itself, before any other text.
- ``<tool_call>`` (when tool calls are parsed) implicitly ends reasoning; the marker and what
  follows go on to the content channel, where the tool-call parser takes them.
- With the reasoning split off (thinking disabled by a closed empty block in the prompt, or a
  raw completion) everything is content, markers included.
- Whitespace around the markers is template formatting and is dropped (see `WhitespaceEdge`).
"""
from __future__ import annotations

import enum

from ninfer.models.common.qwen.channel import Channel, TextEvent, WhitespaceEdge
from ninfer.models.common.qwen.textscan import find_first, partial_suffix_len, shallow_clone

__all__ = ["ReasoningSplitter", "ReasoningStart"]

THINK = "<think>"
THINK_END = "</think>"
TOOL_CALL = "<tool_call>"


class ReasoningStart(enum.Enum):
    """Where the output starts, decided from the prompt."""

    OFF = "off"  # no reasoning channel: all text is content
    OPEN = "open"  # the prompt ends inside <think>: output starts in reasoning
    DETECT = "detect"  # the output may open <think> before anything else


class _Mode(enum.Enum):
    DETECT = 0
    REASONING = 1
    CONTENT = 2


class ReasoningSplitter:
    """Streaming splitter; fields are immutable or cloned, so `clone()` is cheap."""

    def __init__(self, start: ReasoningStart, *, tool_calls: bool):
        self._end_markers = (THINK_END, TOOL_CALL) if tool_calls else (THINK_END,)
        self._mode = {
            ReasoningStart.OFF: _Mode.CONTENT,
            ReasoningStart.OPEN: _Mode.REASONING,
            ReasoningStart.DETECT: _Mode.DETECT,
        }[start]
        self._buf = ""  # text not yet routed (a possible partial marker)
        self._edge = WhitespaceEdge()  # reasoning-channel whitespace
        self._strip_content = False  # drop content's leading whitespace (right after </think>)

    def clone(self) -> "ReasoningSplitter":
        twin = shallow_clone(self)
        twin._edge = self._edge.clone()
        return twin

    @property
    def in_reasoning(self) -> bool:
        return self._mode is _Mode.REASONING

    def feed(self, text: str) -> list[TextEvent]:
        out: list[TextEvent] = []
        self._buf += text
        while self._buf:
            if self._mode is _Mode.CONTENT:
                self._content(self._buf, out)
                self._buf = ""
            elif self._mode is _Mode.DETECT:
                if not self._detect():
                    break
            elif not self._reasoning(out):
                break
        return out

    def finish(self) -> list[TextEvent]:
        """End of output: held text goes to its channel."""
        out: list[TextEvent] = []
        buf, self._buf = self._buf, ""
        if self._mode is _Mode.REASONING:
            self._emit(Channel.REASONING, self._edge.text(buf), out)
            self._emit(Channel.REASONING, self._edge.flush(), out)
        elif buf:
            self._mode = _Mode.CONTENT
            self._content(buf, out)
        return out

    # --- states ----------------------------------------------------------------------------
    def _detect(self) -> bool:
        """Decide whether the output opens <think>; False when more text is needed."""
        body = self._buf.lstrip()
        if body.startswith(THINK):
            self._buf = body[len(THINK):]
            self._mode = _Mode.REASONING
            return True
        if THINK.startswith(body):  # empty or a partial marker
            return False
        self._mode = _Mode.CONTENT
        return True

    def _reasoning(self, out: list[TextEvent]) -> bool:
        at, marker = find_first(self._buf, self._end_markers)
        if marker is None:
            keep = partial_suffix_len(self._buf, self._end_markers)
            cut = len(self._buf) - keep
            self._emit(Channel.REASONING, self._edge.text(self._buf[:cut]), out)
            self._buf = self._buf[cut:]
            return False
        self._emit(Channel.REASONING, self._edge.text(self._buf[:at]), out)
        self._edge.marker(strip_next=False)
        self._mode = _Mode.CONTENT
        if marker == THINK_END:
            self._buf = self._buf[at + len(THINK_END):]
            self._strip_content = True
        else:  # <tool_call> ends thinking and belongs to the content channel
            self._buf = self._buf[at:]
        return True

    def _content(self, text: str, out: list[TextEvent]) -> None:
        if self._strip_content:
            text = text.lstrip()
            if not text:
                return
            self._strip_content = False
        self._emit(Channel.CONTENT, text, out)

    @staticmethod
    def _emit(channel: Channel, text: str, out: list[TextEvent]) -> None:
        if text:
            out.append((channel, text))
