"""Fixtures of the frontend tests: the real Qwen3.5 tokenizer (built once per test session)
and a frontend over it with the packaged chat template."""
from __future__ import annotations

import pytest

from ninfer.models.common.qwen import QwenFrontend, QwenTokenizer
from tools.demo.qwen_tokenizer import build_qwen35_tokenizer_json

GENERATION_DEFAULTS = {
    "bos_token_id": 248044,
    "do_sample": True,
    "eos_token_id": [248046, 248044],
    "pad_token_id": 248044,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}
MODEL_VOCAB = 248320  # the embedding range of the real checkpoints (padded past the tokenizer)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "options": {"type": "object"},
                "metric": {"type": "boolean"},
                "hours": {"type": "array", "items": {"type": "number"}},
                "note": {"type": ["string", "null"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "web.search",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
    },
}


@pytest.fixture(scope="session")
def tokenizer_json() -> str:
    return build_qwen35_tokenizer_json()


@pytest.fixture(scope="session")
def frontend(tokenizer_json) -> QwenFrontend:
    return QwenFrontend.from_resources(tokenizer_json, None, GENERATION_DEFAULTS, MODEL_VOCAB)


@pytest.fixture(scope="session")
def tokenizer(frontend) -> QwenTokenizer:
    return frontend.tokenizer
