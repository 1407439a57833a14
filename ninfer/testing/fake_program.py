"""FakeProgram: a pure-Python Program that implements `ninfer.runtime.contract.program` exactly.

It lets the engine tests run fast and deterministically, and it is strict: every contract misuse
raises `ContractViolation` at once (running a sequence without reserved units, running while a
PendingBatch is unconsumed, consuming a batch twice, accepting more than was produced, a ledger
past max_context_len, using a paused/released/cancelled sequence, calls from two threads at once).

Model: a sequence's "recurrent state" is a hash chain over the tokens fed so far, stored in its
StateImage slot; its "KV" is the fed token ids, written into the pages it holds (freed pages are
poisoned). A decode unit reads every KV position back and checks it against the ledger, then
draws the next token from (state, KV digest) for greedy requests and additionally (seed, output
index) for sampled ones. The token therefore depends only on the ledger, the seed and the output
index: identical whether the request ran alone, batched, paused (Snapshot or Replay) or replayed
after an aborted batch. Prefill chunks end at absolute multiples of `prefill_chunk`.

Snapshots hold `state_bytes + kv_bytes_per_token * frontier` host bytes from a fixed host
budget. With `snapshot_location="device"` a Snapshot keeps its KV pages on device instead
(`ResumeState.device_pages`) and only the state image goes to host memory.
"""
from __future__ import annotations

import dataclasses
import functools
import threading
from collections import deque
from typing import Sequence

from ninfer.errors import InvalidInput, NinferError
from ninfer.runtime.contract import (
    Capacity, PendingBatch, PendingRow, ProgramLimits, ResumeKind, ResumeState, RowDecision,
    SamplingParams, SequenceId, StepPlan, TopLogprob,
)

_MASK = (1 << 64) - 1
_STATE0 = 0x243F6A8885A308D3


class ContractViolation(NinferError):
    """The caller broke the Program contract (an engine bug, never a user error)."""


def _mix(*values: int) -> int:
    """A splitmix64-style hash of a few integers (deterministic across runs and platforms)."""
    h = 0x9E3779B97F4A7C15
    for v in values:
        h = ((h ^ (v & _MASK)) * 0xBF58476D1CE4E5B9) & _MASK
        h ^= h >> 31
        h = (h * 0x94D049BB133111EB) & _MASK
        h ^= h >> 29
    return h


