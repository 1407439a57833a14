"""In-process tests of the HTTP layer: validation, error mapping, auth, lifecycle, metrics,
streaming and disconnects. Real app, frontend (real tokenizer) and Engine; the Program is a
FakeProgram behind the ScriptedProgram wrapper (see app_harness.py)."""
from __future__ import annotations

import json
import logging
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ninfer.runtime import GenerationRequest
from ninfer.runtime.contract.output import TokenOutputSession
from ninfer.serve import EngineOptions, LoadedModel, ModelHost, ServerConfig, create_app
from ninfer.serve.jobs import JobLimits, chat_choices
from ninfer.serve.params import CHAT_FIELDS, COMPLETION_FIELDS, parse_chat

from .app_harness import AppHarness
from .server_scripts import (
    ANSWER, NAMED_ARGS, NAMED_TRIGGER, REASONING, REASONING_TRIGGER, SEARCH_TOOL, STOP_TEXT,
    STOP_TRIGGER, TOOL_CALLS, TOOL_CONTENT, TOOL_TRIGGER, WEATHER_TOOL,
)

USER = [{"role": "user", "content": "hello"}]


@pytest.fixture()
def harness(frontend, tokenizer, tmp_path):
    h = AppHarness(frontend, tokenizer, tmp_path)
    yield h
    h.close()
    h.program.check_integrity()


