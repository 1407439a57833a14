"""Tool calls, reasoning and stop strings end to end through a real ``ninfer serve`` process.

The server runs the demo model with ``--scripted-program``: decode tokens are replaced by
scripts encoded with the real tokenizer (server_scripts.py), so the frontend's parsers, the
engine, the SSE code and the response schemas under test are the production ones. The
official openai SDK is the client; the server requires an API key.
"""
from __future__ import annotations

import json

import openai
import pytest

from .server_scripts import (
    ANSWER, API_KEY, NAMED_ARGS, NAMED_TRIGGER, REASONING, REASONING_TRIGGER, SEARCH_TOOL,
    STOP_TEXT, STOP_TRIGGER, TOOL_CALLS, TOOL_CONTENT, TOOL_TRIGGER, WEATHER_TOOL,
)


@pytest.fixture(scope="module")
def client(scripted_server):
    return openai.OpenAI(base_url=scripted_server.url + "/v1", api_key=API_KEY, max_retries=0,
                         timeout=300)


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_tool_calls_non_stream_and_stream(client):
    kw = dict(model="ninfer-demo-qwen3.5", messages=_user(f"{TOOL_TRIGGER}: weather in Paris?"),
              tools=[WEATHER_TOOL, SEARCH_TOOL])
    choice = client.chat.completions.create(**kw).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content.strip() == TOOL_CONTENT
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == TOOL_CALLS
    assert all(c.id.startswith("call_") and c.type == "function" for c in calls)

    names, args, content, finish = {}, {}, "", None
    for chunk in client.chat.completions.create(**kw, stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or ():
            if call.id:
                names[call.index] = call.function.name
            args[call.index] = args.get(call.index, "") + (call.function.arguments or "")
        finish = chunk.choices[0].finish_reason or finish
    assert [(names[i], json.loads(args[i])) for i in sorted(names)] == TOOL_CALLS
    assert content.strip() == TOOL_CONTENT and finish == "tool_calls"

    # tool_choice "none": the same output is plain content
    plain = client.chat.completions.create(**kw, tool_choice="none").choices[0]
    assert plain.message.tool_calls is None and "<tool_call>" in plain.message.content
    assert plain.finish_reason == "stop"


def test_named_tool_choice(client):
    choice = client.chat.completions.create(
        model="ninfer-demo-qwen3.5", messages=_user(f"{NAMED_TRIGGER}: and Rome?"),
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}).choices[0]
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == NAMED_ARGS
    assert choice.finish_reason == "tool_calls"


def test_reasoning_split(client):
    kw = dict(model="ninfer-demo-qwen3.5", messages=_user(f"{REASONING_TRIGGER}: 2+2?"),
              extra_body={"chat_template_kwargs": {"enable_thinking": True}})
    message = client.chat.completions.create(**kw).choices[0].message
    assert message.reasoning_content.strip() == REASONING
    assert message.content.strip() == ANSWER
    reasoning = content = ""
    for chunk in client.chat.completions.create(**kw, stream=True):
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning_content", None) or ""
        content += delta.content or ""
    assert (reasoning, content) == (message.reasoning_content, message.content)


@pytest.mark.parametrize("stop,expected", [("STOP", "alpha beta "), (["zzz", " gamma"],
                                                                     "alpha beta STOP")])
def test_stop_strings_on_scripted_text(client, stop, expected):
    kw = dict(model="ninfer-demo-qwen3.5", messages=_user(f"{STOP_TRIGGER}"), stop=stop)
    choice = client.chat.completions.create(**kw).choices[0]
    assert (choice.message.content, choice.finish_reason) == (expected, "stop")
    streamed = "".join(c.choices[0].delta.content or ""
                       for c in client.chat.completions.create(**kw, stream=True))
    assert streamed == expected
    full = client.chat.completions.create(model="ninfer-demo-qwen3.5",
                                          messages=_user(STOP_TRIGGER)).choices[0]
    assert (full.message.content, full.finish_reason) == (STOP_TEXT, "stop")


def test_api_key_required(scripted_server):
    for key in ("wrong-key", API_KEY + "x"):
        bad = openai.OpenAI(base_url=scripted_server.url + "/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.AuthenticationError) as info:
            bad.models.list()
        assert info.value.status_code == 401
        assert info.value.body["code"] == "invalid_api_key"
    status, body = scripted_server.health()  # /health needs no key
    assert status == 200 and body["status"] == "ready"
