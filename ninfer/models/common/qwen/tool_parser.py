"""Streaming parser of Qwen3.5 XML tool calls in the content channel.

Format (several calls separated by newlines)::

    <tool_call>
    <function=NAME>
    <parameter=P>
    VALUE
    </parameter>
    </function>
    </tool_call>

Output events are content text ``(Channel.CONTENT, str)`` and `ToolCallDelta`s. Call `index`
counts 0, 1, ... The first delta of a call (id + name) goes out once ``<function=NAME>`` is
complete; argument fragments follow as they arrive and concatenate to a JSON object:
``{"P": `` when a parameter name is complete, then for a string parameter its JSON-escaped
text piece by piece and the closing quote, for a typed one the JSON value once the value is
complete (`tool_values`), and ``}`` at ``</function>``. A value is the text between
``<parameter=P>`` and ``</parameter>`` minus exactly one leading and one trailing newline; it
also ends at ``</function>`` or ``</tool_call>`` when the model forgets ``</parameter>``.

Recovery: text after ``<tool_call>`` that does not start ``<function=NAME>`` turns back into
content (nothing of the call was published yet); once the name is out, stray text between
tags is skipped and a call left open at the end of output is completed (`finish`).
"""
from __future__ import annotations

import enum
import json
from typing import Any, Mapping, Union

from ninfer.models.common.qwen.channel import Channel, TextEvent, WhitespaceEdge
from ninfer.models.common.qwen.deltas import ToolCallDelta
from ninfer.models.common.qwen.textscan import find_first, partial_suffix_len, shallow_clone
from ninfer.models.common.qwen.tool_values import ParamType, convert_value, param_type

__all__ = ["ToolCallParser", "ParserEvent"]

ParserEvent = Union[TextEvent, ToolCallDelta]

TOOL_CALL = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
FUNCTION = "<function="
FUNCTION_END = "</function>"
PARAMETER = "<parameter="
PARAMETER_END = "</parameter>"
_BETWEEN_TAGS = (PARAMETER, FUNCTION_END, TOOL_CALL_END)
_VALUE_ENDS = (PARAMETER_END, FUNCTION_END, TOOL_CALL_END)
_MAX_NAME_CHARS = 256


class _Mode(enum.Enum):
    TEXT = 0  # ordinary content; watching for <tool_call>
    CALL_START = 1  # after <tool_call>: expecting <function=NAME>
    BETWEEN = 2  # inside a function, between parameters
    VALUE = 3  # inside a parameter value
    AFTER_FUNCTION = 4  # after </function>: expecting </tool_call>


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _tag_name(body: str, tag: str) -> tuple[str | None, int]:
    """Parse ``TAG NAME>`` at the start of `body`: (name, chars used), (None, 0) when more
    text is needed, ("", chars) when it is not a valid name."""
    end = body.find(">", len(tag))
    raw = body[len(tag): end if end >= 0 else len(body)]
    if "<" in raw or "\n" in raw or len(raw) > _MAX_NAME_CHARS:
        return "", len(tag)
    if end < 0:
        return None, 0
    return raw.strip(), end + 1


