"""ninfer's Qwen3.5 ChatML template against hand-written expected renderings (spec qwen35 §8.3)."""
from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

import ninfer

TEMPLATE = (Path(ninfer.__file__).parent / "models/common/qwen/chat_template.jinja").read_text(encoding="utf-8")

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Météo actuelle",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}

TOOL_INSTRUCTIONS = (
    "If you decide to call a function, reply ONLY with one or more blocks in the format below and write "
    "nothing after them:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nA value for the second parameter,\npossibly spanning\nseveral lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n"
    "- Each call is a <function=...></function> block nested inside <tool_call></tool_call> tags\n"
    "- Give every required parameter\n"
    "- Any reasoning about a call goes in plain text BEFORE the call, never after it\n"
    "- If no function fits, answer normally from your own knowledge and do not mention the functions\n"
    "</IMPORTANT>"
)


def _raise(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _plain_sandbox():
    env = SandboxedEnvironment()
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    return env.from_string(TEMPLATE)


def _hf_like_sandbox():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    return env.from_string(TEMPLATE)


def _transformers_env():
    chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    return chat_template_utils._compile_jinja_template(TEMPLATE)


@pytest.fixture(params=["sandbox", "immutable_trim", "transformers"], scope="module")
def template(request):
    return {"sandbox": _plain_sandbox, "immutable_trim": _hf_like_sandbox, "transformers": _transformers_env}[
        request.param
    ]()


def render(template, messages, **kwargs):
    return template.render(messages=messages, **kwargs)


def test_single_user_turn_thinking_off_by_default(template):
    out = render(template, [{"role": "user", "content": "Hi there"}], add_generation_prompt=True)
    assert out == "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


@pytest.mark.parametrize("flag, suffix", [(True, "<think>\n"), (False, "<think>\n\n</think>\n\n")])
def test_system_and_thinking_switch(template, flag, suffix):
    messages = [{"role": "system", "content": "  Be brief.\n"}, {"role": "user", "content": "2+2?"}]
    out = render(template, messages, add_generation_prompt=True, enable_thinking=flag)
    assert out == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n" + suffix
    )


def test_no_generation_prompt(template):
    out = render(template, [{"role": "user", "content": "x"}], add_generation_prompt=False)
    assert out == "<|im_start|>user\nx<|im_end|>\n"


def test_reasoning_kept_only_after_last_user_query(template):
    messages = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "answer one", "reasoning_content": "thought one"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "answer two", "reasoning_content": "\nthought two\n"},
    ]
    assert render(template, messages) == (
        "<|im_start|>user\nfirst<|im_end|>\n"
        "<|im_start|>assistant\nanswer one<|im_end|>\n"
        "<|im_start|>user\nsecond<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nthought two\n</think>\n\nanswer two<|im_end|>\n"
    )
    kept = render(template, messages, preserve_thinking=True)
    assert "<|im_start|>assistant\n<think>\nthought one\n</think>\n\nanswer one<|im_end|>\n" in kept


def test_inline_reasoning_is_split_from_content(template):
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>\nhidden\n</think>\n\nvisible"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "<think>\nmine\n</think>\n\nshown"},
    ]
    assert render(template, messages) == (
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nvisible<|im_end|>\n"
        "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n<think>\nmine\n</think>\n\nshown<|im_end|>\n"
    )


