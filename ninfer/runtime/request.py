"""GenerationRequest: the owning input of one generation (validated when built)."""
from __future__ import annotations

import dataclasses
import math
import uuid

from ninfer.errors import InvalidInput
from ninfer.runtime.contract import OutputSession, SamplingParams


def _new_request_id() -> str:
    return f"gen-{uuid.uuid4().hex}"


@dataclasses.dataclass(frozen=True)
class GenerationRequest:
    """One generation.

    - `prompt_token_ids`: the prompt, already tokenized (non-empty; the Program checks the ids).
    - `sampling`: sampling parameters; an unset seed is drawn at submit so that pause/replay
      reproduce the same tokens.
    - `max_tokens`: generation budget (>= 1); the request also ends with "length" at the
      Program's max_context_len.
    - `session`: the request's OutputSession (owned by the engine worker once submitted; give
      each request its own). None -> a `TokenOutputSession` with no stop ids.
    - `timeout_s`: one monotonic deadline from submit, covering queue and execution.
    - `queue_timeout_s`: the longest the request may wait before admission.
    """

    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = dataclasses.field(default_factory=SamplingParams)
    max_tokens: int = 16
    session: OutputSession | None = None
    timeout_s: float | None = None
    queue_timeout_s: float | None = None
    request_id: str = dataclasses.field(default_factory=_new_request_id)

    def __post_init__(self) -> None:
        try:
            ids = tuple(int(t) for t in self.prompt_token_ids)
        except (TypeError, ValueError) as exc:
            raise InvalidInput("prompt_token_ids must be integers", param="prompt") from exc
        object.__setattr__(self, "prompt_token_ids", ids)  # normalize a list to a tuple once
        if not ids:
            raise InvalidInput("prompt_token_ids is empty", param="prompt")
        if not isinstance(self.sampling, SamplingParams):
            raise InvalidInput("sampling must be a SamplingParams", param="sampling")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) \
                or self.max_tokens < 1:
            raise InvalidInput(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}",
                               param="max_tokens")
        for name in ("timeout_s", "queue_timeout_s"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, (int, float))
                                          and math.isfinite(value) and value > 0):
                raise InvalidInput(f"{name} must be a positive number or None, got {value!r}",
                                   param=name)
