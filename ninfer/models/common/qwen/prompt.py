"""PreparedPrompt: what the frontend hands the engine for one request."""
from __future__ import annotations

import dataclasses
import enum
import types
from typing import Any, Mapping

from ninfer.errors import InvalidInput
from ninfer.models.common.qwen.reasoning import ReasoningStart

__all__ = ["PreparedPrompt", "ToolChoice", "ToolChoiceMode"]


class ToolChoiceMode(enum.Enum):
    NONE = "none"  # tools stay in the prompt; the output is not parsed for calls
    AUTO = "auto"
    REQUIRED = "required"  # the output is pre-filled with "<tool_call>\n"
    NAMED = "named"  # pre-filled with "<tool_call>\n<function=NAME>\n"


@dataclasses.dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: ToolChoiceMode = ToolChoiceMode.AUTO
    name: str | None = None  # the function of a NAMED choice


@dataclasses.dataclass(frozen=True, slots=True)
class PreparedPrompt:
    """An owning, immutable prompt.

    - `token_ids`: the full prompt the model is fed, forced prefix included.
    - `prompt_text`: the rendered text (forced prefix included), or None for a token-id
      prompt.
    - `reasoning`: where the output starts (`ReasoningStart`): OPEN when the rendered prompt
      ends inside an open ``<think>`` block, OFF when the reasoning split does not apply
      (thinking disabled, raw completions), DETECT when the output may open ``<think>``.
    - `tools`: tool name -> its parameters JSON schema (a read-only mapping the prompt owns;
      empty without tools).
    - `tool_choice`: how tool calls are handled.
    - `forced_prefix`: text appended to the prompt that the output session treats as if the
      model had produced it (tool_choice required/named), or "".
    """

    token_ids: tuple[int, ...]
    prompt_text: str | None = None
    reasoning: ReasoningStart = ReasoningStart.OFF
    tools: Mapping[str, Mapping[str, Any]] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({})
    )
    tool_choice: ToolChoice = ToolChoice()
    forced_prefix: str = ""

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise InvalidInput("the prompt is empty", param="prompt")

    @property
    def thinking_open(self) -> bool:
        """The output starts in the reasoning channel."""
        return self.reasoning is ReasoningStart.OPEN

    @property
    def parse_tool_calls(self) -> bool:
        """Whether `<tool_call>` in the output is parsed (tools given, choice not none)."""
        return bool(self.tools) and self.tool_choice.mode is not ToolChoiceMode.NONE

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)
