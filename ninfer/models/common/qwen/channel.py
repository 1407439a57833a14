"""Text events the output parsers pass along, and whitespace handling at channel edges.

Whitespace that touches a marker (``<think>\\n`` … ``\\n</think>\\n\\n`` …
``\\n\\n<tool_call>``) is formatting of the chat template, not text: a `WhitespaceEdge` drops
it at the start of a segment and holds trailing whitespace until it is known whether more text
(keep it) or a marker (drop it) follows.
"""
from __future__ import annotations

import enum

from ninfer.models.common.qwen.textscan import shallow_clone

__all__ = ["Channel", "TextEvent", "WhitespaceEdge"]


class Channel(enum.Enum):
    CONTENT = "content"
    REASONING = "reasoning"


TextEvent = tuple[Channel, str]


class WhitespaceEdge:
    """Per-segment whitespace policy; immutable fields, so copy by `clone()`."""

    def __init__(self, at_start: bool = True):
        self.at_start = at_start  # drop leading whitespace until the first non-space
        self.held = ""  # trailing whitespace not yet emitted

    def clone(self) -> "WhitespaceEdge":
        return shallow_clone(self)

    def text(self, piece: str) -> str:
        """Text of `piece` that can be emitted now."""
        if self.at_start:
            piece = piece.lstrip()
            if not piece:
                return ""
            self.at_start = False
        piece = self.held + piece
        core = piece.rstrip()
        self.held = piece[len(core):]
        return core

    def marker(self, *, strip_next: bool) -> None:
        """A marker ends the segment: held whitespace is dropped."""
        self.held = ""
        self.at_start = strip_next

    def flush(self) -> str:
        """End of output: held whitespace is text after all."""
        held, self.held = self.held, ""
        return held
