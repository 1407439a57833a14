"""Property test: random submit/cancel/abandon/consume/step/clock sequences against a small
KV budget; the engine's invariants hold after every operation, and every request ends exactly
once with tokens identical to (a prefix of) its unpressured run."""
from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ninfer.runtime import Engine, GenerationFailed, GenerationFinished, GenerationStart
from ninfer.runtime.errors import Overloaded

from .conftest import make_fake_program
from .helpers import FakeClock, Spec, check_stream, drive, run_alone

_submit = st.tuples(st.just("submit"), st.integers(1, 20), st.integers(1, 30),
                    st.one_of(st.none(), st.integers(0, 2**32)), st.sampled_from([None, 5.0]),
                    st.sampled_from([(), (7,)]), st.randoms(use_true_random=False))
_target = st.tuples(st.sampled_from(["cancel", "abandon", "consume"]), st.integers(0, 40))
_step = st.tuples(st.just("step"), st.integers(1, 6))
_advance = st.tuples(st.just("advance"), st.sampled_from([1.0, 3.0]))
_ops = st.lists(st.one_of(_submit, _target, _step, _step, _advance), min_size=5, max_size=40)


class _Driver:
    def __init__(self, program, max_concurrency: int):
        self.program = program
        self.clock = FakeClock()
        self.engine = Engine(program, max_concurrency=max_concurrency, max_queue=3,
                             start_worker=False, clock=self.clock)
        self.handles = []  # [handle, spec, events, released, refused]

    def apply(self, op) -> None:
        kind = op[0]
        if kind == "submit":
            _, plen, max_tokens, seed, timeout, stop, rnd = op
            spec = Spec(tuple(rnd.randrange(64) for _ in range(plen)), max_tokens, seed, stop,
                        timeout_s=timeout)
            h = self.engine.submit(spec.build())
            refused = h.done
            events = h.poll() if refused else []
            if refused:
                assert isinstance(events[-1].error, Overloaded)
            self.handles.append([h, spec, events, refused, refused])
        elif kind == "step":
            for _ in range(op[1]):
                self.engine.step()
        elif kind == "advance":
            self.clock.advance(op[1])
        elif self.handles:
            entry = self.handles[op[1] % len(self.handles)]
            if kind == "cancel":
                entry[0].cancel()
            elif kind == "abandon":
                entry[0].abandon()
                entry[3] = True
            else:
                self._consume(entry)

    def _consume(self, entry) -> None:
        entry[2].extend(entry[0].poll())
        if entry[2] and isinstance(entry[2][-1], (GenerationFinished, GenerationFailed)):
            entry[3] = True

    def check(self) -> None:
        core = self.engine._core
        sched = core.scheduler
        self.program.check_integrity()  # no leaked or double-owned pages, slots, host bytes
        live = list(sched.live())
        assert self.program.live_sequences() == len(live)
        assert len(sched.residents) <= self.engine.max_concurrency
        assert sched.protected is None or sched.protected in sched.residents
        expected = sum(1 for h, _, _, released, refused in self.handles
                       if not refused and not (h.done and released))
        assert self.engine.outstanding == expected
        for entry in self.handles:
            events = entry[2]
            starts = [i for i, e in enumerate(events) if isinstance(e, GenerationStart)]
            assert len(starts) <= 1 and (not starts or starts[0] == 0)
            ends = [i for i, e in enumerate(events)
                    if isinstance(e, (GenerationFinished, GenerationFailed))]
            assert len(ends) <= 1 and (not ends or ends[0] == len(events) - 1)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.lists(_submit, min_size=2, max_size=6), ops=_ops,
       max_concurrency=st.integers(1, 4), kv_tokens=st.sampled_from([40, 56, 96]))
def test_random_operations_keep_invariants(first, ops, max_concurrency, kv_tokens):
    budget = dict(kv_tokens=kv_tokens, snapshots=1.0)
    program = make_fake_program(**budget)
    initial_free = program.capacity()
    d = _Driver(program, max_concurrency)
    for op in first + ops:
        d.apply(op)
        d.check()
    drive(d.engine, [e[0] for e in d.handles])
    for entry in d.handles:
        d._consume(entry)  # abandoned handles still hold their events
        entry[3] = True
    d.check()
    assert d.engine.outstanding == 0
    assert program.live_sequences() == 0 and program.capacity() == initial_free
    snap = d.engine.metrics_snapshot()
    event(f"pauses={min(3, sum(snap['pauses'].values()))}")
    event(f"handles={min(8, len(d.handles))}")
    for h, spec, events, _, refused in d.handles:
        term = check_stream(events)  # every handle ended exactly once
        if refused:
            continue
        result = term.result if isinstance(term, GenerationFinished) else term.error.partial
        if result is None:
            continue
        ref = run_alone(make_fake_program, spec, **budget)
        assert ref.token_ids[:result.completion_tokens] == result.token_ids
        if isinstance(term, GenerationFinished) and result.finish_reason != "cancelled":
            assert result.token_ids == ref.token_ids
