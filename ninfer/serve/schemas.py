"""JSON schemas (OpenAPI 3.1 / JSON Schema 2020-12) of nested request values and of responses.

Request fragments describe what the frontend accepts (it performs the deep validation and names
the nested field on error); response schemas describe what `responses.py` builds. Both feed
/openapi.json and thereby the schema fuzz test.
"""
from __future__ import annotations

__all__ = [
    "CHAT_COMPLETION", "CHAT_CHUNK", "COMPLETION", "COMPLETION_CHUNK", "DETOKENIZE_RESPONSE",
    "ERROR", "HEALTH", "MESSAGES", "MODEL", "MODEL_LIST", "PROMPT", "STOP", "STREAM_OPTIONS",
    "TOKENIZE_RESPONSE", "TOKEN_ID", "TOKEN_IDS", "TOOLS", "TOOL_CHOICE",
]

_STR = {"type": "string"}
_INT = {"type": "integer"}
_NULLABLE_STR = {"type": ["string", "null"]}

# --- requests ---------------------------------------------------------------------------------
# "x-token-id" marks where /openapi.json adds the served model's id range (maximum)
TOKEN_ID = {"type": "integer", "minimum": 0, "x-token-id": True}
TOKEN_IDS = {"type": "array", "items": TOKEN_ID}
_TOKEN_IDS_NONEMPTY = {**TOKEN_IDS, "minItems": 1}

STOP = {"anyOf": [
    {"type": "string", "minLength": 1},
    {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 16},
]}
PROMPT = {"anyOf": [
    {"type": "string", "minLength": 1},
    _TOKEN_IDS_NONEMPTY,
    {"type": "array", "minItems": 1, "maxItems": 8, "items": {"type": "string", "minLength": 1}},
    {"type": "array", "minItems": 1, "maxItems": 8, "items": _TOKEN_IDS_NONEMPTY},
]}
STREAM_OPTIONS = {"type": "object", "properties": {"include_usage": {"type": "boolean"}},
                  "additionalProperties": False}

_TEXT_PART = {"type": "object", "required": ["type", "text"],
              "properties": {"type": {"const": "text"}, "text": _STR}}
_IMAGE_PART = {
    "type": "object", "required": ["type", "image_url"],
    "description": "Accepted by the schema; refused with 400 until vision is supported.",
    "properties": {"type": {"const": "image_url"},
                   "image_url": {"type": "object", "required": ["url"],
                                 "properties": {"url": _STR}}},
}
_CONTENT = {"anyOf": [_STR, {"type": "array", "items": {"anyOf": [_TEXT_PART, _IMAGE_PART]}},
                      {"type": "null"}]}
_CALL_FUNCTION = {
    "type": "object", "required": ["name", "arguments"],
    "properties": {"name": {"type": "string", "minLength": 1},
                   "arguments": {"type": "string", "description": "a JSON object as text"}},
}
_MESSAGE_TOOL_CALL = {
    "type": "object", "required": ["type", "function"],
    "properties": {"id": _STR, "type": {"const": "function"}, "function": _CALL_FUNCTION},
}
_MESSAGE_COMMON = {"content": _CONTENT, "name": _STR}
MESSAGES = {
    "type": "array", "minItems": 1,
    "items": {"anyOf": [
        {"type": "object", "required": ["role", "content"],
         "properties": {**_MESSAGE_COMMON, "role": {"enum": ["system", "user"]},
                        "content": {"anyOf": _CONTENT["anyOf"][:2]}}},
        {"type": "object", "required": ["role", "content"],
         "properties": {**_MESSAGE_COMMON, "role": {"const": "tool"},
                        "content": {"anyOf": _CONTENT["anyOf"][:2]}, "tool_call_id": _STR}},
        {"type": "object", "required": ["role"],
         "properties": {**_MESSAGE_COMMON, "role": {"const": "assistant"},
                        "tool_calls": {"type": "array", "items": _MESSAGE_TOOL_CALL},
                        "reasoning_content": _STR}},
    ]},
}
TOOLS = {"type": "array", "items": {
    "type": "object", "required": ["type", "function"],
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object", "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$"},
                "description": _STR,
                "parameters": {"type": "object", "description": "JSON schema of the arguments"},
            },
        },
    },
}}
TOOL_CHOICE = {"anyOf": [
    {"enum": ["none", "auto", "required"]},
    {"type": "object", "required": ["type", "function"],
     "properties": {"type": {"const": "function"},
                    "function": {"type": "object", "required": ["name"],
                                 "properties": {"name": _STR}}}},
]}

