"""ChatTemplate: a Hugging Face style chat template rendered in a jinja2 sandbox.

The environment matches what transformers gives templates (``trim_blocks``, ``lstrip_blocks``,
the ``loopcontrols`` extension, a ``tojson`` filter with ``ensure_ascii=False``, a
``raise_exception`` global) inside an `ImmutableSandboxedEnvironment`: a template cannot reach
Python internals or mutate the request's data. Rendering is deterministic: there is no
``strftime_now`` (a template calling it fails with `InvalidInput`).
"""
from __future__ import annotations

import importlib.resources
import json
from typing import Any, Mapping

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ninfer.errors import InvalidInput
from ninfer.models.common.qwen.messages import normalize_messages

__all__ = ["ChatTemplate", "check_template_kwargs", "default_chat_template"]

# Names the renderer sets itself; chat_template_kwargs may not override them.
_RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "raise_exception"})
MAX_KWARGS = 32


def check_template_kwargs(kwargs: Any) -> dict[str, Any]:
    """Validate a request's chat_template_kwargs: an object of at most MAX_KWARGS variables,
    none of them a name the renderer sets itself."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise InvalidInput("chat_template_kwargs must be an object", param="chat_template_kwargs")
    bad = _RESERVED.intersection(kwargs)
    if bad:
        raise InvalidInput(
            f"chat_template_kwargs may not set {', '.join(sorted(bad))}",
            param="chat_template_kwargs",
        )
    if len(kwargs) > MAX_KWARGS:
        raise InvalidInput("too many chat_template_kwargs", param="chat_template_kwargs")
    return dict(kwargs)


class _TemplateRaised(Exception):
    """raise_exception() inside a template."""


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def default_chat_template() -> str:
    """The Qwen3.5 chat template shipped with the package (``chat_template.jinja``)."""
    return importlib.resources.files(__package__).joinpath("chat_template.jinja").read_text("utf-8")


class ChatTemplate:
    """A compiled chat template; immutable and thread-safe after construction."""

    def __init__(self, source: str):
        if not isinstance(source, str) or not source.strip():
            raise InvalidInput("the chat template is empty", param="chat_template")
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            autoescape=False,
            keep_trailing_newline=False,
            extensions=[jinja2.ext.loopcontrols],
            undefined=jinja2.Undefined,
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise InvalidInput(
                f"the chat template does not compile: {exc.message} (line {exc.lineno})",
                param="chat_template",
            ) from exc
        self.source = source

    def render(
        self,
        messages: Any,
        /,
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **chat_template_kwargs: Any,
    ) -> str:
        """Validate `messages` (see `messages.normalize_messages`) and render them.

        `tools` must already be validated (`tools.normalize_tools`). Extra keyword arguments
        (e.g. ``enable_thinking=False``) are template variables. Any template failure, a
        `raise_exception` call included, raises `InvalidInput`.
        """
        normalized = normalize_messages(messages)
        context = check_template_kwargs(chat_template_kwargs)
        context["messages"] = normalized
        context["add_generation_prompt"] = bool(add_generation_prompt)
        if tools:
            context["tools"] = tools
        try:
            return self._template.render(**context)
        except _TemplateRaised as exc:
            raise InvalidInput(f"the chat template rejected the request: {exc}",
                               param="messages") from exc
        except Exception as exc:  # any failure of the template's own logic is the request's
            raise InvalidInput(f"the chat template failed to render: {exc}",
                               param="messages") from exc
