"""One worker step: unit permits -> StepPlan -> Program.run -> decisions -> commit -> publish.

Permits go row by row (the protected resume first, then ticket order); a row that cannot get
its unit is left out without blocking the others. The plan holds a compact decode batch of the
rows that got permits (B = their number) and at most one prefill/Replay chunk, offered in
rotation (the protected resume first).

Commit order (seed: "Frontend preview -> Program commit -> budget -> OutputSession commit ->
publish"): every decode row is previewed with its session; cancelled or expired rows accept 0;
the whole PendingBatch is committed once (or aborted when a session fails: the rows' sequences
then Replay); then budgets and sessions commit and events are published; requests that reached
a terminal token are settled last.
"""
from __future__ import annotations

from typing import Callable

from ninfer.runtime.contract import (
    OutputPreview, PendingBatch, PendingRow, PrefillChunk, Program, RowDecision, StepPlan,
)
from ninfer.runtime.errors import RequestFailed, RequestRejected
from ninfer.runtime.events import OutputEvent
from ninfer.runtime.metrics import EngineMetrics
from ninfer.runtime.pressure import PressurePolicy
from ninfer.runtime.record import InvariantViolation, RequestRecord, RequestState
from ninfer.runtime.scheduler import Scheduler
from ninfer.runtime.settlement import SessionError, Settlement, call_session

Members = dict[int, RequestRecord]  # SequenceId -> record, for the rows of one plan