# --- responses --------------------------------------------------------------------------------
ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {"message": _STR, "type": _STR, "param": _NULLABLE_STR,
                       "code": _NULLABLE_STR},
    }},
}
_USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
          "properties": {"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT}}
_FINISH = {"type": ["string", "null"],
           "enum": ["stop", "length", "tool_calls", "cancelled", None]}
_TOP = {"type": "object", "required": ["token", "logprob", "bytes"],
        "properties": {"token": _STR, "logprob": {"type": "number"},
                       "bytes": {"type": "array", "items": _INT}}}
_CHAT_LOGPROBS = {"type": ["object", "null"], "properties": {"content": {
    "type": "array",
    "items": {**_TOP, "required": ["token", "logprob", "bytes", "top_logprobs"],
              "properties": {**_TOP["properties"],
                             "top_logprobs": {"type": "array", "items": _TOP}}},
}}}
_TOOL_CALL_OUT = {
    "type": "object", "required": ["id", "type", "function"],
    "properties": {"id": _STR, "type": {"const": "function"},
                   "function": {"type": "object", "required": ["name", "arguments"],
                                "properties": {"name": _STR, "arguments": _STR}}},
}
_ASSISTANT = {
    "type": "object", "required": ["role", "content"],
    "properties": {"role": {"const": "assistant"}, "content": _NULLABLE_STR,
                   "reasoning_content": _NULLABLE_STR,
                   "tool_calls": {"type": "array", "items": _TOOL_CALL_OUT}},
}


def _completion_object(object_name: str, choice: dict) -> dict:
    return {
        "type": "object", "required": ["id", "object", "created", "model", "choices"],
        "properties": {"id": _STR, "object": {"const": object_name}, "created": _INT,
                       "model": _STR, "choices": {"type": "array", "items": choice},
                       "usage": _USAGE},
    }


CHAT_COMPLETION = _completion_object("chat.completion", {
    "type": "object", "required": ["index", "message", "finish_reason"],
    "properties": {"index": _INT, "message": _ASSISTANT, "logprobs": _CHAT_LOGPROBS,
                   "finish_reason": _FINISH},
})
CHAT_CHUNK = _completion_object("chat.completion.chunk", {
    "type": "object", "required": ["index", "delta"],
    "properties": {"index": _INT, "delta": {"type": "object"}, "logprobs": _CHAT_LOGPROBS,
                   "finish_reason": _FINISH},
})
_COMPLETION_LOGPROBS = {"type": ["object", "null"], "properties": {
    "tokens": {"type": "array", "items": _STR},
    "token_logprobs": {"type": "array", "items": {"type": "number"}},
    "top_logprobs": {"type": ["array", "null"]},
    "text_offset": {"type": "array", "items": _INT},
}}
COMPLETION = _completion_object("text_completion", {
    "type": "object", "required": ["index", "text", "finish_reason"],
    "properties": {"index": _INT, "text": _STR, "logprobs": _COMPLETION_LOGPROBS,
                   "finish_reason": _FINISH},
})
COMPLETION_CHUNK = COMPLETION
MODEL = {"type": "object", "required": ["id", "object", "created", "owned_by"],
         "properties": {"id": _STR, "object": {"const": "model"}, "created": _INT,
                        "owned_by": _STR, "max_model_len": _INT}}
MODEL_LIST = {"type": "object", "required": ["object", "data"],
              "properties": {"object": {"const": "list"},
                             "data": {"type": "array", "items": MODEL}}}
TOKENIZE_RESPONSE = {"type": "object", "required": ["tokens", "count", "max_model_len"],
                     "properties": {"tokens": {"type": "array", "items": _INT}, "count": _INT,
                                    "max_model_len": _INT,
                                    "token_strs": {"type": "array", "items": _STR}}}
DETOKENIZE_RESPONSE = {"type": "object", "required": ["prompt"], "properties": {"prompt": _STR}}
HEALTH = {"type": "object", "required": ["status"],
          "properties": {"status": {"enum": ["loading", "ready", "failed", "stopping"]},
                         "model": _NULLABLE_STR, "reason": _NULLABLE_STR}}
