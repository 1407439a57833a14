"""`Qwen35Program`: the runtime's Program contract for the Qwen3.5 text model.

It owns the sequences (token ledgers, frontiers, sampling counters), their physical resources
(StateImage slots, KV pages, host snapshots) and the step execution, which it delegates to a
backend (`CpuBackend` here; the CUDA backend offers the same methods). The contract, including
the ledger/frontier model and the PendingBatch rules, is documented in
ninfer/runtime/contract/program.py.
"""
from __future__ import annotations

import itertools
import math
from typing import Sequence

from ninfer.errors import InvalidInput
from ninfer.models.qwen3_5.sequences import (
    ReplayPayload, SeqPhase, SequenceRecord, SnapshotPayload,
)
from ninfer.runtime.contract import (
    Capacity, PendingBatch, PendingRow, ProgramLimits, ResumeKind, ResumeState, RowDecision,
    SamplingParams, SequenceId, StepPlan, TopLogprob,
)


class ProgramMisuse(RuntimeError):
    """The caller broke the Program contract (an engine invariant, not a user error)."""


class Qwen35Program:
    def __init__(self, backend, limits: ProgramLimits, host_snapshot_bytes: int):
        self.backend = backend
        self._limits = limits
        self._snapshot_total = int(host_snapshot_bytes)
        self._snapshot_used = 0
        self._seqs: dict[int, SequenceRecord] = {}
        self._ids = itertools.count(1)
        self._steps = itertools.count(1)
        self._pending: PendingBatch | None = None

    # -- facts -----------------------------------------------------------------------------------
    @property
    def limits(self) -> ProgramLimits:
        return self._limits

    def capacity(self) -> Capacity:
        return Capacity(
            free_pages=self.backend.pages.num_free, total_pages=self._limits.total_pages,
            free_slots=self.backend.slots_free(), total_slots=self._limits.total_slots,
            host_snapshot_bytes_free=self._snapshot_total - self._snapshot_used,
            host_snapshot_bytes_total=self._snapshot_total,
        )

    # -- sequences ---------------------------------------------------------------------------
    def _checked_ids(self, token_ids: Sequence[int], max_len: int, why: str) -> list[int]:
        ids = [int(t) for t in token_ids]
        if not ids:
            raise InvalidInput("the prompt is empty", param="prompt")
        vocab = self._limits.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise InvalidInput(f"token id {bad[0]} is outside the vocabulary [0, {vocab})",
                               param="prompt")
        if len(ids) > max_len:
            raise InvalidInput(f"the prompt has {len(ids)} tokens; the context limit is "
                               f"{self._limits.max_context_len}{why}", param="prompt")
        return ids

    def open_sequence(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> SequenceId:
        ids = self._checked_ids(prompt_ids, self._limits.max_context_len - 1,
                                " (prompt + at least one output token)")
        if sampling.seed is None:
            raise ProgramMisuse("open_sequence needs a sampling seed (SamplingParams.with_seed())")
        seq_id = next(self._ids)
        self._seqs[seq_id] = SequenceRecord(seq_id, ids, len(ids), sampling)
        return seq_id

    def _rec(self, seq: SequenceId) -> SequenceRecord:
        try:
            return self._seqs[seq]
        except KeyError:
            raise ProgramMisuse(f"unknown or released sequence {seq}") from None

    def pending_prefill(self, seq: SequenceId) -> int:
        return self._rec(seq).pending_prefill

    def ledger_len(self, seq: SequenceId) -> int:
        return len(self._rec(seq).ledger)

    def next_unit_tokens(self, seq: SequenceId) -> int:
        rec = self._rec(seq)
        return rec.next_chunk_len(self._limits.prefill_chunk) or 1

    def _pages_for(self, tokens: int) -> int:
        return math.ceil(tokens / self._limits.page_size)

    def pages_needed(self, seq: SequenceId, n_tokens: int) -> int:
        rec = self._rec(seq)
        return max(0, self._pages_for(rec.frontier + n_tokens) - len(rec.pages))

    def reserve_units(self, seq: SequenceId, n_tokens: int) -> bool:
        rec = self._rec(seq)
        if rec.phase is not SeqPhase.LIVE:
            raise ProgramMisuse(f"sequence {seq} cannot reserve while {rec.phase.value}")
        if rec.frontier + n_tokens > self._limits.max_context_len:
            raise ProgramMisuse(f"sequence {seq} would exceed the context limit")
        return self._hold(rec, rec.frontier + n_tokens)

    def _hold(self, rec: SequenceRecord, tokens: int) -> bool:
        """Atomically hold a slot and pages for `tokens` positions (all or nothing)."""
        extra = max(0, self._pages_for(tokens) - len(rec.pages))
        new_slot = rec.slot is None
        if new_slot and self.backend.slots_free() == 0:
            return False
        pages = self.backend.pages.allocate(extra) if extra else []
        if pages is None:
            return False
        if new_slot:
            rec.slot = self.backend.allocate_slot()
            self.backend.zero_state(rec.slot)
        if pages or new_slot:  # unchanged otherwise (on CUDA each write is a host-to-device copy)
            rec.pages.extend(pages)
            self.backend.set_block_table(rec.slot, rec.pages)
        return True

    def _drop_resources(self, rec: SequenceRecord) -> None:
        if rec.pages:
            self.backend.pages.free(rec.pages)
            rec.pages = []
        if rec.slot is not None:
            self.backend.free_slot(rec.slot)
            rec.slot = None

    def release(self, seq: SequenceId) -> None:
        rec = self._rec(seq)
        if rec.phase is SeqPhase.PENDING:
            raise ProgramMisuse(f"sequence {seq} is in an unconsumed PendingBatch")
        self._drop_resources(rec)
        del self._seqs[seq]

    # -- execution -------------------------------------------------------------------------
    def run(self, plan: StepPlan) -> PendingBatch:
        if self._pending is not None:
            raise ProgramMisuse("the previous PendingBatch was not consumed")
        members = ([plan.prefill.seq] if plan.prefill else []) + list(plan.decode)
        if len(set(members)) != len(members):
            raise ProgramMisuse("a sequence appears twice in one StepPlan")
        if len(plan.decode) > self._limits.max_batch:
            raise ProgramMisuse(f"{len(plan.decode)} decode rows exceed max_batch")
        inputs = self.backend.step_inputs
        inputs.reset()
        prefill_len = 0
        if plan.prefill is not None:
            rec = self._checked(plan.prefill.seq, need_tokens=None)
            prefill_len = rec.next_chunk_len(self._limits.prefill_chunk)
            if prefill_len == 0:
                raise ProgramMisuse(f"sequence {rec.seq_id} has nothing to prefill")
            self._need_held(rec, prefill_len)
            inputs.add_segment(rec.slot, rec.ledger[rec.frontier: rec.frontier + prefill_len],
                               rec.frontier)
        decode_recs = []
        for seq in plan.decode:
            rec = self._checked(seq, need_tokens=1)
            if rec.pending_prefill:
                raise ProgramMisuse(f"sequence {seq} is not decode-ready")
            inputs.add_segment(rec.slot, rec.ledger[-1:], rec.frontier)
            decode_recs.append(rec)
        sampler = self.backend.sampler_inputs
        sampler.fill(decode_recs)
        self.backend.execute(num_decode=len(decode_recs))
        rows = []
        if plan.prefill is not None:
            rows.append(PendingRow(plan.prefill.seq, True, (), (), (), prefill_tokens=prefill_len))
        for i, rec in enumerate(decode_recs):
            top = tuple(TopLogprob(int(sampler.top_ids[i, j]), float(sampler.top_logprobs[i, j]))
                        for j in range(rec.sampling.top_logprobs))
            rows.append(PendingRow(rec.seq_id, False, (int(sampler.tokens[i]),),
                                   (float(sampler.logprobs[i]),), (top,)))
        for seq in members:
            self._seqs[seq].phase = SeqPhase.PENDING
        self._pending = PendingBatch(rows=tuple(rows), step_id=next(self._steps))
        return self._pending

    def _checked(self, seq: SequenceId, need_tokens: int | None) -> SequenceRecord:
        rec = self._rec(seq)
        if rec.phase is not SeqPhase.LIVE:
            raise ProgramMisuse(f"sequence {seq} is {rec.phase.value}")
        if need_tokens is not None:
            self._need_held(rec, need_tokens)
        return rec

    def _need_held(self, rec: SequenceRecord, tokens: int) -> None:
        if rec.slot is None or len(rec.pages) < self._pages_for(rec.frontier + tokens):
            raise ProgramMisuse(f"sequence {rec.seq_id} runs without reserved units")

    def _take_pending(self, batch: PendingBatch) -> None:
        if batch is not self._pending or batch.consumed:
            raise ProgramMisuse("PendingBatch is not the Program's unconsumed batch")
        batch.consumed = True
        self._pending = None

    def commit(self, batch: PendingBatch, decisions: Sequence[RowDecision]) -> None:
        if len(decisions) != len(batch.rows):
            raise ProgramMisuse("one RowDecision per PendingBatch row is required")
        for row, d in zip(batch.rows, decisions):
            if row.is_prefill and d.accepted != 0:
                raise ProgramMisuse("prefill rows accept 0 tokens")
            if not row.is_prefill and not 0 <= d.accepted <= row.produced:
                raise ProgramMisuse(f"accepted {d.accepted} outside [0, {row.produced}]")
        self._take_pending(batch)
        for row, d in zip(batch.rows, decisions):
            rec = self._seqs[row.seq]
            rec.phase = SeqPhase.LIVE
            if row.is_prefill:
                rec.frontier += row.prefill_tokens
                continue
            rec.frontier += 1  # ledger[-1] was fed
            if d.accepted:
                rec.accept(row.token_ids[0])
            else:
                rec.phase = SeqPhase.CLOSED

    def abort_pending(self, batch: PendingBatch) -> None:
        self._take_pending(batch)
        for row in batch.rows:
            rec = self._seqs[row.seq]
            rec.phase = SeqPhase.LIVE
            self._restart_from_zero(rec)

    def _restart_from_zero(self, rec: SequenceRecord) -> None:
        """State no longer matches the ledger: rebuild it by Replay from position 0."""
        rec.frontier = 0
        if rec.slot is not None:
            self.backend.zero_state(rec.slot)

    # -- scoring ---------------------------------------------------------------------------
    def prompt_logits(self, token_ids: Sequence[int]) -> "object":
        """Logits f32[T, V] of every position of `token_ids` (the CausalScoring building block).

        Runs on a temporary sequence in prefill-chunk pieces; needs a free slot and pages for T
        tokens, and frees them afterwards.
        """
        ids = self._checked_ids(token_ids, self._limits.max_context_len, "")
        rec = SequenceRecord(next(self._ids), ids, len(ids), SamplingParams(seed=0))
        try:
            if not self._hold(rec, len(ids)):
                raise ProgramMisuse("not enough free slots/pages to score this prompt now")
            return self.backend.score(rec.slot, ids, self._limits.prefill_chunk)
        finally:
            self._drop_resources(rec)

    # -- pause / resume --------------------------------------------------------------------
    def pause(self, seq: SequenceId, prefer: ResumeKind) -> ResumeState:
        rec = self._rec(seq)
        if rec.phase is not SeqPhase.LIVE:
            raise ProgramMisuse(f"sequence {seq} cannot pause while {rec.phase.value}")
        replay = ReplayPayload(list(rec.ledger), rec.prompt_len, rec.sampling, dict(rec.out_counts))
        state = ResumeState(ResumeKind.REPLAY, len(rec.ledger), 0, replay)
        if prefer is ResumeKind.SNAPSHOT and rec.slot is not None and rec.frontier > 0:
            size = self.backend.snapshot_bytes(rec.frontier)
            if self._snapshot_used + size <= self._snapshot_total:
                image = self.backend.copy_out_state(rec.slot)
                kv = self.backend.copy_out_kv(rec.pages, rec.frontier)
                state = ResumeState(ResumeKind.SNAPSHOT, len(rec.ledger), size,
                                    SnapshotPayload(replay, rec.frontier, image, kv))
                self._snapshot_used += size
        self._drop_resources(rec)
        del self._seqs[seq]
        return state

    def revoke_snapshot(self, state: ResumeState) -> ResumeState:
        if state.kind is not ResumeKind.SNAPSHOT:
            return state
        self._snapshot_used -= state.host_bytes
        replay = state.payload.replay
        state.payload = None  # the snapshot's memory goes with it
        return ResumeState(ResumeKind.REPLAY, state.ledger_len, 0, replay)

    def discard_resume_state(self, state: ResumeState) -> None:
        if state.kind is ResumeKind.SNAPSHOT and state.payload is not None:
            self._snapshot_used -= state.host_bytes
            state.payload = None

    def resume(self, state: ResumeState) -> SequenceId | None:
        snap = state.payload if state.kind is ResumeKind.SNAPSHOT else None
        replay: ReplayPayload = snap.replay if snap is not None else state.payload
        rec = SequenceRecord(next(self._ids), list(replay.ledger), replay.prompt_len,
                             replay.sampling, out_counts=dict(replay.out_counts))
        # back to the old frontier plus the first new unit: positions [0, len(ledger))
        if not self._hold(rec, len(rec.ledger)):
            self._drop_resources(rec)
            return None
        if snap is not None:
            self.backend.copy_in_state(rec.slot, snap.state_image)
            self.backend.copy_in_kv(rec.pages, snap.kv_blocks)
            rec.frontier = snap.frontier
            self._snapshot_used -= state.host_bytes
            state.payload = None
        self._seqs[rec.seq_id] = rec
        return rec.seq_id
