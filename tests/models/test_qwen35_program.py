"""The Qwen3.5 CPU Program's contract: input checks, pause/resume (Snapshot and Replay),
abort, resource accounting, misuse detection. Pause/replay must not change a single token."""
from __future__ import annotations

import pytest

from ninfer.errors import InvalidInput
from ninfer.models.qwen3_5.program import ProgramMisuse
from ninfer.models.qwen3_5.startup import ProgramOptions
from ninfer.models.registry import load_model_instance
from ninfer.runtime.contract import (
    PrefillChunk, ResumeKind, RowDecision, SamplingParams, StepPlan,
)
from tests.models.qwen35_cases import build_case, generate, open_program, prompts

SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, seed=99)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    return build_case(tmp_path_factory.mktemp("prog"), "tiny-moe")


@pytest.fixture()
def program(case):
    return open_program(case, prefill_chunk=8)


def step(program, seq):
    """One unit of `seq` alone; returns the sampled token or None for a prefill chunk."""
    assert program.reserve_units(seq, program.next_unit_tokens(seq))
    if program.pending_prefill(seq):
        batch = program.run(StepPlan(prefill=PrefillChunk(seq)))
        program.commit(batch, [RowDecision(0)])
        return None
    batch = program.run(StepPlan(decode=(seq,)))
    program.commit(batch, [RowDecision(1)])
    return batch.rows[0].token_ids[0]


def run_with_pause(program, prompt, total, pause_after_units, kind):
    seq = program.open_sequence(prompt, SAMPLED)
    tokens, units = [], 0
    while len(tokens) < total:
        if units == pause_after_units:
            state = program.pause(seq, kind)
            free = program.capacity()
            assert free.free_slots == free.total_slots and free.free_pages == free.total_pages
            seq = program.resume(state)
            assert seq is not None
        tok = step(program, seq)
        units += 1
        if tok is not None:
            tokens.append(tok)
    program.release(seq)
    return tokens, state


@pytest.mark.parametrize("kind", [ResumeKind.SNAPSHOT, ResumeKind.REPLAY])
@pytest.mark.parametrize("pause_after_units", [2, 9])  # mid-prefill (chunk 8, prompt 21), mid-decode
def test_pause_resume_gives_identical_tokens(program, case, kind, pause_after_units):
    (prompt,) = prompts(case.vocab_size, [21], seed=1)
    (ref,) = generate(program, [prompt], 12, sampling=SAMPLED)
    tokens, state = run_with_pause(program, prompt, 12, pause_after_units, kind)
    assert state.kind is kind
    assert tokens == ref.tokens


def test_snapshot_beyond_budget_falls_back_to_replay_and_revoke(case):
    program = open_program(case, prefill_chunk=8, host_snapshot_mib=0)
    (prompt,) = prompts(case.vocab_size, [10], seed=2)
    seq = program.open_sequence(prompt, SAMPLED)
    step(program, seq)
    assert program.pause(seq, ResumeKind.SNAPSHOT).kind is ResumeKind.REPLAY
    roomy = open_program(case, prefill_chunk=8)
    seq = roomy.open_sequence(prompt, SAMPLED)
    step(roomy, seq)
    snap = roomy.pause(seq, ResumeKind.SNAPSHOT)
    assert snap.kind is ResumeKind.SNAPSHOT and snap.host_bytes > 0
    assert roomy.capacity().host_snapshot_bytes_free < roomy.capacity().host_snapshot_bytes_total
    replay = roomy.revoke_snapshot(snap)
    assert replay.kind is ResumeKind.REPLAY
    assert roomy.capacity().host_snapshot_bytes_free == roomy.capacity().host_snapshot_bytes_total
    assert roomy.resume(replay) is not None


def test_abort_pending_replays_to_identical_tokens(program, case):
    (prompt,) = prompts(case.vocab_size, [12], seed=3)
    (ref,) = generate(program, [prompt], 8, sampling=SAMPLED)
    seq = program.open_sequence(prompt, SAMPLED)
    tokens = []
    aborted = False
    while len(tokens) < 8:
        if len(tokens) == 4 and not aborted:
            assert program.reserve_units(seq, 1)
            program.abort_pending(program.run(StepPlan(decode=(seq,))))
            aborted = True
            assert program.pending_prefill(seq) > 0  # must Replay its history
            continue
        tok = step(program, seq)
        if tok is not None:
            tokens.append(tok)
    assert tokens == ref.tokens


def test_resources_return_after_release_and_cancel(program, case):
    before = program.capacity()
    plist = prompts(case.vocab_size, [5, 30], seed=4)
    seqs = [program.open_sequence(p, SAMPLED) for p in plist]
    for s in seqs:
        step(program, s)
    assert program.capacity().free_pages < before.free_pages
    assert program.reserve_units(seqs[0], 1)
    batch = program.run(StepPlan(decode=(seqs[0],)))
    program.commit(batch, [RowDecision(0)])  # cancelled row
    with pytest.raises(ProgramMisuse):
        program.reserve_units(seqs[0], 1)
    for s in seqs:
        program.release(s)
    assert program.capacity() == before


def test_contract_misuse_is_detected(program, case):
    (prompt,) = prompts(case.vocab_size, [3], seed=5)
    seq = program.open_sequence(prompt, SAMPLED)
    with pytest.raises(ProgramMisuse):
        program.run(StepPlan(prefill=PrefillChunk(seq)))  # no reserved units
    assert program.reserve_units(seq, program.next_unit_tokens(seq))
    batch = program.run(StepPlan(prefill=PrefillChunk(seq)))
    with pytest.raises(ProgramMisuse):
        program.run(StepPlan(prefill=PrefillChunk(seq)))  # previous batch not consumed
    with pytest.raises(ProgramMisuse):
        program.commit(batch, [RowDecision(1)])  # prefill rows accept 0
    program.commit(batch, [RowDecision(0)])
    with pytest.raises(ProgramMisuse):
        program.commit(batch, [RowDecision(0)])  # consumed twice


@pytest.mark.parametrize("ids, why", [([], "empty"), ([5, 512, 3], "outside the vocabulary"),
                                      ([-1], "outside the vocabulary"),
                                      (list(range(1, 400)) * 2, "context limit")])
def test_bad_prompts_are_rejected(program, ids, why):
    with pytest.raises(InvalidInput, match=why):
        program.open_sequence(ids, SAMPLED)


def test_unknown_device_is_rejected(case):
    with pytest.raises(InvalidInput, match="device"):
        load_model_instance(case.artifact, ProgramOptions(device="tpu"))
