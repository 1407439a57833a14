"""The text stages on their own: stop strings, reasoning split, tool-call parser, value typing.

Each stage is fed text split at every character boundary and in every fixed chunk size; the
merged output must not depend on the split.
"""
from __future__ import annotations

import json
import random

import pytest

from ninfer.models.common.qwen.channel import Channel
from ninfer.models.common.qwen.deltas import ToolCallDelta
from ninfer.models.common.qwen.reasoning import ReasoningSplitter, ReasoningStart
from ninfer.models.common.qwen.stop import StopStringMatcher, validate_stop_strings
from ninfer.models.common.qwen.textscan import find_first, partial_suffix_len
from ninfer.models.common.qwen.tool_parser import ToolCallParser
from ninfer.models.common.qwen.tool_values import ParamType, convert_value, param_type
from ninfer.errors import InvalidInput

TOOLS = {
    "f": {"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "integer"},
                                            "o": {"type": "object"}, "b": {"type": "boolean"}}},
}


def splits(text: str):
    yield [text]
    for size in range(1, len(text) + 1):
        yield [text[i: i + size] for i in range(0, len(text), size)]
    for cut in range(1, len(text)):
        yield [text[:cut], text[cut:]]


def merge(events):
    """Events -> (content, reasoning, {index: (name, arguments)})."""
    content, reasoning, calls = [], [], {}
    for ev in events:
        if isinstance(ev, ToolCallDelta):
            name, args = calls.get(ev.index, (None, ""))
            calls[ev.index] = (ev.name or name, args + ev.arguments)
        elif ev[0] is Channel.CONTENT:
            content.append(ev[1])
        else:
            reasoning.append(ev[1])
    return "".join(content), "".join(reasoning), calls


def run_stage(make, pieces):
    stage = make()
    events = []
    for piece in pieces:
        decoy = stage.clone()  # a preview's clone: feeding it must not touch `stage`
        decoy.feed("<tool_call>\n<function=f>\n<parameter=s>\nDECOY</think><")
        decoy.finish()
        events.extend(stage.feed(piece))
    events.extend(stage.finish())
    return merge(events)


# --- textscan -----------------------------------------------------------------------------
def test_textscan_helpers():
    assert partial_suffix_len("abc<tool_c", ["<tool_call>"]) == 7
    assert partial_suffix_len("abc<tool_call>", ["<tool_call>"]) == 0  # whole, not partial
    assert partial_suffix_len("x</", ["</a>", "</think>"]) == 2
    assert partial_suffix_len("", ["<a>"]) == 0
    assert find_first("xx</think>y<tool_call>", ["<tool_call>", "</think>"]) == (2, "</think>")
    assert find_first("abc", ["d"]) == (-1, None)


# --- stop strings ---------------------------------------------------------------------------
@pytest.mark.parametrize("text,stops,expected,matched", [
    ("hello STOP world", ("STOP",), "hello ", True),
    ("hello STOne world", ("STOP",), "hello STOne world", False),
    ("ab", ("abc",), "ab", False),  # held, then flushed at the end
    ("xxabcabd", ("abd", "cab"), "xxab", True),  # earliest match wins
    ("中文龘龘尾", ("龘龘",), "中文", True),
])
def test_stop_matcher_every_split(text, stops, expected, matched):
    for pieces in splits(text):
        m = StopStringMatcher(stops)
        out, hit = "", False
        for piece in pieces:
            safe, hit = m.feed(piece)
            out += safe
            if hit:
                break
        if not hit:
            out += m.flush()
        assert (out, hit) == (expected, matched), pieces


def test_stop_matcher_never_emits_a_prefix_it_later_needs():
    rng = random.Random(7)
    for _ in range(200):
        stop = "".join(rng.choice("ab") for _ in range(rng.randint(1, 4)))
        text = "".join(rng.choice("ab") for _ in range(rng.randint(0, 12)))
        m = StopStringMatcher((stop,))
        out = ""
        for ch in text:
            safe, hit = m.feed(ch)
            out += safe
            if hit:
                break
        else:
            out += m.flush()
        idx = text.find(stop)
        assert out == (text[:idx] if idx >= 0 else text)


def test_validate_stop_strings():
    assert validate_stop_strings(None) == ()
    assert validate_stop_strings("x") == ("x",)
    assert validate_stop_strings(["a", "b", "a"]) == ("a", "b")
    for bad in ([""], [1], ["x"] * 17, 5):
        with pytest.raises(InvalidInput) as err:
            validate_stop_strings(bad)
        assert err.value.param == "stop"


# --- reasoning ------------------------------------------------------------------------------
@pytest.mark.parametrize("start,tools,text,content,reasoning", [
    (ReasoningStart.OPEN, False, "Think 1.\n\n</think>\n\nAnswer.", "Answer.", "Think 1."),
    (ReasoningStart.OPEN, False, "  a  b \n", "", "a  b \n"),  # cut short: held whitespace flushed
    (ReasoningStart.OPEN, True, "Plan.\n<tool_call>\nX", "<tool_call>\nX", "Plan."),
    (ReasoningStart.OPEN, False, "Plan.\n<tool_call>\nX", "", "Plan.\n<tool_call>\nX"),
    (ReasoningStart.DETECT, False, "\n<think>\nR\n</think>\n\nC", "C", "R"),
    (ReasoningStart.DETECT, False, "  Hi <think>x</think>", "  Hi <think>x</think>", ""),
    (ReasoningStart.DETECT, False, " <thin", " <thin", ""),
    (ReasoningStart.OFF, True, "<think>x</think> y", "<think>x</think> y", ""),
    (ReasoningStart.OPEN, False, "R</thi", "", "R</thi"),
])
def test_reasoning_splitter_every_split(start, tools, text, content, reasoning):
    for pieces in splits(text):
        got = run_stage(lambda: ReasoningSplitter(start, tool_calls=tools), pieces)
        assert got[:2] == (content, reasoning), pieces


