"""The FakeProgram implements the Program contract exactly and rejects every misuse."""
from __future__ import annotations

import random
import threading

import pytest

from ninfer.errors import InvalidInput
from ninfer.runtime.contract import (
    PrefillChunk, ResumeKind, RowDecision, SamplingParams, StepPlan,
)
from ninfer.testing.fake_program import ContractViolation, FakeProgram

GREEDY = SamplingParams(temperature=0.0, seed=1)


def _prompt(rng, n):
    return [rng.randrange(64) for _ in range(n)]


def _advance(p: FakeProgram, seq: int) -> int | None:
    """Run one unit of `seq` alone; return the decoded token (None for a chunk)."""
    n = p.next_unit_tokens(seq)
    assert p.reserve_units(seq, n)
    if p.pending_prefill(seq):
        batch = p.run(StepPlan(prefill=PrefillChunk(seq)))
        p.commit(batch, [RowDecision(0)])
        return None
    batch = p.run(StepPlan(decode=(seq,)))
    p.commit(batch, [RowDecision(1)])
    return batch.rows[0].token_ids[0]


def _generate(p: FakeProgram, seq: int, n_tokens: int) -> list[int]:
    out = []
    while len(out) < n_tokens:
        tok = _advance(p, seq)
        if tok is not None:
            out.append(tok)
    return out


def test_chunks_end_at_absolute_boundaries():
    p = FakeProgram(prefill_chunk=8)
    seq = p.open_sequence(list(range(1, 21)), GREEDY)
    sizes = []
    while p.pending_prefill(seq):
        sizes.append(p.next_unit_tokens(seq))
        _advance(p, seq)
    assert sizes == [8, 8, 3] and p.next_unit_tokens(seq) == 1


@pytest.mark.parametrize("kind", [ResumeKind.SNAPSHOT, ResumeKind.REPLAY])
@pytest.mark.parametrize("where", ["host", "device"])
def test_tokens_survive_pause_resume(kind, where):
    rng = random.Random(3)
    prompt = _prompt(rng, 13)
    sampling = SamplingParams(temperature=0.7, seed=rng.randrange(2**32))
    ref_p = FakeProgram(snapshot_location=where)
    ref = _generate(ref_p, ref_p.open_sequence(prompt, sampling), 12)
    p = FakeProgram(snapshot_location=where)
    seq = p.open_sequence(prompt, sampling)
    first = _generate(p, seq, 5)
    state = p.pause(seq, kind)
    assert state.kind is kind and state.ledger_len == 13 + 5
    with pytest.raises(ContractViolation):
        p.pending_prefill(seq)  # the old id is dead after pause
    seq2 = p.resume(state)
    if kind is ResumeKind.REPLAY:
        assert p.pending_prefill(seq2) == 13 + 5 - 1
    assert first + _generate(p, seq2, 7) == ref
    p.release(seq2)
    p.check_integrity()
    assert p.capacity().free_pages == p.limits.total_pages and p.live_sequences() == 0


def test_abort_forces_replay_with_same_tokens():
    rng = random.Random(4)
    prompt = _prompt(rng, 9)
    ref_p = FakeProgram()
    ref = _generate(ref_p, ref_p.open_sequence(prompt, GREEDY), 6)
    p = FakeProgram()
    seq = p.open_sequence(prompt, GREEDY)
    out = _generate(p, seq, 3)
    assert p.reserve_units(seq, 1)
    p.abort_pending(p.run(StepPlan(decode=(seq,))))
    assert p.pending_prefill(seq) == len(prompt) + 3 - 1
    assert out + _generate(p, seq, 3) == ref


def test_misuse_raises():
    p = FakeProgram(total_pages=4, page_size=4)
    with pytest.raises(InvalidInput):
        p.open_sequence([], GREEDY)
    with pytest.raises(InvalidInput):
        p.open_sequence([64], GREEDY)
    with pytest.raises(InvalidInput):
        p.open_sequence([1, 2], SamplingParams())  # no seed
    seq = p.open_sequence([1, 2, 3], GREEDY)
    with pytest.raises(ContractViolation):  # no reserved units
        p.run(StepPlan(prefill=PrefillChunk(seq)))
    with pytest.raises(ContractViolation):
        p.run(StepPlan())
    assert p.reserve_units(seq, p.next_unit_tokens(seq))
    with pytest.raises(ContractViolation):  # still needs prefill
        p.run(StepPlan(decode=(seq,)))
    batch = p.run(StepPlan(prefill=PrefillChunk(seq)))
    with pytest.raises(ContractViolation):  # previous batch unconsumed
        p.run(StepPlan(prefill=PrefillChunk(seq)))
    with pytest.raises(ContractViolation):
        p.pause(seq, ResumeKind.REPLAY)
    with pytest.raises(ContractViolation):
        p.commit(batch, [RowDecision(1)])  # a prefill row accepts 0
    p.commit(batch, [RowDecision(0)])
    with pytest.raises(ContractViolation):
        p.commit(batch, [RowDecision(0)])  # double consumption
    assert p.reserve_units(seq, 1)
    batch = p.run(StepPlan(decode=(seq,)))
    with pytest.raises(ContractViolation):
        p.commit(batch, [RowDecision(2)])  # accepted > produced
    p.commit(batch, [RowDecision(0)])  # a cancelled row
    with pytest.raises(ContractViolation):
        p.reserve_units(seq, 1)  # cancelled rows may only be released
    p.release(seq)
    assert not p.reserve_units(p.open_sequence([1] * 17, GREEDY), 17)  # 5 pages > 4: no change
    assert p.capacity().free_pages == 4


def test_ledger_past_context_limit_raises():
    p = FakeProgram(max_context_len=4)
    seq = p.open_sequence([1, 2, 3], GREEDY)
    _generate(p, seq, 1)
    assert p.reserve_units(seq, 1)
    with pytest.raises(ContractViolation):
        p.run(StepPlan(decode=(seq,)))


def test_concurrent_calls_are_detected():
    p = FakeProgram()
    inside = threading.Event()
    leave = threading.Event()
    original = p._unit_tokens

    def slow(*args):
        inside.set()
        leave.wait(5)
        return original(*args)

    p._unit_tokens = slow
    seq = p.open_sequence([1, 2, 3], GREEDY)
    t = threading.Thread(target=p.next_unit_tokens, args=(seq,))
    t.start()
    inside.wait(5)
    with pytest.raises(ContractViolation):
        p.capacity()
    leave.set()
    t.join()
