"""ChatTemplate (sandboxed rendering, message validation) and QwenFrontend.prepare_*."""
from __future__ import annotations

import json

import pytest
from conftest import GENERATION_DEFAULTS, MODEL_VOCAB, SEARCH_TOOL, WEATHER_TOOL

from ninfer.errors import ArtifactError, InvalidInput
from ninfer.models.common.qwen import (
    ChatTemplate, QwenFrontend, ReasoningStart, ToolChoiceMode, default_chat_template,
)
from ninfer.models.common.qwen.template import check_template_kwargs as frontend_kwargs_check

USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def template():
    return ChatTemplate(default_chat_template())


def test_renders_chatml_with_thinking_switch(template):
    text = template.render([{"role": "system", "content": "Be brief."}] + USER)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                    "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert template.render(USER, enable_thinking=True).endswith("<|im_start|>assistant\n<think>\n")
    assert template.render(USER, add_generation_prompt=False).endswith("Hi<|im_end|>\n")


def test_history_with_tool_calls_and_results(template):
    messages = USER + [
        {"role": "assistant", "content": None, "reasoning_content": "need weather",
         "tool_calls": [{"id": "c1", "type": "function", "function": {
             "name": "get_weather", "arguments": json.dumps({"city": "Oslo", "days": 2})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]},
    ]
    text = template.render(messages, tools=[WEATHER_TOOL])
    assert "<tools>\n" + json.dumps(WEATHER_TOOL, ensure_ascii=False) + "\n</tools>" in text
    assert ("<think>\nneed weather\n</think>\n\n<tool_call>\n<function=get_weather>\n"
            "<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
            "</function>\n</tool_call><|im_end|>\n") in text
    assert "<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n" in text


@pytest.mark.parametrize("messages,param", [
    ([], "messages"),
    ("hi", "messages"),
    ([{"role": "wizard", "content": "x"}], "messages[0].role"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": 5}], "messages[0].content"),
    ([{"role": "user", "content": [{"type": "audio"}]}], "messages[0].content[0]"),
    ([{"role": "user", "content": [{"type": "text"}]}], "messages[0].content[0]"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}],
     "messages[0].content[0]"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": "{not json"}}]}], "messages[0].tool_calls[0].function.arguments"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
        "name": "f", "arguments": "[1]"}}]}], "messages[0].tool_calls[0].function.arguments"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": "{}"}}]}],
     "messages[0].tool_calls[0].function.name"),
    ([{"role": "user", "content": "x", "tool_calls": [{}]}], "messages[0].tool_calls"),
    ([{"role": "tool", "content": "x", "tool_call_id": 3}], "messages[0].tool_call_id"),
    ([{"role": "assistant", "content": "x", "reasoning_content": 1}], "messages[0].reasoning_content"),
    # the template itself refuses: a system message after the first
    (USER + [{"role": "system", "content": "late"}], "messages"),
])
def test_invalid_messages(template, messages, param):
    with pytest.raises(InvalidInput) as err:
        template.render(messages)
    assert err.value.param == param


def test_template_failures_become_invalid_input():
    with pytest.raises(InvalidInput) as err:
        ChatTemplate("{% for %}")
    assert err.value.param == "chat_template"
    escape = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(InvalidInput):
        escape.render(USER)  # the sandbox forbids it
    mutate = ChatTemplate("{{ messages.append(1) }}")
    with pytest.raises(InvalidInput):
        mutate.render(USER)  # immutable sandbox
    with pytest.raises(InvalidInput):
        ChatTemplate("{{ strftime_now('%Y') }}").render(USER)
    with pytest.raises(InvalidInput) as err:
        ChatTemplate("{{ raise_exception('nope') }}").render(USER)
    assert "nope" in str(err.value)
    for kwargs in ({"messages": []}, {"add_generation_prompt": False}, {"tools": []}, [1]):
        with pytest.raises(InvalidInput) as err:
            frontend_kwargs_check(kwargs)
        assert err.value.param == "chat_template_kwargs"
    with pytest.raises(InvalidInput) as err:
        ChatTemplate("x").render(USER, messages=[])
    assert err.value.param == "chat_template_kwargs"