def _error(resp, status: int, param=..., code=...):
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    err = resp.json["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not ...:
        assert err["param"] == param, err
    if code is not ...:
        assert err["code"] == code, err
    return err


BAD_CHAT = [
    ({}, "messages", "missing_parameter"),
    ({"messages": "hi"}, "messages", "invalid_value"),
    ({"messages": []}, "messages", "invalid_value"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "invalid_value"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "invalid_value"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url",
                                                 "image_url": {"url": "http://x/y.png"}}]}]},
     "messages[0].content[0]", "invalid_value"),
    ({"messages": USER, "temperature": -0.5}, "temperature", "invalid_value"),
    ({"messages": USER, "temperature": 2.5}, "temperature", "invalid_value"),
    ({"messages": USER, "temperature": "hot"}, "temperature", "invalid_value"),
    ({"messages": USER, "temperature": True}, "temperature", "invalid_value"),
    ({"messages": USER, "top_p": 0}, "top_p", "invalid_value"),
    ({"messages": USER, "top_p": 1e-300}, "top_p", "invalid_value"),
    ({"messages": USER, "top_k": -2}, "top_k", "invalid_value"),
    ({"messages": USER, "top_k": 2**31}, "top_k", "invalid_value"),
    ({"messages": USER, "repetition_penalty": 1e-300}, "repetition_penalty", "invalid_value"),
    ({"messages": USER, "repetition_penalty": 1e300}, "repetition_penalty", "invalid_value"),
    ({"messages": USER, "n": 0}, "n", "invalid_value"),
    ({"messages": USER, "n": 9}, "n", "invalid_value"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens", "invalid_value"),
    ({"messages": USER, "max_tokens": 2.5}, "max_tokens", "invalid_value"),
    ({"messages": USER, "seed": -1}, "seed", "invalid_value"),
    ({"messages": USER, "stop": ["a"] * 17}, "stop", "invalid_value"),
    ({"messages": USER, "stop": [""]}, "stop", "invalid_value"),
    ({"messages": USER, "top_logprobs": 2}, "top_logprobs", "invalid_value"),
    ({"messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs", "invalid_value"),
    ({"messages": USER, "stream_options": {"include_usage": True}}, "stream_options",
     "invalid_value"),
    ({"messages": USER, "stream": True, "stream_options": {"x": 1}}, "stream_options",
     "unknown_parameter"),
    ({"messages": USER, "foo": 1}, "foo", "unknown_parameter"),
    ({"messages": USER, "response_format": {"type": "json_object"}}, "response_format",
     "unsupported_parameter"),
    ({"messages": USER, "logit_bias": {"1": 5}}, "logit_bias", "unsupported_parameter"),
    ({"messages": USER, "functions": [{"name": "f"}]}, "functions", "unsupported_parameter"),
    ({"messages": USER, "parallel_tool_calls": False}, "parallel_tool_calls", "invalid_value"),
    ({"messages": USER, "tool_choice": "required"}, "tool_choice", "invalid_value"),
    ({"messages": USER, "tools": [WEATHER_TOOL],
      "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "invalid_value"),
    ({"messages": USER, "tools": [{"type": "function", "function": {"name": "bad name"}}]},
     "tools[0].function.name", "invalid_value"),
    ({"messages": USER, "chat_template_kwargs": {"messages": []}}, "chat_template_kwargs",
     "invalid_value"),
    ({"messages": USER, "stop_token_ids": [10**9]}, "stop_token_ids", "invalid_value"),
]


@pytest.mark.parametrize("body,param,code", BAD_CHAT)
def test_chat_validation(harness, body, param, code):
    _error(harness.chat(body), 400, param, code)


BAD_COMPLETIONS = [
    ({"prompt": "x", "echo": True}, "echo", "unsupported_parameter"),
    ({"prompt": "x", "suffix": "y"}, "suffix", "unsupported_parameter"),
    ({"prompt": "x", "best_of": 3}, "best_of", "unsupported_parameter"),
    ({"prompt": []}, "prompt", "invalid_value"),
    ({"prompt": ""}, "prompt", "invalid_value"),
    ({"prompt": ["a", [1, 2]]}, "prompt", "invalid_value"),
    ({"prompt": [1, True]}, "prompt", "invalid_value"),
    ({"prompt": [248320]}, "prompt", "invalid_value"),
    ({"prompt": "x", "logprobs": True}, "logprobs", "invalid_value"),
    ({"prompt": "x", "messages": USER}, "messages", "unknown_parameter"),
    ({"prompt": ["a"] * 5, "n": 2}, "n", "too_many_choices"),
]


@pytest.mark.parametrize("body,param,code", BAD_COMPLETIONS)
def test_completion_validation(harness, body, param, code):
    _error(harness.client.simulate_post("/v1/completions", json=body), 400, param, code)


def test_neutral_values_of_unsupported_parameters_are_accepted(harness):
    out = harness.chat({"messages": USER, "max_tokens": 2, "response_format": {"type": "text"},
                        "logit_bias": {}, "user": "u-1", "parallel_tool_calls": True,
                        "store": False, "temperature": None, "seed": None})
    assert out.status_code == 200, out.text
    assert out.json["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("raw", [b"{bad", b"[1, 2]", b"", b"   ", b'{"messages": NaN}',
                                 b'{"a": Infinity}', b"\xff\xfe{}", b'"text"',
                                 b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
                                 b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}'])
def test_malformed_json(harness, raw):
    resp = harness.client.simulate_post("/v1/chat/completions", body=raw,
                                        headers={"Content-Type": "application/json"})
    _error(resp, 400, None, "invalid_json")


def test_body_limit(frontend, tokenizer, tmp_path):
    h = AppHarness(frontend, tokenizer, tmp_path, config=ServerConfig(max_request_bytes=4096))
    try:
        big = {"messages": [{"role": "user", "content": "x" * 5000}]}
        _error(h.chat(big), 413, None, "request_too_large")
        status, headers, it = h.raw_call("/v1/chat/completions", {"messages": USER},
                                         {"CONTENT_LENGTH": str(10**9)})
        assert status.startswith("413")
        assert json.loads(b"".join(it))["error"]["code"] == "request_too_large"
        assert h.chat({"messages": USER, "max_tokens": 1}).status_code == 200
    finally:
        h.close()


def test_unknown_route_and_method(harness):
    _error(harness.client.simulate_get("/v1/nothing"), 404)
    err = _error(harness.client.simulate_delete("/v1/chat/completions"), 405)
    assert "POST" in err["message"]
    _error(harness.client.simulate_get("/v1/models/other-model"), 404, "model",
           "model_not_found")
    _error(harness.chat({"messages": USER, "model": "other"}), 404, "model", "model_not_found")
    assert harness.client.simulate_get("/v1/models/fake-model").json["id"] == "fake-model"


def test_chat_response_shape_and_usage(harness, frontend):
    out = harness.chat({"messages": USER, "max_tokens": 5, "n": 2, "seed": 9,
                        "logprobs": True, "top_logprobs": 2})
    assert out.status_code == 200, out.text
    body = out.json
    prompt_tokens = len(frontend.prepare_chat(USER).token_ids)
    assert body["usage"] == {"prompt_tokens": prompt_tokens, "completion_tokens": 10,
                             "total_tokens": prompt_tokens + 10}
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for choice in body["choices"]:
        assert choice["finish_reason"] == "length"
        entries = choice["logprobs"]["content"]
        assert len(entries) == 5 and all(len(e["top_logprobs"]) == 2 for e in entries)
        assert "".join(e["token"] for e in entries) == choice["message"]["content"]
    again = harness.chat({"messages": USER, "max_tokens": 5, "seed": 10})
    assert again.json["choices"][0]["message"] == body["choices"][1]["message"]


def _stream(harness, body, path="/v1/chat/completions"):
    resp = harness.client.simulate_post(path, json={**body, "stream": True})
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "text/event-stream"
    events = [line[len("data: "):] for line in resp.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_tool_calls(harness):
    body = {"messages": [{"role": "user", "content": f"{TOOL_TRIGGER} weather?"}],
            "tools": [WEATHER_TOOL, SEARCH_TOOL], "max_tokens": 200}
    out = harness.chat(body).json["choices"][0]
    assert out["finish_reason"] == "tool_calls"
    assert out["message"]["content"].strip() == TOOL_CONTENT
    calls = out["message"]["tool_calls"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] \
        == TOOL_CALLS
    assert len({c["id"] for c in calls}) == 2 and all(c["type"] == "function" for c in calls)

    chunks = _stream(harness, body)
    names, args, ids = {}, {}, {}
    for chunk in chunks:
        for call in chunk["choices"][0]["delta"].get("tool_calls", []):
            i = call["index"]
            if "id" in call:
                ids[i], names[i] = call["id"], call["function"]["name"]
            args[i] = args.get(i, "") + call["function"]["arguments"]
    assert [(names[i], json.loads(args[i])) for i in sorted(names)] == TOOL_CALLS
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_reasoning_and_named_tool_choice(harness):
    body = {"messages": [{"role": "user", "content": f"{REASONING_TRIGGER} 2+2?"}],
            "chat_template_kwargs": {"enable_thinking": True}, "max_tokens": 100}
    message = harness.chat(body).json["choices"][0]["message"]
    assert (message["reasoning_content"].strip(), message["content"].strip()) \
        == (REASONING, ANSWER)
    chunks = _stream(harness, body)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == \
        message["reasoning_content"]
    assert "".join(d.get("content", "") for d in deltas) == message["content"]

    named = {"messages": [{"role": "user", "content": f"{NAMED_TRIGGER} Rome?"}],
             "tools": [WEATHER_TOOL], "max_tokens": 100,
             "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    out = harness.chat(named).json["choices"][0]
    (call,) = out["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == NAMED_ARGS
    assert out["finish_reason"] == "tool_calls"


def test_completions_stream_and_logprobs(harness):
    body = {"prompt": "hello", "max_tokens": 4, "logprobs": 1, "seed": 3}
    full = harness.client.simulate_post("/v1/completions", json=body).json
    chunks = _stream(harness, {**body, "stream_options": {"include_usage": True}},
                     "/v1/completions")
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) \
        == full["choices"][0]["text"]
    offsets = [o for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
               for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == full["choices"][0]["logprobs"]["text_offset"]
    assert chunks[-1]["usage"] == full["usage"]


def test_tokenize_detokenize(harness, frontend, tokenizer):
    out = harness.client.simulate_post("/tokenize", json={"prompt": "Hello world",
                                                          "return_token_strs": True}).json
    assert out["tokens"] == tokenizer.encode("Hello world") and out["count"] == 2
    assert "".join(out["token_strs"]) == "Hello world" and out["max_model_len"] == 1024
    chat = harness.client.simulate_post("/tokenize", json={"messages": USER}).json
    assert chat["tokens"] == list(frontend.prepare_chat(USER).token_ids)
    back = harness.client.simulate_post("/detokenize", json={"tokens": out["tokens"]}).json
    assert back == {"prompt": "Hello world"}
    _error(harness.client.simulate_post("/tokenize", json={}), 400, "prompt")
    _error(harness.client.simulate_post("/tokenize", json={"prompt": "a", "tools": []}), 400,
           "tools")
    _error(harness.client.simulate_post("/detokenize", json={"tokens": [-1]}), 400, "tokens")


def test_overload_is_429_with_retry_after(frontend, tokenizer, tmp_path):
    h = AppHarness(frontend, tokenizer, tmp_path, engine=EngineOptions(1, 0))
    try:
        ids = tuple(tokenizer.encode("occupy"))
        with h.engine.submit(GenerationRequest(ids, max_tokens=200)) as busy:
            err = _error(h.chat({"messages": USER, "max_tokens": 1}), 429, None, "overloaded")
            assert "capacity" in err["message"]
            resp = h.chat({"messages": USER, "max_tokens": 1})
            assert int(resp.headers["retry-after"]) >= 1
            busy.cancel()
        for _ in range(100):
            if h.engine.outstanding == 0:
                break
            time.sleep(0.02)
        assert h.chat({"messages": USER, "max_tokens": 1}).status_code == 200
    finally:
        h.close()


def test_deadline_is_504(frontend, tokenizer, tmp_path):
    h = AppHarness(frontend, tokenizer, tmp_path, config=ServerConfig(timeout_s=1e-6))
    try:
        _error(h.chat({"messages": USER, "max_tokens": 3}), 504, None, "deadline_exceeded")
    finally:
        h.close()


def test_prompt_too_long_is_400_with_engine_reason(harness):
    err = _error(harness.chat({"messages": [{"role": "user", "content": "word " * 1100}]}),
                 400, "prompt", "request_rejected")
    assert "context" in err["message"]


def test_stream_close_cancels_and_frees_capacity(harness):
    """A client that goes away mid-stream: the iterable's close() cancels the requests."""
    status, headers, it = harness.raw_call(
        "/v1/chat/completions", {"messages": USER, "max_tokens": 200, "n": 2, "stream": True})
    assert status.startswith("200") and headers["content-type"] == "text/event-stream"
    chunks = [next(iter(it)) for _ in range(4)]
    assert all(c.startswith(b"data: {") for c in chunks)
    assert harness.engine.outstanding == 2
    it.close()
    for _ in range(200):
        snap = harness.engine.metrics_snapshot()
        if snap["outstanding"] == 0:
            break
        time.sleep(0.01)
    assert snap["outstanding"] == 0 and snap["kv_pages"]["used"] == 0
    assert snap["counters"]["finished_cancelled"] == 2
    assert harness.program.live_sequences() == 0
    assert _m(_metrics(harness), "ninfer:http_client_disconnects_total") == 1


class _BlockingSession(TokenOutputSession):
    """Holds the engine worker inside preview() until `release` is set."""

    def __init__(self, release: threading.Event):
        super().__init__()
        self._release = release

    def preview(self, token_ids, logprobs):
        self._release.wait(10)
        return super().preview(token_ids, logprobs)


def test_disconnect_while_queued_is_noticed(harness, tokenizer):
    """The client goes away while its request waits for admission (nothing is written)."""
    gone, release = threading.Event(), threading.Event()
    busy = harness.engine.submit(GenerationRequest(
        tuple(tokenizer.encode("busy")), max_tokens=2, session=_BlockingSession(release)))
    result = {}

    def call():
        status, _, it = harness.raw_call(
            "/v1/chat/completions", {"messages": USER, "max_tokens": 5},
            {"waitress.client_disconnected": gone.is_set})
        result["status"], result["body"] = status, b"".join(it)

    worker = threading.Thread(target=call)
    worker.start()
    time.sleep(0.3)
    assert "status" not in result  # still waiting
    gone.set()
    worker.join(10)
    release.set()
    busy.wait(10)
    assert result["status"].startswith("499")
    assert json.loads(result["body"])["error"]["code"] == "client_closed"
    assert _m(_metrics(harness), "ninfer:http_client_disconnects_total") == 1
    for _ in range(200):
        if harness.engine.outstanding == 0:
            break
        time.sleep(0.01)
    assert harness.engine.outstanding == 0


def _metrics(harness) -> dict:
    """(sample name, sorted labels) -> value of a /metrics scrape."""
    text = harness.client.simulate_get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _m(metrics: dict, name: str, **labels) -> float:
    return metrics[(name, tuple(sorted(labels.items())))]


def test_metrics_mapping(harness):
    assert harness.chat({"messages": USER, "max_tokens": 3}).status_code == 200
    harness.chat({"messages": []})
    m = _metrics(harness)
    assert _m(m, "ninfer:http_requests_total", status_class="2xx") >= 1
    assert _m(m, "ninfer:http_requests_total", status_class="4xx") == 1
    assert _m(m, "ninfer:requests_finished_total", finish_reason="length") >= 1
    assert _m(m, "ninfer:generation_tokens_total") >= 3
    assert _m(m, "ninfer:requests_outstanding") == 0
    assert _m(m, "ninfer:requests_outstanding_limit") == 8
    assert _m(m, "ninfer:kv_pages", state="used") == 0
    assert _m(m, "ninfer:model_state", state="ready") == 1
    count = _m(m, "ninfer:time_to_first_token_seconds_count")
    assert count >= 1
    assert _m(m, "ninfer:time_to_first_token_seconds_bucket", le="+Inf") == count


def test_openapi_covers_every_field(harness):
    doc = harness.client.simulate_get("/openapi.json").json
    assert doc["openapi"].startswith("3.1")
    for path, fields in (("/v1/chat/completions", CHAT_FIELDS),
                         ("/v1/completions", COMPLETION_FIELDS)):
        schema = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"][
            "schema"]
        assert set(schema["properties"]) == {f.name for f in fields}
        assert schema["additionalProperties"] is False
        assert schema["required"] == [f.name for f in fields if f.required]
        assert "429" in doc["paths"][path]["post"]["responses"]
    assert set(doc["paths"]) >= {"/v1/models", "/tokenize", "/detokenize", "/health",
                                 "/metrics", "/openapi.json"}


def test_auth(frontend, tokenizer, tmp_path):
    h = AppHarness(frontend, tokenizer, tmp_path, config=ServerConfig(api_key="sekret"))
    try:
        assert h.client.simulate_get("/health").status_code == 200
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekret"},
                        {"Authorization": "Basic sekret"}):
            resp = h.client.simulate_get("/v1/models", headers=headers)
            _error(resp, 401, None, "invalid_api_key")
            assert resp.headers["www-authenticate"] == "Bearer"
        _error(h.client.simulate_get("/metrics"), 401)
        ok = h.client.simulate_get("/v1/models", headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200
        assert h.client.simulate_get("/openapi.json", headers={
            "Authorization": "Bearer sekret"}).json["security"] == [{"bearer": []}]
    finally:
        h.close()


def test_health_while_loading_and_after_failure(frontend):
    release = threading.Event()

    def slow_loader():
        release.wait(10)
        raise ValueError("the artifact is broken")

    host = ModelHost(EngineOptions(1, 1))
    app, _ = create_app(host, ServerConfig())
    from falcon import testing

    client = testing.TestClient(app)
    host.start(slow_loader)
    resp = client.simulate_get("/health")
    assert resp.status_code == 503 and resp.json["status"] == "loading"
    _error(client.simulate_get("/v1/models"), 503, None, "loading")
    _error(client.simulate_post("/v1/chat/completions", json={"messages": USER}), 503)
    release.set()
    assert host.wait_loaded(10).value == "failed"
    resp = client.simulate_get("/health")
    assert resp.status_code == 503 and resp.json["reason"] == "the artifact is broken"
    err = _error(client.simulate_get("/v1/models"), 503, None, "load_failed")
    assert "the artifact is broken" in err["message"]
    assert "failed\"} 1.0" in client.simulate_get("/metrics").text


def test_unexpected_error_is_a_generic_500_without_content(harness, caplog, monkeypatch):
    secret = "SECRET-PROMPT-TEXT"

    def boom(*args, **kwargs):
        raise RuntimeError(f"cannot handle {secret}")

    monkeypatch.setattr(harness.host.served.frontend, "prepare_chat", boom)
    with caplog.at_level(logging.DEBUG, logger="ninfer"):
        resp = harness.chat({"messages": [{"role": "user", "content": secret}]})
    err = _error(resp, 500, None, "internal_error")
    assert secret not in err["message"]
    assert "RuntimeError" in caplog.text
    assert secret not in "".join(r.getMessage() for r in caplog.records)


def test_loaded_model_is_closed_on_shutdown(frontend):
    closed = threading.Event()
    from ninfer.testing.fake_program import FakeProgram

    host = ModelHost(EngineOptions(1, 1))
    host.load_now(lambda: LoadedModel("m", FakeProgram(vocab_size=248320), frontend,
                                      close=closed.set))
    assert host.state.value == "ready"
    host.close()
    assert closed.is_set() and host.state.value == "stopping"
    with pytest.raises(Exception) as info:
        host.ready()
    assert info.value.status == 503


def test_sampling_defaults_overrides_and_seeds(harness, frontend):
    served = harness.host.ready()
    defaults = frontend.sampling_defaults
    choices = chat_choices(served, parse_chat(
        {"messages": USER, "n": 3, "seed": 5, "top_p": 0.5, "max_tokens": 7}), JobLimits())
    for j, choice in enumerate(choices):
        sampling = choice.request.sampling
        assert (choice.index, sampling.seed, sampling.top_p) == (j, 5 + j, 0.5)
        assert (sampling.temperature, sampling.top_k) == (defaults["temperature"],
                                                          defaults["top_k"])
        assert choice.request.max_tokens == 7
    assert len({id(c.session) for c in choices}) == 3
    (choice,) = chat_choices(served, parse_chat(
        {"messages": USER, "top_k": -1, "repetition_penalty": 1.3, "presence_penalty": 0.5,
         "frequency_penalty": -0.5, "min_p": 0.1, "temperature": 0}), JobLimits())
    s = choice.request.sampling
    assert (s.top_k, s.repetition_penalty, s.presence_penalty, s.frequency_penalty, s.min_p,
            s.temperature, s.seed) == (0, 1.3, 0.5, -0.5, 0.1, 0.0, None)
    prompt_len = choice.prompt_tokens
    assert choice.request.max_tokens == served.max_context_len - prompt_len
    (choice,) = chat_choices(served, parse_chat({"messages": USER}),
                             JobLimits(default_max_tokens=11, timeout_s=3.0))
    assert (choice.request.max_tokens, choice.request.timeout_s) == (11, 3.0)


def test_ignore_eos_and_stop_token_ids(harness, tokenizer):
    body = {"messages": [{"role": "user", "content": STOP_TRIGGER}], "max_tokens": 12}
    plain = harness.chat(body).json
    assert plain["choices"][0]["message"]["content"] == STOP_TEXT
    assert plain["choices"][0]["finish_reason"] == "stop"
    eos_kept = harness.chat({**body, "ignore_eos": True}).json
    assert eos_kept["choices"][0]["finish_reason"] == "length"
    assert eos_kept["usage"]["completion_tokens"] == 12
    assert eos_kept["choices"][0]["message"]["content"].startswith(STOP_TEXT)
    beta = tokenizer.encode(" beta")
    assert len(beta) == 1
    cut = harness.chat({**body, "stop_token_ids": beta}).json["choices"][0]
    assert (cut["message"]["content"], cut["finish_reason"]) == ("alpha", "stop")
