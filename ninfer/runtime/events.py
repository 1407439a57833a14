"""Events a GenerationHandle yields, and the final GenerationResult.

Order per request: at most one `GenerationStart` (after admission, before any output), then
`OutputEvent`s, then exactly one terminal event: `GenerationFinished` or `GenerationFailed`.
A request that ends before admission (rejected, overloaded, expired, cancelled while waiting)
has no GenerationStart. Events carry no engine internals (no slot or page identity).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Literal, Union

from ninfer.runtime.contract import TopLogprob
from ninfer.runtime.errors import GenerationError

FinishReason = Literal["stop", "length", "cancelled", "deadline", "error"]
"""stop: the output session ended it (stop token/string); length: max_tokens or the model's
context limit; cancelled: cancelled after it started; deadline/error: only on the `partial`
result an error carries."""


@dataclasses.dataclass(frozen=True, slots=True)
class Timings:
    """Monotonic durations in seconds, measured by the engine worker."""

    queued_s: float  # submit -> admission (0 when never admitted)
    ttft_s: float | None  # submit -> first output token (None without output)
    total_s: float  # submit -> end


@dataclasses.dataclass(frozen=True, slots=True)
class GenerationResult:
    request_id: str
    finish_reason: FinishReason
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[tuple[TopLogprob, ...], ...]
    prompt_tokens: int
    completion_tokens: int
    final_delta: Any  # what OutputSession.finish returned (None when nothing was held back)
    timings: Timings


@dataclasses.dataclass(frozen=True, slots=True)
class GenerationStart:
    request_id: str
    prompt_tokens: int


@dataclasses.dataclass(frozen=True, slots=True)
class OutputEvent:
    """Tokens one step committed for the request; `delta` is what OutputSession.commit returned."""

    delta: Any
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[tuple[TopLogprob, ...], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class GenerationFinished:
    result: GenerationResult


@dataclasses.dataclass(frozen=True, slots=True)
class GenerationFailed:
    error: GenerationError


GenerationEvent = Union[GenerationStart, OutputEvent, GenerationFinished, GenerationFailed]
TerminalEvent = Union[GenerationFinished, GenerationFailed]