def test_prepare_chat_thinking_state(frontend):
    on = frontend.prepare_chat(USER, chat_template_kwargs={"enable_thinking": True})
    off = frontend.prepare_chat(USER)
    assert on.reasoning is ReasoningStart.OPEN and on.thinking_open
    assert off.reasoning is ReasoningStart.OFF and not off.thinking_open
    assert on.token_ids == tuple(frontend.tokenizer.encode(on.prompt_text))
    assert on.token_ids[-2:] == (frontend.tokenizer.special.think, 198)
    plain = QwenFrontend(frontend.tokenizer, ChatTemplate("{{ messages[0].content }}"),
                         GENERATION_DEFAULTS, MODEL_VOCAB)
    assert plain.prepare_chat(USER).reasoning is ReasoningStart.DETECT


def test_prepare_chat_tool_choice(frontend):
    tools = [WEATHER_TOOL, SEARCH_TOOL]
    auto = frontend.prepare_chat(USER, tools=tools)
    assert auto.tool_choice.mode is ToolChoiceMode.AUTO and auto.parse_tool_calls
    assert set(auto.tools) == {"get_weather", "web.search"}
    assert auto.tools["get_weather"] == WEATHER_TOOL["function"]["parameters"]
    assert auto.forced_prefix == ""
    none = frontend.prepare_chat(USER, tools=tools, tool_choice="none")
    assert not none.parse_tool_calls and "<tools>" in none.prompt_text  # tools stay in the prompt
    required = frontend.prepare_chat(USER, tools=tools, tool_choice="required")
    assert required.forced_prefix == "<tool_call>\n"
    assert required.prompt_text.endswith("</think>\n\n<tool_call>\n")
    named = frontend.prepare_chat(
        USER, tools=tools, chat_template_kwargs={"enable_thinking": True},
        tool_choice={"type": "function", "function": {"name": "web.search"}})
    # thinking on: the forced call first closes the open <think> block
    assert named.prompt_text.endswith("<think>\n\n</think>\n\n<tool_call>\n<function=web.search>\n")
    assert named.tool_choice.name == "web.search"


@pytest.mark.parametrize("tools,choice,param", [
    ([WEATHER_TOOL], {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
    (None, "required", "tool_choice"),
    ([WEATHER_TOOL], "sometimes", "tool_choice"),
    ("x", "auto", "tools"),
    ([{"type": "retrieval"}], "auto", "tools[0]"),
    ([{"type": "function", "function": {"name": "has space"}}], "auto", "tools[0].function.name"),
    ([WEATHER_TOOL, WEATHER_TOOL], "auto", "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], "auto",
     "tools[0].function.parameters"),
])
def test_invalid_tools(frontend, tools, choice, param):
    with pytest.raises(InvalidInput) as err:
        frontend.prepare_chat(USER, tools=tools, tool_choice=choice)
    assert err.value.param == param


def test_prepare_completion(frontend):
    text = frontend.prepare_completion("Once upon a time")
    assert text.token_ids == tuple(frontend.tokenizer.encode("Once upon a time"))
    assert text.reasoning is ReasoningStart.OFF and not text.parse_tool_calls
    ids = frontend.prepare_completion([1, 2, 248300])  # inside the model's (padded) range
    assert ids.token_ids == (1, 2, 248300) and ids.prompt_text is None
    for bad in ("", [], [1, MODEL_VOCAB], [-1], [1.0], None):
        with pytest.raises(InvalidInput):
            frontend.prepare_completion(bad)


def test_small_model_vocab_rejects_unrepresentable_text(frontend):
    small = QwenFrontend(frontend.tokenizer, frontend.template, GENERATION_DEFAULTS, 1000)
    with pytest.raises(InvalidInput) as err:
        small.prepare_chat(USER)
    assert "outside the model's vocabulary" in str(err.value)


def test_generation_defaults_are_data(frontend, tokenizer_json):
    assert dict(frontend.sampling_defaults) == {"temperature": 0.6, "top_k": 20, "top_p": 0.95}
    assert frontend.eos_token_ids == (248046, 248044)
    greedy = QwenFrontend(frontend.tokenizer, None, {"do_sample": False, "eos_token_id": 7}, 10)
    assert greedy.sampling_defaults["temperature"] == 0.0 and greedy.eos_token_ids == (7,)
    with pytest.raises(InvalidInput):
        greedy.prepare_chat(USER)  # no template
    with pytest.raises(ArtifactError):
        QwenFrontend(frontend.tokenizer, None, {"top_p": 3.0}, 10)
    with pytest.raises(ArtifactError):
        QwenFrontend(frontend.tokenizer, None, {"eos_token_id": "x"}, 10)
