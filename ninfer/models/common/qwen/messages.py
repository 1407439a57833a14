"""Validation of OpenAI-style chat messages before template rendering.

`normalize_messages` checks every message and returns fresh plain dicts in the shape the Qwen
chat template reads:

- roles ``system``, ``user``, ``assistant``, ``tool``;
- ``content``: a string, or a list of parts ``{"type": "text", "text": ...}`` (joined without a
  separator, as the Qwen template joins text parts) or ``{"type": "image_url", "image_url":
  {"url": ...}}`` (well-formed image parts are refused as unsupported until the vision
  frontend exists); an assistant message may have ``content: null`` (rendered as "");
- assistant ``tool_calls``: ``[{"id"?, "type": "function", "function": {"name", "arguments"}}]``
  where ``arguments`` is a JSON object or its JSON text; the template gets it as a mapping
  (it iterates ``arguments|items``);
- assistant ``reasoning_content`` (or ``reasoning``): optional string;
- tool messages: ``content`` plus an optional ``tool_call_id`` string.

Every problem raises `InvalidInput` whose `param` points at the field (``messages[2].content``).
"""
from __future__ import annotations

import json
from typing import Any

from ninfer.errors import InvalidInput

__all__ = ["normalize_messages"]

ROLES = ("system", "user", "assistant", "tool")


def _fail(message: str, param: str) -> InvalidInput:
    return InvalidInput(f"{param}: {message}", param=param)


def _text_content(content: Any, param: str, *, nullable: bool) -> str:
    if content is None and nullable:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _fail("must be a string or a list of content parts", param)
    texts = []
    for i, part in enumerate(content):
        where = f"{param}[{i}]"
        if not isinstance(part, dict):
            raise _fail("a content part must be an object", where)
        kind = part.get("type")
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise _fail("a text part needs a string 'text'", where)
            texts.append(part["text"])
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str) or not url:
                raise _fail("an image_url part needs 'image_url': {'url': ...}", where)
            raise _fail("image inputs are not supported by this model server yet", where)
        else:
            raise _fail(f"unsupported content part type {kind!r} (use 'text')", where)
    return "".join(texts)


def _arguments(raw: Any, param: str) -> dict[str, Any]:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except ValueError as exc:
            raise _fail(f"is not valid JSON ({exc})", param) from exc
    if not isinstance(raw, dict):
        raise _fail("must be a JSON object (or its JSON text)", param)
    return raw


def _tool_calls(calls: Any, param: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise _fail("must be a list", param)
    out = []
    for i, call in enumerate(calls):
        where = f"{param}[{i}]"
        if not isinstance(call, dict):
            raise _fail("must be an object", where)
        if call.get("type", "function") != "function":
            raise _fail("only type 'function' is supported", f"{where}.type")
        function = call.get("function")
        if not isinstance(function, dict):
            raise _fail("needs a 'function' object", f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise _fail("needs a non-empty string", f"{where}.function.name")
        arguments = _arguments(function.get("arguments", {}), f"{where}.function.arguments")
        normalized: dict[str, Any] = {
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        if call.get("id") is not None:
            if not isinstance(call["id"], str):
                raise _fail("must be a string", f"{where}.id")
            normalized["id"] = call["id"]
        out.append(normalized)
    return out


def _message(msg: Any, param: str) -> dict[str, Any]:
    if not isinstance(msg, dict):
        raise _fail("must be an object", param)
    role = msg.get("role")
    if role not in ROLES:
        raise _fail(f"role must be one of {', '.join(ROLES)}; got {role!r}", f"{param}.role")
    out: dict[str, Any] = {"role": role}
    if "name" in msg and msg["name"] is not None:
        if not isinstance(msg["name"], str):
            raise _fail("must be a string", f"{param}.name")
        out["name"] = msg["name"]
    has_calls = role == "assistant" and bool(msg.get("tool_calls"))
    if "content" not in msg and role != "assistant":
        raise _fail("is required", f"{param}.content")
    out["content"] = _text_content(
        msg.get("content"), f"{param}.content", nullable=role == "assistant"
    )
    if role == "assistant":
        reasoning = msg.get("reasoning_content", msg.get("reasoning"))
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise _fail("must be a string", f"{param}.reasoning_content")
            out["reasoning_content"] = reasoning
        if has_calls:
            out["tool_calls"] = _tool_calls(msg["tool_calls"], f"{param}.tool_calls")
    elif msg.get("tool_calls"):
        raise _fail("only assistant messages may carry tool_calls", f"{param}.tool_calls")
    if role == "tool" and msg.get("tool_call_id") is not None:
        if not isinstance(msg["tool_call_id"], str):
            raise _fail("must be a string", f"{param}.tool_call_id")
        out["tool_call_id"] = msg["tool_call_id"]
    return out


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Validate chat messages; return fresh dicts the template may read (never the input)."""
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("messages must be a non-empty list", param="messages")
    return [_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
