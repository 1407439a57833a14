"""What a QwenOutputSession publishes: per-step deltas and the final message.

Field names follow the OpenAI chat API (`content`, `reasoning_content`, `tool_calls`); the
server maps them onto its response schemas.
"""
from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["ToolCallDelta", "OutputDelta", "ToolCall", "FinalOutput"]


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """One piece of a streamed tool call (OpenAI ``choices[].delta.tool_calls[]``).

    The first delta of call `index` carries `id` and `name` (and ``arguments == ""``); later
    ones carry only argument fragments. All fragments of one call, concatenated, form a JSON
    object string.
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def to_openai(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index}
        function: dict[str, Any] = {"arguments": self.arguments}
        if self.id is not None:
            out["id"] = self.id
            out["type"] = "function"
        if self.name is not None:
            function["name"] = self.name
        out["function"] = function
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class OutputDelta:
    """Visible change of one commit (or of `finish`).

    `token_ids`/`logprobs` are the tokens accepted since the previous delta (a commit whose text
    is all held back publishes nothing; its tokens ride on the next delta). `finish_reason` is
    set on the last delta only: ``"stop"``, ``"tool_calls"`` (stopped normally after at least
    one tool call), or the engine's reason (``"length"``, ...).
    """

    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    finish_reason: str | None = None

    @property
    def has_text(self) -> bool:
        """Whether it changes the visible message (text or tool calls)."""
        return bool(self.content or self.reasoning or self.tool_calls)


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCall:
    """A complete tool call of the final message; `arguments` is a JSON object string."""

    index: int
    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclasses.dataclass(frozen=True, slots=True)
class FinalOutput:
    """The whole message so far (for non-streaming responses): the sum of all deltas."""

    content: str
    reasoning_content: str
    tool_calls: tuple[ToolCall, ...]
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str | None
