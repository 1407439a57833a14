"""Shared helpers for the runtime tests: request specs, a probe Program wrapper, a manual
driver for `Engine(start_worker=False)`, and event-stream invariant checks."""
from __future__ import annotations

import dataclasses
import random
import threading
import time

from ninfer.runtime import (
    Engine, GenerationFailed, GenerationFinished, GenerationHandle, GenerationRequest,
    GenerationResult, GenerationStart, OutputEvent,
)
from ninfer.runtime.contract import SamplingParams
from ninfer.runtime.contract.output import TokenOutputSession


@dataclasses.dataclass(frozen=True)
class Spec:
    """A request description that can be built many times (each build gets a fresh session)."""

    prompt: tuple[int, ...]
    max_tokens: int
    seed: int | None = None  # None: greedy
    stop_ids: tuple[int, ...] = ()
    timeout_s: float | None = None
    queue_timeout_s: float | None = None

    def build(self) -> GenerationRequest:
        sampling = (SamplingParams(temperature=0.0) if self.seed is None
                    else SamplingParams(temperature=0.8, top_p=0.9, seed=self.seed))
        return GenerationRequest(self.prompt, sampling, self.max_tokens,
                                 TokenOutputSession(self.stop_ids), self.timeout_s,
                                 self.queue_timeout_s)


def random_specs(rng: random.Random, n: int, vocab: int, *, seeded: bool = False,
                 prompt_len=(1, 20), max_tokens=(4, 24), stop_ids=()) -> list[Spec]:
    specs = []
    for _ in range(n):
        prompt = tuple(rng.randrange(vocab) for _ in range(rng.randint(*prompt_len)))
        seed = rng.randrange(2**32) if seeded else None
        specs.append(Spec(prompt, rng.randint(*max_tokens), seed, tuple(stop_ids)))
    return specs


class FakeClock:
    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ProbeProgram:
    """Wraps any Program: records plans, can call a hook, sleep or raise in `run`, and can
    advertise different `limits` than the Program really has."""

    def __init__(self, inner, *, on_run=None, run_delay_s: float = 0.0,
                 fail_at_run: int | None = None, limits=None):
        self.inner = inner
        self._limits = limits  # None: the inner Program's
        self.on_run = on_run
        self.run_delay_s = run_delay_s
        self.fail_at_run = fail_at_run
        self.plans = []

    @property
    def limits(self):
        return self._limits or self.inner.limits

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run(self, plan):
        self.plans.append(plan)
        if self.on_run is not None:
            self.on_run(plan)
        if self.fail_at_run is not None and len(self.plans) >= self.fail_at_run:
            raise RuntimeError("injected Program failure")
        if self.run_delay_s:
            time.sleep(self.run_delay_s)
        return self.inner.run(plan)


def drive(engine: Engine, handles, *, max_cycles: int = 20000) -> None:
    """Step a manual engine until every handle is done (fails if it stalls)."""
    for _ in range(max_cycles):
        if all(h.done for h in handles):
            return
        if not engine.step() and not all(h.done for h in handles):
            raise AssertionError("engine idle while requests are unfinished")
    raise AssertionError("requests did not finish")


def check_stream(events) -> GenerationFinished | GenerationFailed:
    """Assert the per-request event invariants; return the terminal event."""
    terminals = [e for e in events if isinstance(e, (GenerationFinished, GenerationFailed))]
    assert len(terminals) == 1 and events[-1] is terminals[0], events
    starts = [i for i, e in enumerate(events) if isinstance(e, GenerationStart)]
    outputs = [e for e in events if isinstance(e, OutputEvent)]
    assert len(starts) <= 1 and (not starts or starts[0] == 0), events
    if outputs:
        assert starts, "output before GenerationStart"
    term = terminals[0]
    result = term.result if isinstance(term, GenerationFinished) else term.error.partial
    if result is not None:
        assert starts, "a result without GenerationStart"
        deltas = [t for e in outputs for t in e.delta]
        assert tuple(deltas) == result.token_ids, "deltas duplicated or missing"
        assert tuple(t for e in outputs for t in e.token_ids) == result.token_ids
        assert len(result.logprobs) == len(result.token_ids) == result.completion_tokens
        assert all(lp <= 0.0 for lp in result.logprobs)
    else:
        assert not outputs
    return term


def collect(handle: GenerationHandle, timeout: float = 30.0):
    """Iterate a threaded handle to its end; return (events, terminal)."""
    events = []
    deadline = time.monotonic() + timeout
    finished = threading.Event()

    def watchdog():
        if not finished.wait(max(0.0, deadline - time.monotonic())):
            handle.cancel()

    threading.Thread(target=watchdog, daemon=True).start()
    for event in handle:
        events.append(event)
    finished.set()
    return events, check_stream(events)


def run_alone(program_factory, spec: Spec, **budget) -> GenerationResult:
    """The request's result on a fresh, otherwise idle engine."""
    engine = Engine(program_factory(**budget), max_concurrency=1, start_worker=False)
    handle = engine.submit(spec.build())
    drive(engine, [handle])
    term = check_stream(handle.poll())
    assert isinstance(term, GenerationFinished), term
    engine.shutdown()
    return term.result