def test_tools_tool_calls_and_merged_tool_responses(template):
    messages = [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": "Weather in Zürich and the time?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "Need two tools.",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}},
                {"type": "function", "function": {"name": "now", "arguments": {}}},
            ],
        },
        {"role": "tool", "content": '{"temp": 21}'},
        {"role": "tool", "content": "12:00"},
        {"role": "assistant", "content": "21 °C at noon.", "reasoning_content": "Done."},
    ]
    out = render(template, messages, tools=[WEATHER_TOOL, TIME_TOOL], add_generation_prompt=False)
    assert out == (
        "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>\n"
        + json.dumps(WEATHER_TOOL, ensure_ascii=False) + "\n"
        + json.dumps(TIME_TOOL, ensure_ascii=False) + "\n</tools>\n\n"
        + TOOL_INSTRUCTIONS + "\n\nYou are a weather bot.<|im_end|>\n"
        "<|im_start|>user\nWeather in Zürich and the time?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nNeed two tools.\n</think>\n\nLet me check.\n\n"
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=now>\n</function>\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n{\"temp\": 21}\n</tool_response>\n<tool_response>\n12:00\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\nDone.\n</think>\n\n21 °C at noon.<|im_end|>\n"
    )
    assert "Météo actuelle" in out, "tool schemas keep non-ASCII text"


def test_tools_without_system_message_and_json_encoded_values(template):
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "f", "arguments": {
                "flag": True, "n": 1.5, "obj": {"k": [1, "two"]}, "none": None, "text": "a\nb",
            }}}],
        },
    ]
    out = render(template, messages, tools=[TIME_TOOL])
    assert out.startswith("<|im_start|>system\n# Tools\n\n")
    assert out.endswith(TOOL_INSTRUCTIONS + "<|im_end|>\n" + "<|im_start|>user\ngo<|im_end|>\n"
                        "<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=f>\n"
                        "<parameter=flag>\ntrue\n</parameter>\n<parameter=n>\n1.5\n</parameter>\n"
                        "<parameter=obj>\n{\"k\": [1, \"two\"]}\n</parameter>\n<parameter=none>\nnull\n</parameter>\n"
                        "<parameter=text>\na\nb\n</parameter>\n</function>\n</tool_call><|im_end|>\n")


def test_tool_response_turn_is_not_a_user_query(template):
    # A user turn holding only a wrapped tool result does not move the "last query" frontier.
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning_content": "r1",
         "tool_calls": [{"function": {"name": "now", "arguments": {}}}]},
        {"role": "user", "content": "<tool_response>\n1\n</tool_response>"},
        {"role": "assistant", "content": "ok", "reasoning_content": "r2"},
    ]
    out = render(template, messages)
    assert "<|im_start|>assistant\n<think>\nr1\n</think>\n\n<tool_call>\n<function=now>\n" in out
    assert "<|im_start|>assistant\n<think>\nr2\n</think>\n\nok<|im_end|>\n" in out


def test_content_parts_and_images(template):
    messages = [
        {"role": "user", "content": [
            {"type": "text", "text": "Compare "},
            {"type": "image", "image": "a.png"},
            {"type": "image_url", "image_url": {"url": "http://x/b.png"}},
            {"type": "video", "video": "c.mp4"},
            {"type": "text", "text": " please"},
        ]},
    ]
    vision = "<|vision_start|><|image_pad|><|vision_end|>"
    video = "<|vision_start|><|video_pad|><|vision_end|>"
    assert render(template, messages) == f"<|im_start|>user\nCompare {vision}{vision}{video} please<|im_end|>\n"
    assert render(template, messages, add_vision_id=True) == (
        f"<|im_start|>user\nCompare Picture 1: {vision}Picture 2: {vision}Video 1: {video} please<|im_end|>\n"
    )


@pytest.mark.parametrize("messages, kwargs, match", [
    ([], {}, "must not be empty"),
    ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"}], {}, "only as the first"),
    ([{"role": "narrator", "content": "a"}], {}, "unsupported message role"),
    ([{"role": "system", "content": [{"type": "image"}]}, {"role": "user", "content": "a"}], {}, "cannot contain images"),
    ([{"role": "user", "content": [{"type": "audio"}]}], {}, "unsupported content part"),
    ([{"role": "user", "content": "a"},
      {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1}'}}]}],
     {}, "must be a mapping"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}],
     {}, "needs a function name"),
])
def test_bad_conversations_raise_clear_errors(template, messages, kwargs, match):
    with pytest.raises(jinja2.exceptions.TemplateError, match=match):
        render(template, messages, **kwargs)


@pytest.mark.parametrize("thinking", [True, False])
def test_generated_turn_re_renders_as_a_continuation(template, thinking):
    """Prompt + generated text == the history re-rendered with that reply (prefix reuse relies on it)."""
    history = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    prompt = render(template, history, add_generation_prompt=True, enable_thinking=thinking)
    reasoning = "let me think" if thinking else ""
    generated = (f"{reasoning}\n</think>\n\n" if thinking else "") + "the answer<|im_end|>\n"
    reply = {"role": "assistant", "content": "the answer", "reasoning_content": reasoning}
    assert render(template, [*history, reply]) == prompt + generated
