"""The official openai SDK, unmodified, against ``ninfer serve --demo`` (the real CPU model).

The demo model has random weights, so its text is gibberish; the assertions are about the API:
greedy runs are deterministic, so streamed, non-streamed, token-id and text prompts, n>1 with
seeds and stop strings can all be checked against each other exactly.
"""
from __future__ import annotations

import math

import openai
import pytest


@pytest.fixture(scope="module")
def client(demo_server):
    return openai.OpenAI(base_url=demo_server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=300)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": "Name "},
                                         {"type": "text", "text": "three colours."}]}]


def _chat(client, model, **kw):
    return client.chat.completions.create(model=model, messages=MESSAGES, **kw)


def test_models(client, model):
    models = client.models.list()
    assert [m.id for m in models.data] == [model] == ["ninfer-demo-qwen3.5"]
    assert models.data[0].owned_by == "ninfer"
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.body["code"] == "model_not_found"


def test_chat_non_stream_and_stream_agree(client, model, tokenizer):
    full = _chat(client, model, max_tokens=6, temperature=0)
    choice = full.choices[0]
    assert full.object == "chat.completion" and full.model == model
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content
    assert full.usage.completion_tokens == 6
    assert full.usage.total_tokens == full.usage.prompt_tokens + 6

    chunks = list(_chat(client, model, max_tokens=6, temperature=0, stream=True,
                        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert text == choice.message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    assert len({c.id for c in chunks}) == 1


def test_completions_text_and_token_ids_agree(client, model, tokenizer):
    prompt = "The capital of France is"
    by_text = client.completions.create(model=model, prompt=prompt, max_tokens=5,
                                        temperature=0)
    ids = tokenizer.encode(prompt)
    by_ids = client.completions.create(model=model, prompt=ids, max_tokens=5, temperature=0)
    assert by_text.object == "text_completion"
    assert by_text.choices[0].text == by_ids.choices[0].text
    assert by_text.choices[0].text
    assert by_text.usage.prompt_tokens == len(ids) and by_text.usage.completion_tokens == 5
    streamed = client.completions.create(model=model, prompt=prompt, max_tokens=5,
                                         temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == by_text.choices[0].text
    batch = client.completions.create(model=model, prompt=[prompt, "Once upon a time"],
                                      max_tokens=3, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == by_text.choices[0].text[:len(batch.choices[0].text)]


def test_chat_logprobs(client, model):
    out = _chat(client, model, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    content = out.choices[0].logprobs.content
    assert len(content) == out.usage.completion_tokens == 4
    assert "".join(e.token for e in content) == out.choices[0].message.content
    for entry in content:
        assert math.isfinite(entry.logprob) and entry.logprob <= 0
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
        assert len(entry.top_logprobs) == 3
        tops = [t.logprob for t in entry.top_logprobs]
        assert tops == sorted(tops, reverse=True)
        # greedy: the chosen token is the most likely one
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob, abs=1e-5)
    streamed = _chat(client, model, max_tokens=4, temperature=0, logprobs=True, stream=True)
    tokens = [e.token for c in streamed if c.choices and c.choices[0].logprobs
              for e in c.choices[0].logprobs.content]
    assert tokens == [e.token for e in content]


def test_completion_logprobs(client, model):
    out = client.completions.create(model=model, prompt="Hello there", max_tokens=3,
                                    temperature=0, logprobs=2)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert "".join(lp.tokens) == out.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(3)]
    assert all(len(top) <= 2 and max(top.values()) <= 0 for top in lp.top_logprobs)


SAMPLED = {"temperature": 1.0, "top_p": 1.0, "extra_body": {"top_k": 0}}


def test_seed_reproducibility(client, model):
    def sample(seed):
        return _chat(client, model, max_tokens=6, seed=seed, **SAMPLED).choices[0].message.content

    first = sample(1234)
    assert sample(1234) == first
    assert any(sample(s) != first for s in (1235, 1236))


def test_n_choices_follow_seeds(client, model):
    both = _chat(client, model, n=2, max_tokens=5, seed=77, **SAMPLED)
    assert [c.index for c in both.choices] == [0, 1]
    assert both.usage.completion_tokens == 10
    singles = [_chat(client, model, max_tokens=5, seed=s, **SAMPLED) for s in (77, 78)]
    assert [c.message.content for c in both.choices] == \
        [s.choices[0].message.content for s in singles]
    assert both.usage.prompt_tokens == singles[0].usage.prompt_tokens
    streamed = _chat(client, model, n=2, max_tokens=5, seed=77, stream=True, **SAMPLED)
    texts = ["", ""]
    for chunk in streamed:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts == [c.message.content for c in both.choices]


def test_stop_strings(client, model):
    text = _chat(client, model, max_tokens=12, temperature=0).choices[0].message.content
    assert len(text) >= 4
    stop = text[len(text) // 2: len(text) // 2 + 2]
    expected = text[:text.find(stop)]
    for stops in (stop, [stop, "\u2603never\u2603"]):
        out = _chat(client, model, max_tokens=12, temperature=0, stop=stops)
        assert out.choices[0].message.content == expected
        assert out.choices[0].finish_reason == "stop"
    streamed = _chat(client, model, max_tokens=12, temperature=0, stop=stop, stream=True)
    chunks = [c for c in streamed if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_sdk_errors(client, model):
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, model, max_tokens=2, response_format={"type": "json_object"})
    assert info.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as info:
        _chat(client, model, temperature=5)
    assert info.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as info:  # 1024-token context
        client.chat.completions.create(model=model, max_tokens=2, messages=[
            {"role": "user", "content": "word " * 1100}])
    assert info.value.body["param"] == "prompt" and "context" in info.value.message
