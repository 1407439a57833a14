"""Validation of a request's `tools` and `tool_choice`.

`tool_choice` semantics:
- ``"none"``: tools stay in the prompt (the model still sees the conversation's tool context,
  as in vLLM's default) but the output is not parsed for calls: ``<tool_call>`` is content.
- ``"auto"`` (default): calls are parsed.
- ``"required"``: the generation prompt is pre-filled with ``<tool_call>\\n``.
- ``{"type": "function", "function": {"name": N}}``: pre-filled with
  ``<tool_call>\\n<function=N>\\n``; N must be one of the tools.
"""
from __future__ import annotations

import copy
import re
import types
from typing import Any, Mapping

from ninfer.errors import InvalidInput
from ninfer.models.common.qwen.prompt import ToolChoice, ToolChoiceMode

__all__ = ["normalize_tools", "normalize_tool_choice", "tool_prefix"]

# OpenAI's function-name rule, plus '.' and ':' (namespaced MCP tools); nothing that could
# break the XML call format.
_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")


def normalize_tools(tools: Any) -> tuple[list[dict[str, Any]], Mapping[str, Mapping[str, Any]]]:
    """Validate `tools`; return (deep-copied tool list for the template, name -> parameters
    schema as a read-only mapping)."""
    if tools is None:
        return [], types.MappingProxyType({})
    if not isinstance(tools, list):
        raise InvalidInput("tools must be a list", param="tools")
    listed: list[dict[str, Any]] = []
    schemas: dict[str, Mapping[str, Any]] = {}
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise InvalidInput(
                f"{where} must be {{'type': 'function', 'function': ...}}", param=where
            )
        function = tool.get("function")
        if not isinstance(function, dict):
            raise InvalidInput(f"{where}.function must be an object", param=f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise InvalidInput(
                f"{where}.function.name must match [A-Za-z0-9_.:-]{{1,128}}, got {name!r}",
                param=f"{where}.function.name",
            )
        if name in schemas:
            raise InvalidInput(f"duplicate tool name {name!r}", param=f"{where}.function.name")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise InvalidInput(
                f"{where}.function.description must be a string",
                param=f"{where}.function.description",
            )
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise InvalidInput(
                f"{where}.function.parameters must be a JSON schema object",
                param=f"{where}.function.parameters",
            )
        clean = copy.deepcopy({"type": "function", "function": function})
        listed.append(clean)
        schemas[name] = clean["function"].get("parameters", parameters)
    return listed, types.MappingProxyType(schemas)


def normalize_tool_choice(choice: Any, tool_names: frozenset[str] | set[str]) -> ToolChoice:
    if choice is None or choice == "auto":
        return ToolChoice(ToolChoiceMode.AUTO)
    if choice == "none":
        return ToolChoice(ToolChoiceMode.NONE)
    if choice == "required":
        if not tool_names:
            raise InvalidInput("tool_choice 'required' needs tools", param="tool_choice")
        return ToolChoice(ToolChoiceMode.REQUIRED)
    if isinstance(choice, dict) and choice.get("type") == "function":
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise InvalidInput("tool_choice.function.name must be a string", param="tool_choice")
        if name not in tool_names:
            raise InvalidInput(f"tool_choice names unknown tool {name!r}", param="tool_choice")
        return ToolChoice(ToolChoiceMode.NAMED, name)
    raise InvalidInput(
        "tool_choice must be 'none', 'auto', 'required' or "
        "{'type': 'function', 'function': {'name': ...}}",
        param="tool_choice",
    )


def tool_prefix(choice: ToolChoice) -> str:
    """The output text a tool choice forces (pre-filled into the prompt)."""
    if choice.mode is ToolChoiceMode.REQUIRED:
        return "<tool_call>\n"
    if choice.mode is ToolChoiceMode.NAMED:
        return f"<tool_call>\n<function={choice.name}>\n"
    return ""
