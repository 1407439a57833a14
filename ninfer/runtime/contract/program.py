"""The Program contract: what a model offers the engine worker.

A Program owns every physical resource of one model instance (KV pages, StateImage slots, host
snapshots, workspace, graphs) and every sequence's model state. The runtime never touches those:
it asks the Program with the calls below, from the engine worker thread only.

Sequence model (token ledger)
-----------------------------
A sequence has a *ledger* of tokens: the prompt, then every accepted output token. Its
*frontier* is how many ledger tokens have been fed through the model (their KV / recurrent state
exists). The ledger's last token is always fed by a *decode* unit, which produces the next
token; every earlier token is fed by *prefill* chunks. So:

- ``pending_prefill(seq) = max(0, len(ledger) - 1 - frontier)``: tokens a prefill/Replay chunk
  may still feed; > 0 means the sequence needs prefill (or Replay) before it can decode.
- ``pending_prefill(seq) == 0`` means the sequence is decode-ready: the next decode unit feeds
  ledger[-1] at position len(ledger) - 1 and samples one token.

A one-token prompt is decode-ready at once. Prefill chunk boundaries fall at absolute positions
that are multiples of ``ProgramLimits.prefill_chunk`` (the Program picks the chunk, the runtime
only asks for one), so they depend on the request alone.

Resources and units
-------------------
``reserve_units(seq, n_tokens)`` atomically makes sure the sequence holds a StateImage slot and
KV pages covering positions [0, frontier + n_tokens). It either grants everything or changes
nothing. Granted resources stay with the sequence until ``pause`` or ``release``.

One step
--------
``run(plan)`` executes at most one prefill chunk and one decode batch, and returns a
``PendingBatch``: frozen membership, one provisional token per decode row (``produced == 1``)
and ``produced == 0`` for the prefill row. The engine previews the decode rows with each
request's OutputSession and then consumes the whole batch exactly once, either with
``commit(batch, decisions)`` (one ``RowDecision`` per row, in row order) or with
``abort_pending(batch)``. Rules for decisions: a cancelled row accepts 0; any other decode row
accepts ``1 <= accepted <= produced``; a nonterminal row accepts everything produced. Prefill rows
always take ``RowDecision(accepted=0)``; their progress commits with the batch.

Pause and resume
----------------
``pause(seq, prefer)`` may only be called between steps (no batch pending for ``seq``). It frees
the sequence's slot and pages and returns an owning ``ResumeState``: a Snapshot (state image and
KV coverage copied to host memory, within the host snapshot budget) or a Replay (the ledger and
sampling counter only; resume re-executes the history as prefill chunks). ``prefer`` is a
preference; the Program returns Replay when a Snapshot does not fit. ``revoke_snapshot`` turns a
Snapshot into a Replay and frees its host memory. A Program may keep a Snapshot's KV pages in
device memory instead (``ResumeState.device_pages > 0``); revoking it then frees those pages too,
which is why the engine revokes such Snapshots under device pressure. ``resume(state)`` atomically reserves
everything the sequence needs to get back to its frontier plus its first new unit and returns a
live SequenceId, or None when that does not fit now (nothing changes then). A resumed sequence
never re-samples tokens already in its ledger: its sampling counter is part of the state.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Protocol, Sequence, runtime_checkable

from ninfer.runtime.contract.sampling import SamplingParams

SequenceId = int
"""Opaque handle the Program hands out; valid until `release` or `pause`."""


@dataclasses.dataclass(frozen=True, slots=True)
class ProgramLimits:
    """Static facts the runtime plans with."""

    max_context_len: int  # ledger length limit (prompt + output) of one sequence
    vocab_size: int  # ids in [0, vocab_size) are representable inputs
    page_size: int  # tokens per KV page
    total_pages: int
    total_slots: int  # StateImage slots (= most sequences holding state at once)
    max_batch: int  # most decode rows in one step (= max_concurrency)
    prefill_chunk: int  # prefill chunk size; boundaries at multiples of it


@dataclasses.dataclass(frozen=True, slots=True)
class Capacity:
    """A snapshot of free physical resources (the Program's stores are the only ledger)."""

    free_pages: int
    total_pages: int
    free_slots: int
    total_slots: int
    host_snapshot_bytes_free: int
    host_snapshot_bytes_total: int


@dataclasses.dataclass(frozen=True, slots=True)
class PrefillChunk:
    seq: SequenceId


@dataclasses.dataclass(frozen=True, slots=True)
class StepPlan:
    """One worker step: decode rows (B = len(decode)) and at most one prefill/Replay chunk.

    Every sequence in the plan must hold the units it needs (reserve_units succeeded).
    A sequence appears at most once.
    """

    decode: tuple[SequenceId, ...] = ()
    prefill: PrefillChunk | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class TopLogprob:
    token_id: int
    logprob: float


@dataclasses.dataclass(frozen=True, slots=True)
class PendingRow:
    """One row of a PendingBatch.

    `token_ids` are provisional (empty for a prefill row). `logprobs[i]` is the log-probability
    of token_ids[i] under the model's distribution before sampling-time filters (raw
    log-softmax of the logits). `top_logprobs[i]` lists the request's top alternatives.
    """

    seq: SequenceId
    is_prefill: bool
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[tuple[TopLogprob, ...], ...]
    prefill_tokens: int = 0  # tokens a prefill row fed

    @property
    def produced(self) -> int:
        return len(self.token_ids)


@dataclasses.dataclass(eq=False, slots=True)
class PendingBatch:
    """Move-only result of `Program.run`; must be consumed exactly once."""

    rows: tuple[PendingRow, ...]
    step_id: int
    consumed: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class RowDecision:
    accepted: int  # number of produced tokens to keep (0 for cancelled and prefill rows)


class ResumeKind(enum.Enum):
    SNAPSHOT = "snapshot"
    REPLAY = "replay"


@dataclasses.dataclass(eq=False)
class ResumeState:
    """Owning pause result. `payload` is private to the Program that made it."""

    kind: ResumeKind
    ledger_len: int  # ledger tokens at pause time (prompt + accepted outputs)
    host_bytes: int  # host memory it holds (0 for Replay)
    payload: object
    # Device KV pages the state still holds (a Snapshot kept in device memory; 0 for host
    # Snapshots and Replays). The engine revokes such Snapshots under device pressure before it
    # pauses a resident; revoke_snapshot frees them. Added by the engine-core issue (#5).
    device_pages: int = 0


@runtime_checkable
class Program(Protocol):
    """Implemented by each model's Program (CPU and CUDA backends alike)."""

    @property
    def limits(self) -> ProgramLimits: ...

    def capacity(self) -> Capacity: ...

    # --- sequences -------------------------------------------------------------------
    def open_sequence(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> SequenceId:
        """Create a logical sequence (no physical resources yet).

        Raises InvalidInput for an empty prompt, ids outside [0, vocab_size) or a prompt that
        leaves no room for one output token within max_context_len. `sampling.seed` must be set.
        """

    def pending_prefill(self, seq: SequenceId) -> int:
        """Ledger tokens still to be fed by prefill/Replay chunks (0 = decode-ready)."""

    def ledger_len(self, seq: SequenceId) -> int: ...

    def next_unit_tokens(self, seq: SequenceId) -> int:
        """Tokens the sequence's next unit feeds: its next prefill chunk, or 1 for decode."""

    def reserve_units(self, seq: SequenceId, n_tokens: int) -> bool:
        """Atomically hold a slot and pages for positions [0, frontier + n_tokens)."""

    def pages_needed(self, seq: SequenceId, n_tokens: int) -> int:
        """Extra pages `reserve_units(seq, n_tokens)` would take now (for planning)."""

    def release(self, seq: SequenceId) -> None:
        """Free everything the sequence holds; the id becomes invalid."""

    # --- execution -----------------------------------------------------------------------
    def run(self, plan: StepPlan) -> PendingBatch: ...

    def commit(self, batch: PendingBatch, decisions: Sequence[RowDecision]) -> None: ...

    def abort_pending(self, batch: PendingBatch) -> None:
        """Discard a batch: rows' provisional tokens are dropped; their sequences must Replay."""

    # --- pause / resume ------------------------------------------------------------------
    def pause(self, seq: SequenceId, prefer: ResumeKind) -> ResumeState: ...

    def revoke_snapshot(self, state: ResumeState) -> ResumeState: ...

    def resume(self, state: ResumeState) -> SequenceId | None: ...

    def discard_resume_state(self, state: ResumeState) -> None:
        """Free a paused request's ResumeState (cancellation while paused)."""
