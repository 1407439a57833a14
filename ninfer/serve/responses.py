"""OpenAI response objects: chat completions, text completions, their stream chunks, usage
and logprobs. Pure functions of frontend/engine outputs; no I/O.

Logprobs cover every accepted output token (the stop token included), aligned with
`usage.completion_tokens`. A logprob that is not finite is reported as -9999.0 (JSON has no
infinity). Token text comes from the tokenizer (`token_text`, invalid UTF-8 replaced) and
`bytes` are the token's raw bytes.
"""
from __future__ import annotations

import math
import secrets
from typing import Any, Sequence

from ninfer.runtime.contract import TopLogprob

__all__ = [
    "LogprobFormatter", "chat_chunk", "chat_completion", "chat_delta", "chat_message",
    "completion", "completion_chunk", "new_id", "usage",
]

MIN_LOGPROB = -9999.0


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _finite(value: float) -> float:
    return float(value) if math.isfinite(value) else MIN_LOGPROB


class LogprobFormatter:
    """Formats logprobs with one model's tokenizer (read-only, thread-safe)."""

    def __init__(self, tokenizer):
        self._tok = tokenizer

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": self._tok.token_text(token_id), "logprob": _finite(logprob),
                "bytes": list(self._tok.token_bytes(token_id))}

    def chat(self, token_ids: Sequence[int], logprobs: Sequence[float],
             tops: Sequence[Sequence[TopLogprob]]) -> dict[str, Any]:
        """``{"content": [...]}`` of a chat choice or chunk."""
        content = []
        for tid, lp, top in zip(token_ids, logprobs, tops):
            entry = self._entry(tid, lp)
            entry["top_logprobs"] = [self._entry(t.token_id, t.logprob) for t in top]
            content.append(entry)
        return {"content": content, "refusal": None}

    def completion(self, token_ids: Sequence[int], logprobs: Sequence[float],
                   tops: Sequence[Sequence[TopLogprob]], *, with_top: bool,
                   offset: int = 0) -> dict[str, Any]:
        """The legacy completions block; `offset` is the text offset of the first token."""
        tokens, offsets = [], []
        for tid in token_ids:
            text = self._tok.token_text(tid)
            tokens.append(text)
            offsets.append(offset)
            offset += len(text)
        top_maps = None
        if with_top:
            top_maps = [{self._tok.token_text(t.token_id): _finite(t.logprob) for t in top}
                        for top in tops]
        return {"tokens": tokens, "token_logprobs": [_finite(x) for x in logprobs],
                "top_logprobs": top_maps, "text_offset": offsets}


def chat_message(final) -> dict[str, Any]:
    """The assistant message of a finished choice (`final`: the session's FinalOutput)."""
    calls = [c.to_openai() for c in final.tool_calls]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": final.content if final.content or not calls else None,
        "reasoning_content": final.reasoning_content or None,
    }
    if calls:
        message["tool_calls"] = calls
    return message


def chat_delta(delta, *, first: bool) -> dict[str, Any]:
    """The ``delta`` of a chat chunk from an OutputDelta (None: nothing but maybe the role)."""
    out: dict[str, Any] = {"role": "assistant"} if first else {}
    if first:
        out["content"] = ""
    if delta is None:
        return out
    if delta.content:
        out["content"] = delta.content
    if delta.reasoning:
        out["reasoning_content"] = delta.reasoning
    if delta.tool_calls:
        out["tool_calls"] = [c.to_openai() for c in delta.tool_calls]
    return out


def _envelope(object_name: str, id_: str, created: int, model: str,
              choices: list[dict[str, Any]], usage_: dict[str, int] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"id": id_, "object": object_name, "created": created,
                           "model": model, "choices": choices}
    if usage_ is not None:
        out["usage"] = usage_
    return out


def chat_completion(id_: str, created: int, model: str, choices: list[dict[str, Any]],
                    usage_: dict[str, int]) -> dict[str, Any]:
    return _envelope("chat.completion", id_, created, model, choices, usage_)


def chat_chunk(id_: str, created: int, model: str, choices: list[dict[str, Any]],
               usage_: dict[str, int] | None = None) -> dict[str, Any]:
    return _envelope("chat.completion.chunk", id_, created, model, choices, usage_)


def completion(id_: str, created: int, model: str, choices: list[dict[str, Any]],
               usage_: dict[str, int] | None) -> dict[str, Any]:
    return _envelope("text_completion", id_, created, model, choices, usage_)


completion_chunk = completion  # OpenAI streams text completions as the same object
