"""Request parameters of the generation routes: field tables and their parsed form.

The tables (`CHAT_FIELDS`, `COMPLETION_FIELDS`, ...) are the single source of truth for what
each route accepts; /openapi.json is generated from them. `parse_chat` / `parse_completion`
return frozen dataclasses with defaults resolved where the server (not the model) owns them.
Sampling fields that are absent stay None so the model's `sampling_defaults` can fill them.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from ninfer.serve import schemas
from ninfer.serve.errors import ApiError
from ninfer.serve.fields import Field, Kind, Unsupported, parse_fields, token_ids

__all__ = [
    "CHAT_FIELDS", "CHAT_SCHEMA_EXTRA", "CHAT_UNSUPPORTED", "COMPLETION_FIELDS",
    "COMPLETION_SCHEMA_EXTRA", "COMPLETION_UNSUPPORTED",
    "DETOKENIZE_FIELDS", "MAX_N", "SAMPLING_KEYS", "TOKENIZE_FIELDS", "ChatParams",
    "CompletionParams", "GenerationParams", "parse_chat", "parse_completion",
]

MAX_N = 8
MAX_SEED = 2**63 - 1
# SamplingParams fields a request may set (None: the model's default)
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                 "frequency_penalty", "repetition_penalty")

_COMMON = (
    Field("model", Kind.STRING, "Served model id (see GET /v1/models); optional."),
    Field("stream", Kind.BOOL, "Stream the output as server-sent events."),
    Field("stream_options", Kind.OBJECT, "Streaming options; only with stream: true.",
          schema=schemas.STREAM_OPTIONS),
    Field("n", Kind.INT, "Number of independent choices.", minimum=1, maximum=MAX_N),
    Field("max_tokens", Kind.INT, "Most tokens to generate (clipped to the context).",
          minimum=1),
    Field("temperature", Kind.NUMBER, "Sampling temperature; 0 is greedy.", minimum=0,
          maximum=2),
    # Bounds below are tighter than SamplingParams' where a legal value would not survive the
    # sampler's float32/int32 inputs (top_p or repetition_penalty underflowing to 0, top_k
    # overflowing int32): such a request must get a 400, never reach the engine.
    Field("top_p", Kind.NUMBER, "Nucleus sampling mass.", minimum=1e-6, maximum=1),
    Field("top_k", Kind.INT, "Keep the k most likely tokens; 0 or -1 disables.", minimum=-1,
          maximum=2**31 - 1),
    Field("min_p", Kind.NUMBER, "Drop tokens below min_p times the top probability.",
          minimum=0, maximum=1),
    Field("presence_penalty", Kind.NUMBER, "OpenAI presence penalty.", minimum=-2, maximum=2),
    Field("frequency_penalty", Kind.NUMBER, "OpenAI frequency penalty.", minimum=-2,
          maximum=2),
    Field("repetition_penalty", Kind.NUMBER, "Multiplicative repetition penalty (1 = off).",
          minimum=0.01, maximum=100),
    Field("seed", Kind.INT, "Sampling seed; choice i uses seed + i.", minimum=0,
          maximum=MAX_SEED),
    Field("stop", Kind.ANY, "Stop string or list of up to 16 stop strings.",
          schema=schemas.STOP),
    Field("stop_token_ids", Kind.ARRAY, "Extra token ids that end the output.",
          schema=schemas.TOKEN_IDS, max_length=64),
    Field("ignore_eos", Kind.BOOL, "Keep generating past the model's end-of-sequence tokens."),
    Field("skip_special_tokens", Kind.BOOL, "Drop special tokens from the text (default "
          "true)."),
    Field("user", Kind.STRING, "Accepted for compatibility and ignored.", max_length=256),
)

CHAT_FIELDS = (
    Field("messages", Kind.ARRAY, "The conversation.", required=True, schema=schemas.MESSAGES),
    *_COMMON,
    Field("max_completion_tokens", Kind.INT, "Same as max_tokens (wins when both are set).",
          minimum=1),
    Field("tools", Kind.ARRAY, "Functions the model may call.", schema=schemas.TOOLS,
          max_length=128),
    Field("tool_choice", Kind.ANY, "none, auto, required or a named function.",
          schema=schemas.TOOL_CHOICE),
    Field("parallel_tool_calls", Kind.BOOL, "Only true (the default) is supported.",
          enum=(True,)),
    Field("logprobs", Kind.BOOL, "Return the log-probability of each output token."),
    Field("top_logprobs", Kind.INT, "Alternatives per token (needs logprobs: true).",
          minimum=0, maximum=20),
    Field("chat_template_kwargs", Kind.OBJECT, "Extra chat template variables, e.g. "
          "{\"enable_thinking\": true}.", schema={"type": "object"}),
)

_CONSTRAINED = "constrained decoding is not supported yet"
CHAT_UNSUPPORTED = (
    Unsupported("response_format", _CONSTRAINED, neutral=({"type": "text"},)),
    Unsupported("guided_json", _CONSTRAINED),
    Unsupported("guided_regex", _CONSTRAINED),
    Unsupported("guided_choice", _CONSTRAINED),
    Unsupported("guided_grammar", _CONSTRAINED),
    Unsupported("structured_outputs", _CONSTRAINED),
    Unsupported("logit_bias", "logit bias is not supported", neutral=({},)),
    Unsupported("functions", "use tools", neutral=([],)),
    Unsupported("function_call", "use tool_choice"),
    Unsupported("audio", "audio output is not supported"),
    Unsupported("modalities", "only text output is supported", neutral=(["text"],)),
    Unsupported("prediction", "predicted outputs are not supported"),
    Unsupported("reasoning_effort", "use chat_template_kwargs.enable_thinking"),
    Unsupported("web_search_options", "web search is not supported"),
    Unsupported("store", "stored completions are not supported", neutral=(False,)),
    Unsupported("metadata", "stored completions are not supported", neutral=({},)),
    Unsupported("service_tier", "service tiers are not supported",
                neutral=("auto", "default")),
)

COMPLETION_FIELDS = (
    Field("prompt", Kind.ANY, "Text, token ids, or a list of either (one choice set each).",
          required=True, schema=schemas.PROMPT),
    *_COMMON,
    Field("logprobs", Kind.INT, "Return logprobs with this many alternatives per token.",
          minimum=0, maximum=20),
)
COMPLETION_UNSUPPORTED = (
    Unsupported("echo", "echo is not supported", neutral=(False,)),
    Unsupported("suffix", "suffix (insertion) is not supported", neutral=("",)),
    Unsupported("best_of", "best_of is not supported", neutral=(1,)),
    Unsupported("logit_bias", "logit bias is not supported", neutral=({},)),
    Unsupported("response_format", _CONSTRAINED),
    Unsupported("guided_json", _CONSTRAINED),
    Unsupported("guided_regex", _CONSTRAINED),
    Unsupported("guided_choice", _CONSTRAINED),
    Unsupported("guided_grammar", _CONSTRAINED),
)

# cross-field rules, stated in the OpenAPI schema too (parse_* enforces them)
_NEEDS_STREAM = {"stream_options": {"required": ["stream"],
                                    "properties": {"stream": {"const": True}}}}
COMPLETION_SCHEMA_EXTRA = {"dependentSchemas": _NEEDS_STREAM}
CHAT_SCHEMA_EXTRA = {"dependentSchemas": {
    **_NEEDS_STREAM,
    "top_logprobs": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}},
}}

TOKENIZE_FIELDS = (
    Field("model", Kind.STRING, "Served model id; optional."),
    Field("prompt", Kind.STRING, "Text to tokenize (or give messages)."),
    Field("messages", Kind.ARRAY, "A conversation, rendered with the chat template.",
          schema=schemas.MESSAGES),
    Field("add_generation_prompt", Kind.BOOL, "With messages: end with the assistant turn "
          "header (default true)."),
    Field("tools", Kind.ARRAY, "With messages: tools rendered into the prompt.",
          schema=schemas.TOOLS, max_length=128),
    Field("chat_template_kwargs", Kind.OBJECT, "With messages: extra template variables.",
          schema={"type": "object"}),
    Field("return_token_strs", Kind.BOOL, "Also return each token's text."),
)
DETOKENIZE_FIELDS = (
    Field("model", Kind.STRING, "Served model id; optional."),
    Field("tokens", Kind.ARRAY, "Token ids to decode.", required=True,
          schema=schemas.TOKEN_IDS),
)


@dataclasses.dataclass(frozen=True)
class GenerationParams:
    """What chat and text completions share (after validation)."""

    model: str | None
    n: int
    stream: bool
    include_usage: bool
    max_tokens: int | None  # None: up to the server default / the context limit
    sampling: Mapping[str, float | int]  # the SAMPLING_KEYS the request set
    seed: int | None
    top_logprobs: int | None  # None: no logprobs; k: k alternatives per token
    stop: Any
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    skip_special_tokens: bool


@dataclasses.dataclass(frozen=True)
class ChatParams:
    gen: GenerationParams
    messages: list
    tools: list | None
    tool_choice: Any
    chat_template_kwargs: Mapping[str, Any] | None


@dataclasses.dataclass(frozen=True)
class CompletionParams:
    gen: GenerationParams
    prompts: tuple[str | tuple[int, ...], ...]


def _include_usage(v: Mapping[str, Any]) -> bool:
    options = v["stream_options"]
    if options is None:
        return False
    if not v["stream"]:
        raise ApiError(400, "stream_options is only allowed with stream: true",
                       param="stream_options", code="invalid_value")
    unknown = set(options) - {"include_usage"}
    if unknown:
        raise ApiError(400, f"unknown stream_options field {sorted(unknown)[0]!r}",
                       param="stream_options", code="unknown_parameter")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise ApiError(400, "stream_options.include_usage must be a boolean",
                       param="stream_options.include_usage", code="invalid_value")
    return include


def _stop_token_ids(value: list | None) -> tuple[int, ...]:
    ids = token_ids(value or [])
    if ids is None:
        raise ApiError(400, "stop_token_ids must be a list of integers", param="stop_token_ids",
                       code="invalid_value")
    return ids


def _generation(v: Mapping[str, Any], *, max_tokens: int | None,
                top_logprobs: int | None) -> GenerationParams:
    sampling = {k: v[k] for k in SAMPLING_KEYS if v[k] is not None}
    if sampling.get("top_k") == -1:
        sampling["top_k"] = 0
    return GenerationParams(
        model=v["model"], n=v["n"] or 1, stream=bool(v["stream"]), include_usage=_include_usage(v),
        max_tokens=max_tokens, sampling=sampling, seed=v["seed"], top_logprobs=top_logprobs,
        stop=v["stop"], stop_token_ids=_stop_token_ids(v["stop_token_ids"]),
        ignore_eos=bool(v["ignore_eos"]),
        skip_special_tokens=v["skip_special_tokens"] is not False,
    )


def parse_chat(body: Mapping[str, Any]) -> ChatParams:
    v = parse_fields(body, CHAT_FIELDS, CHAT_UNSUPPORTED)
    if v["top_logprobs"] is not None and not v["logprobs"]:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs",
                       code="invalid_value")
    top = (v["top_logprobs"] or 0) if v["logprobs"] else None
    max_tokens = v["max_completion_tokens"] or v["max_tokens"]
    return ChatParams(
        gen=_generation(v, max_tokens=max_tokens, top_logprobs=top),
        messages=v["messages"], tools=v["tools"], tool_choice=v["tool_choice"],
        chat_template_kwargs=v["chat_template_kwargs"],
    )


def _prompts(prompt: Any) -> tuple[str | tuple[int, ...], ...]:
    if isinstance(prompt, str):
        return (prompt,)
    ids = token_ids(prompt)
    if ids:
        return (ids,)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return tuple(prompt)
        lists = [token_ids(p) for p in prompt]
        if all(lists):
            return tuple(lists)
    raise ApiError(400, "prompt must be a string, a non-empty list of token ids, or a "
                   "non-empty list of strings or of token-id lists", param="prompt",
                   code="invalid_value")


def parse_completion(body: Mapping[str, Any]) -> CompletionParams:
    v = parse_fields(body, COMPLETION_FIELDS, COMPLETION_UNSUPPORTED)
    return CompletionParams(
        gen=_generation(v, max_tokens=v["max_tokens"], top_logprobs=v["logprobs"]),
        prompts=_prompts(v["prompt"]),
    )
