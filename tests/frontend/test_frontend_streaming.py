"""Output parsing on real tokenizer output, split at every token boundary.

Each script is a model output written as text, tokenized with the real Qwen3.5 tokenizer (so
``<think>``, ``</tool_call>`` ... are single special tokens and rare characters span several
byte tokens), then fed to the session in groups of 1, 2, 3, ... tokens and at every two-piece
split point. Whatever the chunking, the concatenated deltas must equal the hand-written
expectation (and the one-shot result), and text is never published and then retracted.
"""
from __future__ import annotations

import dataclasses
import json
import random

import pytest
from conftest import GENERATION_DEFAULTS, MODEL_VOCAB, SEARCH_TOOL, WEATHER_TOOL
from frontend_stream_util import chunkings, run_chunks

from ninfer.models.common.qwen import ChatTemplate, QwenFrontend

USER = [{"role": "user", "content": "What is the weather like?"}]
PLAIN_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclasses.dataclass(frozen=True)
class Script:
    name: str
    output: str  # what the model writes (special tokens as their text)
    reasoning: str
    content: str
    calls: tuple = ()  # (name, arguments dict)
    finish: str = "stop"
    thinking: bool | None = True  # enable_thinking; None: a template without <think>
    tools: tuple = (WEATHER_TOOL, SEARCH_TOOL)
    tool_choice: object = "auto"
    stop: tuple = ()
    end_token: bool = True  # append <|im_end|>


SCRIPTS = [
    Script(
        "reasoning_content_two_calls",
        "The user wants 🦜 weather; 龘 and ꙮ are rare.\nCheck 𝄞 twice.\n</think>\n\n"
        "Let me check — 天气 😀.\n\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nSão Paulo \"SP\" \\ 🦜\nline 2\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n<parameter=options>\n{\"unit\": \"C\", \"tags\": [1, 2]}\n</parameter>\n"
        "<parameter=metric>\ntrue\n</parameter>\n<parameter=hours>\n[0.5, 12]\n</parameter>\n"
        "<parameter=note>\nnull\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=web.search>\n<parameter=query>\n</parameter> is a tag\n</parameter>\n"
        "</function>\n</tool_call>",
        reasoning="The user wants 🦜 weather; 龘 and ꙮ are rare.\nCheck 𝄞 twice.",
        content="Let me check — 天气 😀.",
        calls=(
            ("get_weather", {"city": "São Paulo \"SP\" \\ 🦜\nline 2", "days": 3,
                             "options": {"unit": "C", "tags": [1, 2]}, "metric": True,
                             "hours": [0.5, 12], "note": None}),
            ("web.search", {"query": ""}),
        ),
        finish="tool_calls",
    ),
    Script(
        "tool_call_ends_thinking",
        "I must call the tool now.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n\n"
        "Oslo\n\n</parameter>\n<parameter=days>\nseven\n</parameter>\n<parameter=unknown>\n42\n"
        "</parameter>\n</function>\n</tool_call>",
        reasoning="I must call the tool now.",
        content="",
        calls=(("get_weather", {"city": "\nOslo\n", "days": "seven", "unknown": "42"}),),
        finish="tool_calls",
    ),
    Script(
        "thinking_off_stop_string",
        "Ten 🦜 birds; STOne is not STOP-ped… STOP and more text",
        reasoning="",
        content="Ten 🦜 birds; STOne is not ",
        thinking=False,
        tools=(),
        stop=("STOP", "龘龘"),
    ),
    Script(
        "stop_string_after_reasoning_with_tools",
        "Reason about 龘.\n</think>\n\nAnswer: 42 🦜\nObservation: the tool said <tool_call>",
        reasoning="Reason about 龘.",
        content="Answer: 42 🦜\n",
        stop=("Observation:",),
        end_token=False,
    ),
    Script(
        "multibyte_stop_string",
        "你好龘世界! 龘 again 龘龘 tail",
        reasoning="",
        content="你好龘世界! 龘 again ",
        thinking=False,
        tools=(),
        stop=("龘龘",),
        end_token=False,
    ),
    Script(
        "no_tools_markers_are_content",
        "Use <tool_call>\n<function=x>\n</function>\n</tool_call> literally.",
        reasoning="",
        content="Use <tool_call>\n<function=x>\n</function>\n</tool_call> literally.",
        thinking=False,
        tools=(),
    ),
    Script(
        "tool_choice_none_keeps_text",
        "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>",
        reasoning="",
        content="<tool_call>\n<function=get_weather>\n</function>\n</tool_call>",
        thinking=False,
        tool_choice="none",
    ),
    Script(
        "output_opens_think",
        "<think>\nShort 🦜 thought.\n</think>\n\nHello 世界",
        reasoning="Short 🦜 thought.",
        content="Hello 世界",
        thinking=None,
        tools=(),
    ),
    Script(
        "named_tool_choice_prefill",
        "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>",
        reasoning="",
        content="",
        calls=(("get_weather", {"city": "Rome"}),),
        finish="tool_calls",
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    ),
    Script(
        "required_tool_choice_prefill",
        "<function=web.search>\n<parameter=query>\nnews\n</parameter>\n</function>\n</tool_call>",
        reasoning="",
        content="",
        calls=(("web.search", {"query": "news"}),),
        finish="tool_calls",
        thinking=False,
        tool_choice="required",
    ),
    Script(
        "length_cut_inside_call",
        "Sure.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nBer",
        reasoning="",
        content="Sure.",
        calls=(("get_weather", {"city": "Ber"}),),
        finish="length",
        thinking=False,
        end_token=False,
    ),
    Script(
        "broken_call_falls_back_to_content",
        "Text <tool_call>{\"name\": \"x\"}</tool_call> end",
        reasoning="",
        content="Text <tool_call>{\"name\": \"x\"}</tool_call> end",
        thinking=False,
    ),
]


