"""Token scripts for the scripted server (``ninfer serve --scripted-program``).

Each script is model output text encoded with the real Qwen3.5 tokenizer and ended by
<|im_end|>; a request whose prompt contains the trigger gets it. Requests without a trigger get
the default script: <|im_end|> at once (so fuzzed requests end after one decode step).
"""
from __future__ import annotations

import json

API_KEY = "test-key-5f1c"  # the scripted server's --api-key

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                           "metric": {"type": "boolean"}},
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {"name": "web.search",
                 "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}},
}

TOOL_TRIGGER = "TRIGGER-TOOL"
TOOL_TEXT = ("I will look that up.\n\n<tool_call>\n<function=get_weather>\n"
             "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
             "</function>\n</tool_call>\n<tool_call>\n<function=web.search>\n"
             "<parameter=query>\nParis événements\n</parameter>\n</function>\n</tool_call>")
TOOL_CALLS = [("get_weather", {"city": "Paris", "days": 3}),
              ("web.search", {"query": "Paris événements"})]
TOOL_CONTENT = "I will look that up."

REASONING_TRIGGER = "TRIGGER-REASONING"
REASONING_TEXT = "The user wants 2+2.\n</think>\n\nThe answer is 4."
REASONING = "The user wants 2+2."
ANSWER = "The answer is 4."

# With tool_choice naming get_weather the prompt already ends in
# "<tool_call>\n<function=get_weather>\n"; the model continues from there.
NAMED_TRIGGER = "TRIGGER-NAMED"
NAMED_TEXT = "<parameter=city>\nRome\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n" \
             "</function>\n</tool_call>"
NAMED_ARGS = {"city": "Rome", "metric": True}

STOP_TRIGGER = "TRIGGER-STOP"
STOP_TEXT = "alpha beta STOP gamma delta"


def script_file_text(tokenizer) -> str:
    """The JSON script file for `tokenizer` (a QwenTokenizer)."""
    end = tokenizer.special.im_end

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text) + [end]

    scripts = [
        {"trigger": TOOL_TRIGGER, "tokens": ids(TOOL_TEXT)},
        {"trigger": REASONING_TRIGGER, "tokens": ids(REASONING_TEXT)},
        {"trigger": NAMED_TRIGGER, "tokens": ids(NAMED_TEXT)},
        {"trigger": STOP_TRIGGER, "tokens": ids(STOP_TEXT)},
    ]
    return json.dumps({"scripts": scripts, "default": [end]})