def _exclusive(method):
    """Raise ContractViolation when another thread is inside the Program (re-entry is fine)."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if not self._in_call.acquire(blocking=False):
            raise ContractViolation(f"{method.__name__}() called while another thread is "
                                    "inside the Program")
        try:
            return method(self, *args, **kwargs)
        finally:
            self._in_call.release()

    return wrapper


@dataclasses.dataclass(eq=False)
class _Seq:
    ledger: list[int]
    prompt_len: int
    sampling: SamplingParams
    frontier: int = 0
    slot: int | None = None
    pages: list[int] = dataclasses.field(default_factory=list)
    dead: bool = False  # committed with accepted=0 (cancelled): only release() is legal


@dataclasses.dataclass(eq=False)
class _Paused:
    ledger: list[int]
    prompt_len: int
    sampling: SamplingParams
    target: int  # coverage resume must reserve: old frontier + its next unit
    frontier: int = 0  # Snapshot only
    state: int = _STATE0  # Snapshot only
    kv: list[int] = dataclasses.field(default_factory=list)  # host Snapshot only
    pages: list[int] = dataclasses.field(default_factory=list)  # device Snapshot only
    host_bytes: int = 0


class FakeProgram:
    """See the module docstring. All sizes are small integers chosen by the test."""

    def __init__(self, *, vocab_size: int = 64, max_context_len: int = 128, page_size: int = 4,
                 total_pages: int = 256, total_slots: int = 8, max_batch: int = 8,
                 prefill_chunk: int = 8, host_snapshot_bytes: int = 1 << 20,
                 state_bytes: int = 256, kv_bytes_per_token: int = 16,
                 snapshot_location: str = "host"):
        if snapshot_location not in ("host", "device"):
            raise InvalidInput("snapshot_location must be 'host' or 'device'",
                               param="snapshot_location")
        self._limits = ProgramLimits(max_context_len, vocab_size, page_size, total_pages,
                                     total_slots, max_batch, prefill_chunk)
        self._free_pages = deque(range(total_pages))
        self._free_slots = deque(range(total_slots))
        self._kv: list[int | None] = [None] * (total_pages * page_size)
        self._slot_state: list[int | None] = [None] * total_slots
        self._host_total = host_snapshot_bytes
        self._host_used = 0
        self._state_bytes = state_bytes
        self._kv_bytes = kv_bytes_per_token
        self._device_snapshots = snapshot_location == "device"
        self._seqs: dict[int, _Seq] = {}
        self._paused: dict[int, _Paused] = {}  # id(ResumeState) -> payload, live states only
        self._next_id = 1
        self._step = 0
        self._pending: tuple[PendingBatch, list[tuple[int, int, int]]] | None = None
        self._in_call = threading.RLock()  # detects calls from two threads at once

    # --- helpers -----------------------------------------------------------------------------
    def _seq(self, seq: SequenceId, *, allow_dead: bool = False) -> _Seq:
        s = self._seqs.get(seq)
        if s is None:
            raise ContractViolation(f"unknown, paused or released sequence {seq}")
        if s.dead and not allow_dead:
            raise ContractViolation(
                f"sequence {seq} accepted 0 tokens (cancelled); only release is legal")
        return s

    def _not_pending(self, seq: SequenceId, what: str) -> None:
        if self._pending is not None and any(r.seq == seq for r in self._pending[0].rows):
            raise ContractViolation(f"{what}({seq}) while its PendingBatch is unconsumed")

    def _pages_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self._limits.page_size)

    def _take_pages(self, n: int) -> list[int]:
        return [self._free_pages.popleft() for _ in range(n)]

    def _free(self, pages: list[int], slot: int | None) -> None:
        ps = self._limits.page_size
        for p in pages:
            self._kv[p * ps:(p + 1) * ps] = [None] * ps  # poison: a stale read is caught
            self._free_pages.append(p)
        pages.clear()
        if slot is not None:
            self._slot_state[slot] = None
            self._free_slots.append(slot)

    def _kv_addr(self, s: _Seq, pos: int) -> int:
        ps = self._limits.page_size
        return s.pages[pos // ps] * ps + pos % ps

    def _unit_tokens(self, frontier: int, ledger_len: int) -> int:
        pending = max(0, ledger_len - 1 - frontier)
        if pending == 0:
            return 1
        chunk = self._limits.prefill_chunk
        return min(pending, chunk - frontier % chunk)

    def _require_units(self, s: _Seq, seq: SequenceId, n_tokens: int) -> None:
        if s.slot is None or len(s.pages) * self._limits.page_size < s.frontier + n_tokens:
            raise ContractViolation(f"sequence {seq} runs {n_tokens} tokens without reserved units")

    # --- contract: static facts ------------------------------------------------------------
    @property
    def limits(self) -> ProgramLimits:
        return self._limits

    @_exclusive
    def capacity(self) -> Capacity:
        lim = self._limits
        return Capacity(len(self._free_pages), lim.total_pages, len(self._free_slots),
                        lim.total_slots, self._host_total - self._host_used, self._host_total)

    # --- contract: sequences ---------------------------------------------------------------
    @_exclusive
    def open_sequence(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> SequenceId:
        ids = [int(t) for t in prompt_ids]
        lim = self._limits
        if not ids:
            raise InvalidInput("the prompt is empty", param="prompt")
        if any(t < 0 or t >= lim.vocab_size for t in ids):
            raise InvalidInput(f"prompt token ids must be in [0, {lim.vocab_size})", param="prompt")
        if len(ids) + 1 > lim.max_context_len:
            raise InvalidInput(f"prompt of {len(ids)} tokens leaves no room for output within "
                               f"max_context_len={lim.max_context_len}", param="prompt")
        if sampling.seed is None:
            raise InvalidInput("sampling.seed must be set", param="seed")
        seq = self._next_id
        self._next_id += 1
        self._seqs[seq] = _Seq(ids, len(ids), sampling)
        return seq

    @_exclusive
    def pending_prefill(self, seq: SequenceId) -> int:
        s = self._seq(seq)
        return max(0, len(s.ledger) - 1 - s.frontier)

    @_exclusive
    def ledger_len(self, seq: SequenceId) -> int:
        return len(self._seq(seq).ledger)

    @_exclusive
    def next_unit_tokens(self, seq: SequenceId) -> int:
        s = self._seq(seq)
        return self._unit_tokens(s.frontier, len(s.ledger))

    @_exclusive
    def pages_needed(self, seq: SequenceId, n_tokens: int) -> int:
        s = self._seq(seq)
        return max(0, self._pages_for(s.frontier + n_tokens) - len(s.pages))

    @_exclusive
    def reserve_units(self, seq: SequenceId, n_tokens: int) -> bool:
        s = self._seq(seq)
        self._not_pending(seq, "reserve_units")
        if n_tokens < 1 or s.frontier + n_tokens > self._limits.max_context_len:
            raise ContractViolation(f"reserve_units({seq}, {n_tokens}) out of range")
        extra = max(0, self._pages_for(s.frontier + n_tokens) - len(s.pages))
        need_slot = s.slot is None
        if extra > len(self._free_pages) or (need_slot and not self._free_slots):
            return False
        if need_slot:  # only a fresh sequence (frontier 0) has no slot
            s.slot = self._free_slots.popleft()
            self._slot_state[s.slot] = _STATE0
        s.pages.extend(self._take_pages(extra))
        return True

    @_exclusive
    def release(self, seq: SequenceId) -> None:
        s = self._seq(seq, allow_dead=True)
        self._not_pending(seq, "release")
        self._free(s.pages, s.slot)
        del self._seqs[seq]

    # --- contract: execution ---------------------------------------------------------------
    @_exclusive
    def run(self, plan: StepPlan) -> PendingBatch:
        if self._pending is not None:
            raise ContractViolation("run() while the previous PendingBatch is unconsumed")
        members = list(plan.decode) + ([plan.prefill.seq] if plan.prefill else [])
        if not members:
            raise ContractViolation("run() with an empty StepPlan")
        if len(set(members)) != len(members) or len(plan.decode) > self._limits.max_batch:
            raise ContractViolation(f"bad StepPlan membership {plan}")
        rows: list[PendingRow] = []
        provisional: list[tuple[int, int, int]] = []  # (new_frontier, new_state, token or -1)
        if plan.prefill is not None:
            rows.append(self._run_prefill(plan.prefill.seq, provisional))
        for seq in plan.decode:
            rows.append(self._run_decode(seq, provisional))
        self._step += 1
        batch = PendingBatch(tuple(rows), self._step)
        self._pending = (batch, provisional)
        return batch

    def _feed(self, s: _Seq, start: int, stop: int) -> int:
        state = self._slot_state[s.slot]
        for pos in range(start, stop):
            self._kv[self._kv_addr(s, pos)] = s.ledger[pos]
            state = _mix(state, s.ledger[pos], pos)
        return state

    def _run_prefill(self, seq: SequenceId, provisional: list) -> PendingRow:
        s = self._seq(seq)
        if max(0, len(s.ledger) - 1 - s.frontier) == 0:
            raise ContractViolation(f"prefill chunk for decode-ready sequence {seq}")
        n = self._unit_tokens(s.frontier, len(s.ledger))
        self._require_units(s, seq, n)
        provisional.append((s.frontier + n, self._feed(s, s.frontier, s.frontier + n), -1))
        return PendingRow(seq, True, (), (), (), prefill_tokens=n)

    def _run_decode(self, seq: SequenceId, provisional: list) -> PendingRow:
        s = self._seq(seq)
        pos = len(s.ledger) - 1
        if s.frontier != pos:
            raise ContractViolation(f"decode for sequence {seq} that still needs prefill")
        if len(s.ledger) >= self._limits.max_context_len:
            raise ContractViolation(f"decode for sequence {seq} would pass max_context_len")
        self._require_units(s, seq, 1)
        state = self._feed(s, pos, pos + 1)
        kv = [self._kv[self._kv_addr(s, p)] for p in range(pos + 1)]
        if kv != s.ledger:
            raise ContractViolation(f"KV of sequence {seq} does not match its ledger")
        digest = _mix(*kv)
        out_index = len(s.ledger) - s.prompt_len
        if s.sampling.greedy:
            h = _mix(state, digest)
        else:
            h = _mix(state, digest, s.sampling.seed, out_index)
        token = h % self._limits.vocab_size
        logprob = -((h >> 20) % 5000) / 1000.0 - 1e-3
        top = tuple(TopLogprob((token + i) % self._limits.vocab_size, logprob - 0.5 * i)
                    for i in range(s.sampling.top_logprobs))
        provisional.append((pos + 1, state, token))
        return PendingRow(seq, False, (token,), (logprob,), (top,))

    def _consume(self, batch: PendingBatch) -> list[tuple[int, int, int]]:
        if batch.consumed:
            raise ContractViolation(f"PendingBatch {batch.step_id} consumed twice")
        if self._pending is None or self._pending[0] is not batch:
            raise ContractViolation(f"PendingBatch {batch.step_id} is not the pending batch")
        batch.consumed = True
        provisional = self._pending[1]
        self._pending = None
        return provisional

    @_exclusive
    def commit(self, batch: PendingBatch, decisions: Sequence[RowDecision]) -> None:
        if len(decisions) != len(batch.rows):
            raise ContractViolation(f"{len(decisions)} decisions for {len(batch.rows)} rows")
        for row, d in zip(batch.rows, decisions):
            bad = d.accepted != 0 if row.is_prefill else not 0 <= d.accepted <= row.produced
            if bad:
                raise ContractViolation(f"row {row.seq}: accepted {d.accepted} of {row.produced}")
        provisional = self._consume(batch)
        for row, d, (frontier, state, token) in zip(batch.rows, decisions, provisional):
            s = self._seqs[row.seq]
            if not row.is_prefill and d.accepted == 0:
                s.dead = True
                continue
            s.frontier = frontier
            self._slot_state[s.slot] = state
            if not row.is_prefill:
                s.ledger.append(token)
                if len(s.ledger) > self._limits.max_context_len:
                    raise ContractViolation(f"sequence {row.seq} ledger exceeds max_context_len")

    @_exclusive
    def abort_pending(self, batch: PendingBatch) -> None:
        self._consume(batch)
        for row in batch.rows:  # state was (notionally) written in place: replay from zero
            s = self._seqs[row.seq]
            s.frontier = 0
            self._slot_state[s.slot] = _STATE0

    # --- contract: pause / resume ----------------------------------------------------------
    def _state(self, state: ResumeState) -> _Paused:
        p = self._paused.get(id(state))
        if p is None:
            raise ContractViolation("ResumeState already resumed, revoked or discarded")
        return p

    def _make_state(self, kind: ResumeKind, p: _Paused, host_bytes: int) -> ResumeState:
        self._host_used += host_bytes
        p.host_bytes = host_bytes
        state = ResumeState(kind, len(p.ledger), host_bytes, p, device_pages=len(p.pages))
        self._paused[id(state)] = p
        return state

    def _drop_state(self, state: ResumeState) -> _Paused:
        p = self._paused.pop(id(state))
        self._host_used -= state.host_bytes
        return p

    @_exclusive
    def pause(self, seq: SequenceId, prefer: ResumeKind) -> ResumeState:
        s = self._seq(seq)
        self._not_pending(seq, "pause")
        target = s.frontier + self._unit_tokens(s.frontier, len(s.ledger))
        p = _Paused(list(s.ledger), s.prompt_len, s.sampling, target)
        kv_bytes = 0 if self._device_snapshots else self._kv_bytes * s.frontier
        snapshot_bytes = self._state_bytes + kv_bytes
        if prefer is ResumeKind.SNAPSHOT and snapshot_bytes <= self._host_total - self._host_used:
            p.frontier, p.state = s.frontier, self._slot_state[s.slot]
            if self._device_snapshots:
                keep = self._pages_for(s.frontier)
                p.pages, s.pages = s.pages[:keep], s.pages[keep:]
            else:
                p.kv = [self._kv[self._kv_addr(s, pos)] for pos in range(s.frontier)]
            state = self._make_state(ResumeKind.SNAPSHOT, p, snapshot_bytes)
        else:
            state = self._make_state(ResumeKind.REPLAY, p, 0)
        self._free(s.pages, s.slot)
        del self._seqs[seq]
        return state

    @_exclusive
    def revoke_snapshot(self, state: ResumeState) -> ResumeState:
        self._state(state)
        if state.kind is not ResumeKind.SNAPSHOT:
            raise ContractViolation("revoke_snapshot of a Replay state")
        p = self._drop_state(state)
        self._free(p.pages, None)
        replay = _Paused(p.ledger, p.prompt_len, p.sampling, p.target)
        return self._make_state(ResumeKind.REPLAY, replay, 0)

    @_exclusive
    def resume(self, state: ResumeState) -> SequenceId | None:
        p = self._state(state)
        extra = self._pages_for(p.target) - len(p.pages)
        if extra > len(self._free_pages) or not self._free_slots:
            return None
        self._drop_state(state)
        s = _Seq(p.ledger, p.prompt_len, p.sampling, slot=self._free_slots.popleft())
        s.pages = p.pages + self._take_pages(extra)
        if state.kind is ResumeKind.SNAPSHOT:
            s.frontier = p.frontier
            self._slot_state[s.slot] = p.state
            for pos, tok in enumerate(p.kv):
                self._kv[self._kv_addr(s, pos)] = tok
        else:
            self._slot_state[s.slot] = _STATE0
        seq = self._next_id
        self._next_id += 1
        self._seqs[seq] = s
        return seq

    @_exclusive
    def discard_resume_state(self, state: ResumeState) -> None:
        self._state(state)
        p = self._drop_state(state)
        self._free(p.pages, None)

    # --- test introspection ------------------------------------------------------------------
    @_exclusive
    def live_sequences(self) -> int:
        """Sequences not yet released (open, resident) plus live ResumeStates."""
        return len(self._seqs) + len(self._paused)

    @_exclusive
    def check_integrity(self) -> None:
        """Raise ContractViolation unless every page, slot and host byte is accounted for once."""
        held = [p for s in self._seqs.values() for p in s.pages]
        held += [p for st in self._paused.values() for p in st.pages]
        pages = held + list(self._free_pages)
        if sorted(pages) != list(range(self._limits.total_pages)):
            raise ContractViolation("KV pages leaked or double-owned")
        slots = [s.slot for s in self._seqs.values() if s.slot is not None] + list(self._free_slots)
        if sorted(slots) != list(range(self._limits.total_slots)):
            raise ContractViolation("StateImage slots leaked or double-owned")
        if sum(st.host_bytes for st in self._paused.values()) != self._host_used:
            raise ContractViolation("host snapshot bytes leaked")