class StepRunner:
    def __init__(self, program: Program, scheduler: Scheduler, pressure: PressurePolicy,
                 settlement: Settlement, metrics: EngineMetrics, clock: Callable[[], float]):
        self._program = program
        self._sched = scheduler
        self._pressure = pressure
        self._settle = settlement
        self._metrics = metrics
        self._clock = clock
        self.pending: PendingBatch | None = None  # run but not yet committed/aborted

    # --- permits and plan --------------------------------------------------------------------
    def _permit(self, rec: RequestRecord, n_tokens: int) -> bool:
        if self._pressure.reserve(rec, n_tokens):
            return True
        if self._pressure.stranded(rec):
            self._settle.fail(rec, RequestRejected(
                "the request's context outgrew the engine's KV capacity", param="max_tokens"))
        return False

    def take_permits(self) -> tuple[list[RequestRecord], RequestRecord | None]:
        """Unit permits for the residents: (decode rows, the chunk row or None)."""
        prog = self._program
        decode: list[RequestRecord] = []
        needs_chunk: list[RequestRecord] = []
        for rec in self._sched.permit_order():
            if rec.state is not RequestState.RESIDENT:
                continue  # paused as a victim earlier in this loop
            if rec is self._sched.protected and \
                    prog.pages_needed(rec.seq, prog.next_unit_tokens(rec.seq)) > 0:
                self._sched.end_protection(rec)  # its resume permit is used up
            if prog.pending_prefill(rec.seq) > 0:
                needs_chunk.append(rec)
            elif self._permit(rec, 1):
                decode.append(rec)
        chunk = None
        for rec in self._sched.chunk_order(needs_chunk):
            if rec.state is not RequestState.RESIDENT:
                continue
            if self._permit(rec, prog.next_unit_tokens(rec.seq)):
                chunk = rec
                break
        return [r for r in decode if r.state is RequestState.RESIDENT], chunk

    def build_plan(self, decode: list[RequestRecord], chunk: RequestRecord | None,
                   admitted: list[RequestRecord]) -> tuple[StepPlan, Members] | None:
        """This step's plan; freshly admitted requests (their first unit is reserved) join the
        decode batch, or take the chunk when no resident did. None when nothing can run."""
        for rec in admitted:
            if self._program.pending_prefill(rec.seq) == 0:
                decode.append(rec)
            elif chunk is None:
                chunk = rec
        if not decode and chunk is None:
            return None
        members = {r.seq: r for r in decode}
        if chunk is not None:
            members[chunk.seq] = chunk
        plan = StepPlan(tuple(r.seq for r in decode),
                        PrefillChunk(chunk.seq) if chunk is not None else None)
        return plan, members

    # --- execute and settle ------------------------------------------------------------------
    def execute(self, plan: StepPlan, members: Members) -> None:
        self.pending = batch = self._program.run(plan)
        self._check_batch(plan, members, batch)
        now = self._clock()
        decisions: list[RowDecision] = []
        outcomes: list[tuple[OutputPreview | None, str | None]] = []
        for row in batch.rows:
            rec = members[row.seq]
            if row.is_prefill:
                decisions.append(RowDecision(0))
                outcomes.append((None, None))
                continue
            due = self._settle.due_end(rec, now)
            if due is not None:  # cancelled/expired row: accept nothing, end after commit
                decisions.append(RowDecision(0))
                outcomes.append((None, due))
                continue
            try:
                preview, reason = self._decide(rec, row)
            except SessionError as exc:
                self._abort(batch, rec, exc)
                return
            decisions.append(RowDecision(preview.accepted))
            outcomes.append((preview, reason))
        self._program.commit(batch, decisions)
        self.pending = None
        self._metrics.inc("steps")
        if plan.decode:
            self._metrics.inc("decode_rows", len(plan.decode))
            self._metrics.observe_batch(len(plan.decode))
        for row, (preview, why) in zip(batch.rows, outcomes):
            rec = members[row.seq]
            if row.is_prefill:
                self._metrics.inc("prefill_chunks")
                self._metrics.inc("prefill_tokens", row.prefill_tokens)
                self._sched.chunk_ran(rec)
            elif preview is None:
                self._settle.end_due(rec, why)
            else:
                self._publish(rec, row, preview, why)

    @staticmethod
    def _check_batch(plan: StepPlan, members: Members, batch: PendingBatch) -> None:
        """The batch must hold exactly the plan's rows: one chunk row (no tokens) if planned,
        and decode rows with at least one provisional token each."""
        chunk_seq = plan.prefill.seq if plan.prefill is not None else None
        ok = len(batch.rows) == len(members) and {r.seq for r in batch.rows} == set(members)
        for row in batch.rows:
            is_chunk = row.seq == chunk_seq
            ok = ok and row.is_prefill == is_chunk and (row.produced == 0 if is_chunk else
                                                         row.produced >= 1)
            ok = ok and len(row.logprobs) == len(row.top_logprobs) == row.produced
        if not ok:
            raise InvariantViolation(f"PendingBatch {batch.step_id} does not match its plan")

    def _decide(self, rec: RequestRecord, row: PendingRow) -> tuple[OutputPreview, str | None]:
        """Preview the row with the session, clipped to the request's remaining budget."""
        limit = min(row.produced, rec.remaining)
        preview = call_session(rec.session.preview, row.token_ids[:limit], row.logprobs[:limit])
        if not 1 <= preview.accepted <= limit:
            raise SessionError(f"preview accepted {preview.accepted} of {limit} tokens")
        reason = preview.finish_reason
        if reason is None:
            if preview.accepted != limit:
                raise SessionError("a nonterminal preview must accept every token")
            if len(rec.token_ids) + limit >= rec.budget:
                reason = "length"
        elif reason != "stop":
            raise SessionError(f"preview finish_reason must be 'stop' or None, got {reason!r}")
        return preview, reason

    def _abort(self, batch: PendingBatch, culprit: RequestRecord, exc: SessionError) -> None:
        self._program.abort_pending(batch)
        self.pending = None
        self._metrics.inc("aborted_batches")
        self._settle.fail(culprit, RequestFailed(str(exc)))

    def _publish(self, rec: RequestRecord, row: PendingRow, preview: OutputPreview,
                 reason: str | None) -> None:
        k = preview.accepted
        tokens, logprobs, top = row.token_ids[:k], row.logprobs[:k], row.top_logprobs[:k]
        rec.token_ids.extend(tokens)
        rec.logprobs.extend(logprobs)
        rec.top_logprobs.extend(top)
        self._sched.end_protection(rec)  # real new progress
        now = self._clock()
        if rec.first_token_at is None:
            rec.first_token_at = now
            self._metrics.observe_ttft(now - rec.submitted_at)
        else:
            self._metrics.observe_itl(now - rec.last_token_at, k)
        rec.last_token_at = now
        self._metrics.inc("generation_tokens", k)
        try:
            delta = call_session(rec.session.commit, preview)
        except SessionError as exc:
            self._settle.fail(rec, RequestFailed(str(exc)))
            return
        rec.channel.publish(OutputEvent(delta, tokens, logprobs, top))
        if reason is not None:
            self._settle.finish(rec, reason)