class ToolCallParser:
    """Per-request parser state. All fields are immutable values (or cloned), so `clone()` is
    a cheap copy; `tools` (name -> parameters JSON schema) is shared read-only."""

    def __init__(self, tools: Mapping[str, Mapping[str, Any]], id_prefix: str):
        self._tools = tools
        self._id_prefix = id_prefix
        self._mode = _Mode.TEXT
        self._buf = ""  # text not yet consumed
        self._edge = WhitespaceEdge(at_start=False)  # content whitespace next to calls
        self._raw = ""  # consumed text of a call whose name is not out yet
        self._index = 0  # calls published so far
        self._schema: Mapping[str, Any] | None = None  # parameters schema of the open call
        self._nparams = 0
        self._ptype: ParamType | None = None
        self._value = ""  # typed value text collected so far
        self._value_start = False  # one leading newline of the value may still be dropped

    def clone(self) -> "ToolCallParser":
        twin = shallow_clone(self)
        twin._edge = self._edge.clone()
        return twin

    @property
    def calls(self) -> int:
        """Number of tool calls published (started) so far."""
        return self._index

    def feed(self, text: str) -> list[ParserEvent]:
        out: list[ParserEvent] = []
        self._buf += text
        step = {
            _Mode.TEXT: self._text,
            _Mode.CALL_START: self._call_start,
            _Mode.BETWEEN: self._between,
            _Mode.VALUE: self._value_text,
            _Mode.AFTER_FUNCTION: self._after_function,
        }
        while self._buf and step[self._mode](out):
            pass
        return out

    def finish(self) -> list[ParserEvent]:
        """End of output: held content is emitted; an open call is completed."""
        out: list[ParserEvent] = []
        buf, self._buf = self._buf, ""
        if self._mode is _Mode.TEXT:
            self._content(buf, out)
        elif self._mode is _Mode.CALL_START:
            self._content(self._raw + buf, out)
        elif self._mode is _Mode.VALUE:
            if self._value_start and buf.startswith("\n"):
                buf = buf[1:]
            buf = buf[: len(buf) - partial_suffix_len(buf, _VALUE_ENDS)]
            self._end_value(buf[:-1] if buf.endswith("\n") else buf, out)
            self._close_object(out)
        elif self._mode is _Mode.BETWEEN:
            self._close_object(out)
        self._mode = _Mode.TEXT
        flushed = self._edge.flush()
        if flushed:
            out.append((Channel.CONTENT, flushed))
        return out

    # --- states: each consumes from _buf; False when it needs more text ------------------
    def _text(self, out: list[ParserEvent]) -> bool:
        at, marker = find_first(self._buf, (TOOL_CALL,))
        if marker is None:
            cut = len(self._buf) - partial_suffix_len(self._buf, (TOOL_CALL,))
            self._content(self._buf[:cut], out)
            self._buf = self._buf[cut:]
            return False
        self._content(self._buf[:at], out)
        self._buf = self._buf[at + len(TOOL_CALL):]
        self._raw = TOOL_CALL
        self._mode = _Mode.CALL_START
        return True

    def _call_start(self, out: list[ParserEvent]) -> bool:
        body = self._buf.lstrip()
        if not body.startswith(FUNCTION):
            if FUNCTION.startswith(body):
                return False
            return self._not_a_call(out)
        name, used = _tag_name(body, FUNCTION)
        if name is None:
            return False
        if not name or any(c.isspace() for c in name):  # tool names have no whitespace
            return self._not_a_call(out)
        self._edge.marker(strip_next=False)  # whitespace before the call is formatting
        out.append(ToolCallDelta(self._index, id=f"call_{self._id_prefix}{self._index}", name=name))
        self._index += 1
        self._schema = self._tools.get(name)
        self._nparams = 0
        self._buf = body[used:]
        self._raw = ""
        self._mode = _Mode.BETWEEN
        return True

    def _not_a_call(self, out: list[ParserEvent]) -> bool:
        """What followed <tool_call> is no call: the marker is content after all."""
        self._content(self._raw, out)
        self._raw = ""
        self._mode = _Mode.TEXT
        return True

    def _between(self, out: list[ParserEvent]) -> bool:
        body = self._buf.lstrip()
        self._buf = body
        if body.startswith(PARAMETER):
            name, used = _tag_name(body, PARAMETER)
            if name is None:
                return False
            if not name:
                return self._skip_junk()
            self._ptype = param_type(self._schema, name)
            head = ("{" if self._nparams == 0 else ", ") + _dumps(name) + ": "
            self._args(head + ('"' if self._ptype.is_string else ""), out)
            self._nparams += 1
            self._value = ""
            self._value_start = True
            self._buf = body[used:]
            self._mode = _Mode.VALUE
            return True
        if body.startswith(FUNCTION_END):
            self._buf = body[len(FUNCTION_END):]
            self._close_object(out)
            self._mode = _Mode.AFTER_FUNCTION
            return True
        if body.startswith(TOOL_CALL_END):
            self._buf = body[len(TOOL_CALL_END):]
            self._close_object(out)
            self._end_call()
            return True
        if not body or any(tag.startswith(body) for tag in _BETWEEN_TAGS):
            return False
        return self._skip_junk()

    def _value_text(self, out: list[ParserEvent]) -> bool:
        if self._value_start:
            if self._buf.startswith("\n"):
                self._buf = self._buf[1:]
            self._value_start = False
            if not self._buf:
                return False
        at, marker = find_first(self._buf, _VALUE_ENDS)
        if marker is None:
            cut = len(self._buf) - partial_suffix_len(self._buf, _VALUE_ENDS)
            if cut and self._buf[cut - 1] == "\n":
                cut -= 1  # may be the newline right before </parameter>
            self._value_piece(self._buf[:cut], out)
            self._buf = self._buf[cut:]
            return False
        piece = self._buf[:at]
        self._end_value(piece[:-1] if piece.endswith("\n") else piece, out)
        self._buf = self._buf[at + len(marker):]
        if marker == PARAMETER_END:
            self._mode = _Mode.BETWEEN
        else:
            self._close_object(out)
            if marker == FUNCTION_END:
                self._mode = _Mode.AFTER_FUNCTION
            else:
                self._end_call()
        return True

    def _after_function(self, out: list[ParserEvent]) -> bool:
        body = self._buf.lstrip()
        self._buf = body
        if body.startswith(TOOL_CALL_END):
            self._buf = body[len(TOOL_CALL_END):]
            self._end_call()
            return True
        if not body or TOOL_CALL_END.startswith(body) or FUNCTION.startswith(body):
            return False
        self._end_call()  # </tool_call> forgotten
        if body.startswith(FUNCTION):  # a second function inside one <tool_call>
            self._mode = _Mode.CALL_START
        return True

    # --- helpers -------------------------------------------------------------------------
    def _skip_junk(self) -> bool:
        nxt = self._buf.find("<", 1)
        self._buf = self._buf[nxt:] if nxt >= 0 else ""
        return True

    def _content(self, text: str, out: list[ParserEvent]) -> None:
        text = self._edge.text(text)
        if text:
            out.append((Channel.CONTENT, text))

    def _args(self, fragment: str, out: list[ParserEvent]) -> None:
        if fragment:
            out.append(ToolCallDelta(self._index - 1, arguments=fragment))

    def _value_piece(self, piece: str, out: list[ParserEvent]) -> None:
        if not piece:
            return
        if self._ptype.is_string:
            self._args(_dumps(piece)[1:-1], out)
        else:
            self._value += piece

    def _end_value(self, piece: str, out: list[ParserEvent]) -> None:
        self._value_piece(piece, out)
        if self._ptype.is_string:
            self._args('"', out)
        else:
            self._args(_dumps(convert_value(self._value, self._ptype)), out)
        self._value = ""

    def _close_object(self, out: list[ParserEvent]) -> None:
        self._args("}" if self._nparams else "{}", out)

    def _end_call(self) -> None:
        self._mode = _Mode.TEXT
        self._schema = None
        self._edge.marker(strip_next=True)  # whitespace after the call is formatting
