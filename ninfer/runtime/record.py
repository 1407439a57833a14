"""RequestRecord and its lifecycle state (engine-worker-only data).

    WAITING --admission--> RESIDENT --pause--> PAUSED --resume--> RESIDENT
       \\                      \\                  \\
        +-------------------- FINISHED <-----------+   (terminal: result or error published)

Prefill vs decode vs Replay is not stored: it is derived from the Program's ledger
(`pending_prefill`), so the record cannot disagree with the Program. A record keeps its session,
budget and published output across pauses; resume re-publishes nothing.
"""
from __future__ import annotations

import dataclasses
import enum

from ninfer.errors import NinferError
from ninfer.runtime.contract import OutputSession, ResumeState, SamplingParams, SequenceId
from ninfer.runtime.contract.program import TopLogprob
from ninfer.runtime.events import FinishReason, GenerationResult, Timings
from ninfer.runtime.handle import ResponseChannel
from ninfer.runtime.request import GenerationRequest


class InvariantViolation(NinferError):
    """The engine's own bookkeeping broke; the engine fails loudly."""


class RequestState(enum.IntEnum):
    WAITING = 0
    RESIDENT = 1
    PAUSED = 2
    FINISHED = 3


ALLOWED_TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    RequestState.WAITING: frozenset({RequestState.RESIDENT, RequestState.FINISHED}),
    RequestState.RESIDENT: frozenset({RequestState.PAUSED, RequestState.FINISHED}),
    RequestState.PAUSED: frozenset({RequestState.RESIDENT, RequestState.FINISHED}),
    RequestState.FINISHED: frozenset(),
}


@dataclasses.dataclass(eq=False)
class RequestRecord:
    """One accepted request. `ticket` is its submission order (smaller = older)."""

    ticket: int
    request: GenerationRequest
    channel: ResponseChannel
    session: OutputSession
    sampling: SamplingParams  # seeded copy of request.sampling
    submitted_at: float
    deadline: float | None
    queue_deadline: float | None
    state: RequestState = RequestState.WAITING
    seq: SequenceId | None = None  # live while WAITING (opened) and RESIDENT
    resume_state: ResumeState | None = None  # live while PAUSED
    budget: int = 0  # most output tokens (max_tokens, clipped by max_context_len)
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top_logprobs: list[tuple[TopLogprob, ...]] = dataclasses.field(default_factory=list)
    admitted_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    bypassed: int = 0  # times fresh admission let a younger request pass this one

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def started(self) -> bool:
        return self.admitted_at is not None

    @property
    def remaining(self) -> int:
        return self.budget - len(self.token_ids)

    def transition(self, new: RequestState) -> None:
        if new not in ALLOWED_TRANSITIONS[self.state]:
            raise InvariantViolation(
                f"{self.request.request_id}: illegal transition {self.state.name} -> {new.name}")
        self.state = new

    def result(self, reason: FinishReason, final_delta: object, now: float) -> GenerationResult:
        queued = (self.admitted_at or now) - self.submitted_at if self.started else 0.0
        ttft = None if self.first_token_at is None else self.first_token_at - self.submitted_at
        return GenerationResult(
            request_id=self.request.request_id, finish_reason=reason,
            token_ids=tuple(self.token_ids), logprobs=tuple(self.logprobs),
            top_logprobs=tuple(self.top_logprobs), prompt_tokens=self.prompt_len,
            completion_tokens=len(self.token_ids), final_delta=final_delta,
            timings=Timings(queued, ttft, now - self.submitted_at))