def _frontend_for(script: Script, frontend: QwenFrontend) -> QwenFrontend:
    if script.thinking is None:
        return QwenFrontend(frontend.tokenizer, ChatTemplate(PLAIN_CHATML), GENERATION_DEFAULTS,
                            MODEL_VOCAB)
    return frontend


def _prepare(script: Script, frontend: QwenFrontend):
    fe = _frontend_for(script, frontend)
    kwargs = {} if script.thinking is None else {"enable_thinking": script.thinking}
    prepared = fe.prepare_chat(USER, tools=list(script.tools) or None,
                               tool_choice=script.tool_choice, chat_template_kwargs=kwargs)
    ids = fe.tokenizer.encode(script.output)
    if script.end_token:
        ids.append(fe.tokenizer.special.im_end)
    return fe, prepared, ids


def _check(script: Script, got, ids) -> None:
    assert got.reasoning == script.reasoning
    assert got.content == script.content
    assert got.finish_reason == script.finish
    assert [c[0] for c in got.parsed_calls()] == [c[0] for c in script.calls]
    assert got.parsed_calls() == list(script.calls)
    assert got.token_ids == ids[: len(got.token_ids)]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.name)
def test_every_chunking_gives_the_same_message(script, frontend):
    fe, prepared, ids = _prepare(script, frontend)
    one_shot = run_chunks(fe.new_session(prepared, stop=script.stop, call_id_prefix="t"),
                          ids, [len(ids)])
    _check(script, one_shot, ids)
    assert len(ids) > 8
    for chunks in chunkings(len(ids)):
        session = fe.new_session(prepared, stop=script.stop, call_id_prefix="t")
        got = run_chunks(session, ids, chunks)
        _check(script, got, ids)
        assert got.token_ids == one_shot.token_ids
        assert got.calls == one_shot.calls  # same ids, same argument text
        msg = session.message()
        assert (msg.content, msg.reasoning_content) == (got.content, got.reasoning)
        assert [(c.id, c.name, c.arguments) for c in msg.tool_calls] == \
            [tuple(v) for _, v in sorted(got.calls.items())]
        assert list(msg.token_ids) == got.token_ids and msg.finish_reason == got.finish_reason


@pytest.mark.parametrize("script", SCRIPTS[:3], ids=lambda s: s.name)
def test_dropped_previews_change_nothing(script, frontend):
    """A decoy preview before every real one (never committed) leaves the result unchanged."""
    fe, prepared, ids = _prepare(script, frontend)
    decoy = fe.tokenizer.encode("</think><tool_call>\n<function=get_weather>STOP") + [
        fe.tokenizer.special.im_end]
    for size in (1, 2, 5):
        session = fe.new_session(prepared, stop=script.stop, call_id_prefix="t")
        got = run_chunks(session, ids, [size] * len(ids), decoy=decoy)
        _check(script, got, ids)


def test_random_partitions(frontend):
    rng = random.Random(2026)
    for script in SCRIPTS:
        fe, prepared, ids = _prepare(script, frontend)
        for _ in range(20):
            chunks = [rng.randint(1, 6) for _ in range(len(ids))]
            decoy = [rng.randrange(248077) for _ in range(rng.randint(0, 3))]
            session = fe.new_session(prepared, stop=script.stop, call_id_prefix="t")
            _check(script, run_chunks(session, ids, chunks, decoy=decoy), ids)


def test_streamed_arguments_are_valid_json_prefixes(frontend):
    """Per-token argument fragments build the final JSON left to right; the name comes first."""
    script = SCRIPTS[0]
    fe, prepared, ids = _prepare(script, frontend)
    session = fe.new_session(prepared, call_id_prefix="t")
    seen_name_before_args = set()
    for tid in ids:
        delta = session.commit(session.preview([tid], [0.0]))
        for call in (delta.tool_calls if delta else ()):
            if call.id is not None:
                seen_name_before_args.add(call.index)
            else:
                assert call.index in seen_name_before_args
    calls = session.message().tool_calls
    assert [c.id for c in calls] == ["call_t0", "call_t1"]
    for call, (name, args) in zip(calls, script.calls):
        assert call.name == name and json.loads(call.arguments) == args
