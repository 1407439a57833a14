"""From validated parameters to engine requests: one `Choice` per engine request.

A chat request with `n` choices is `n` independent engine requests over one PreparedPrompt;
a text completion with P prompts and `n` choices is P*n requests, choice index ``p*n + j`` (as
in OpenAI's API). Each choice owns its output session. Sampling fields the request omits come
from the model's `frontend.sampling_defaults`; with a seed, choice j uses ``seed + j``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from ninfer.runtime.contract import SamplingParams
from ninfer.runtime.request import GenerationRequest
from ninfer.serve.errors import ApiError
from ninfer.serve.lifecycle import ServedModel
from ninfer.serve.params import ChatParams, CompletionParams, GenerationParams

__all__ = ["Choice", "JobLimits", "chat_choices", "completion_choices", "prompt_tokens_total"]


@dataclasses.dataclass(frozen=True)
class JobLimits:
    """Server-side limits that shape requests (from the CLI)."""

    default_max_tokens: int | None = None  # None: up to the context limit
    timeout_s: float | None = None  # per-request deadline covering queue and execution


@dataclasses.dataclass(frozen=True)
class Choice:
    index: int  # the response's choice index
    prompt_index: int  # which prompt (text completions with several prompts)
    prompt_tokens: int
    session: Any  # QwenOutputSession, owned by the engine worker until the request ends
    request: GenerationRequest


def _sampling(served: ServedModel, gen: GenerationParams, j: int) -> SamplingParams:
    values = {**served.frontend.sampling_defaults, **gen.sampling}
    seed = None if gen.seed is None else gen.seed + j
    return SamplingParams(**values, seed=seed, top_logprobs=gen.top_logprobs or 0)


def _check_capacity(served: ServedModel, count: int) -> None:
    limit = served.engine.max_outstanding
    if count > limit:
        raise ApiError(400, f"the request asks for {count} choices; this server runs at most "
                       f"{limit} requests at once", param="n", code="too_many_choices")


def _choices(served: ServedModel, gen: GenerationParams, limits: JobLimits,
             prepared: list) -> list[Choice]:
    _check_capacity(served, len(prepared) * gen.n)
    out = []
    for p_index, prompt in enumerate(prepared):
        # a prompt that leaves no room is submitted anyway: the engine rejects it with its
        # own reason (context or KV capacity), which becomes the 400's message
        room = max(1, served.max_context_len - prompt.num_tokens)
        max_tokens = min(gen.max_tokens or limits.default_max_tokens or room, room)
        for j in range(gen.n):
            session = served.frontend.new_session(
                prompt, stop=gen.stop, stop_token_ids=gen.stop_token_ids,
                ignore_eos=gen.ignore_eos, skip_special_tokens=gen.skip_special_tokens)
            request = GenerationRequest(
                prompt.token_ids, sampling=_sampling(served, gen, j), max_tokens=max_tokens,
                session=session, timeout_s=limits.timeout_s)
            out.append(Choice(len(out), p_index, prompt.num_tokens, session, request))
    return out


def chat_choices(served: ServedModel, params: ChatParams, limits: JobLimits) -> list[Choice]:
    prepared = served.frontend.prepare_chat(
        params.messages, tools=params.tools,
        tool_choice=params.tool_choice if params.tool_choice is not None else "auto",
        chat_template_kwargs=params.chat_template_kwargs)
    return _choices(served, params.gen, limits, [prepared])


def completion_choices(served: ServedModel, params: CompletionParams,
                       limits: JobLimits) -> list[Choice]:
    prepared = [served.frontend.prepare_completion(list(p) if isinstance(p, tuple) else p)
                for p in params.prompts]
    return _choices(served, params.gen, limits, prepared)


def prompt_tokens_total(choices: Sequence[Choice]) -> int:
    """Usage: each prompt counts once, however many choices share it."""
    seen: dict[int, int] = {}
    for c in choices:
        seen[c.prompt_index] = c.prompt_tokens
    return sum(seen.values())