# --- tool calls -----------------------------------------------------------------------------
CALL = ("<tool_call>\n<function=f>\n<parameter=s>\na\"b\\c\n\n</parameter>\n<parameter=n>\n"
        "7\n</parameter>\n<parameter=o>\n{\"k\": [1]}\n</parameter>\n<parameter=b>\nFalse\n"
        "</parameter>\n</function>\n</tool_call>")


@pytest.mark.parametrize("text,content,calls", [
    ("Before.\n\n" + CALL + "\n\nAfter.", "Before.After.",
     [("f", {"s": "a\"b\\c\n", "n": 7, "o": {"k": [1]}, "b": False})]),
    ("<tool_call>\n<function=g>\n</function>\n</tool_call>", "", [("g", {})]),
    # missing </parameter> and </function>: the value ends at the next closing tag
    ("<tool_call>\n<function=f>\n<parameter=n>\n12\n</tool_call>tail", "tail", [("f", {"n": 12})]),
    # stray text between tags is skipped
    ("<tool_call><function=f>junk<parameter=s>x</parameter>more</function></tool_call>", "",
     [("f", {"s": "x"})]),
    # two functions inside one <tool_call>
    ("<tool_call>\n<function=f>\n</function>\n<function=g>\n</function>\n</tool_call>", "",
     [("f", {}), ("g", {})]),
    # not a call: the marker is content
    ("a <tool_call> b", "a <tool_call> b", []),
    ("<tool_call>\n<function=bad name>\n", "<tool_call>\n<function=bad name>\n", []),
    # cut off mid call: completed at the end
    ("<tool_call>\n<function=f>\n<parameter=s>\nhal", "", [("f", {"s": "hal"})]),
    ("<tool_call>\n<function=f>\n<parameter=n>\n12\n</param", "", [("f", {"n": 12})]),
    ("<tool_call>\n<function=f>\n<parameter=", "", [("f", {})]),
    ("<tool_call>\n<functi", "<tool_call>\n<functi", []),
    ("x\n\n", "x\n\n", []),
])
def test_tool_parser_every_split(text, content, calls):
    for pieces in splits(text):
        got_content, _, got_calls = run_stage(lambda: ToolCallParser(TOOLS, "p"), pieces)
        assert got_content == content, pieces
        assert [(name, json.loads(args)) for _, (name, args) in sorted(got_calls.items())] == \
            calls, pieces


def test_tool_parser_streams_string_values_before_the_end():
    parser = ToolCallParser(TOOLS, "p")
    events = parser.feed("<tool_call>\n<function=f>\n<parameter=s>\nhello wor")
    args = "".join(e.arguments for e in events if isinstance(e, ToolCallDelta))
    assert args == '{"s": "hello wor'
    assert events[0] == ToolCallDelta(0, id="call_p0", name="f")
    events = parser.feed("ld\n")  # the newline may be the one before </parameter>: held
    assert "".join(e.arguments for e in events) == "ld"
    events = parser.feed("\n</parameter>")
    assert "".join(e.arguments for e in events) == '\\n"'


def test_param_types_from_schema():
    props = {"type": "object", "properties": {
        "a": {"type": "string"}, "b": {"type": ["integer", "null"]}, "c": {"enum": ["x", "y"]},
        "d": {"anyOf": [{"type": "number"}, {"type": "string"}]}, "e": {"description": "?"}}}
    assert param_type(props, "a").is_string
    assert param_type(props, "b").types == {"integer", "null"}
    assert param_type(props, "c").is_string
    assert param_type(props, "d").types == {"number", "string"}
    assert param_type(props, "e").types == frozenset()
    assert param_type(props, "zz").is_string  # undeclared: string
    assert param_type(None, "a").is_string


@pytest.mark.parametrize("text,types,value", [
    ("5", {"integer"}, 5),
    ("5.0", {"integer"}, 5),
    ("5.5", {"integer"}, "5.5"),
    ("5", {"number"}, 5),
    ("1e999", {"number"}, "1e999"),
    ("NaN", {"number"}, "NaN"),
    ("true", {"boolean"}, True),
    ("True", {"boolean"}, True),
    ("yes", {"boolean"}, "yes"),
    ("null", {"string", "null"}, None),
    ("hi", {"string", "null"}, "hi"),
    ('"quoted"', {"string", "null"}, '"quoted"'),
    ('{"a": 1}', {"object"}, {"a": 1}),
    ("[1, 2", {"array"}, "[1, 2"),
    ("[1]", {"object"}, "[1]"),
    ("[1]", set(), [1]),
    ("free text", set(), "free text"),
    (" 12 ", {"integer"}, 12),
])
def test_convert_value(text, types, value):
    got = convert_value(text, ParamType(frozenset(types)))
    assert got == value and type(got) is type(value)
