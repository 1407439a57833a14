"""The forward's prefetch hints: every linear of a step names the linear that really runs next
(ops.linear.NextLinear), in the order the step runs them, for dense and MoE models."""
from __future__ import annotations

import pytest

from ninfer import ops
from ninfer.runtime.contract import SamplingParams
from tests.models.qwen35_cases import build_case, generate, open_program, prompts


@pytest.mark.parametrize("name", ["tiny-dense", "tiny-moe"])
def test_next_linear_hints_follow_the_step(tmp_path, monkeypatch, name):
    case = build_case(tmp_path, name)
    program = open_program(case)
    calls = []  # (weight, hint) per linear / linear_swiglu launch, in order

    def recorder(real):
        def run(x, weight, out, **kw):
            calls.append((weight, kw.get("next_linear")))
            return real(x, weight, out, **kw)
        return run

    monkeypatch.setattr(ops, "linear", recorder(ops.linear))
    monkeypatch.setattr(ops, "linear_swiglu", recorder(ops.linear_swiglu))
    generate(program, prompts(case.vocab_size, [5]), 3, SamplingParams(temperature=0.0, seed=1))
    params = program.backend.params
    first = calls[0][0]  # a step starts with the first layer's input projection
    per_step = []
    for weight, hint in calls:
        if weight is first:
            per_step.append([])
        per_step[-1].append((weight, hint))
    assert len(per_step) >= 3
    for step in per_step:
        for (_, hint), (nxt, _) in zip(step, step[1:]):
            assert hint is not None and hint.weight is nxt and not hint.swiglu
        last, hint = step[-1]
        # a step ends with lm_head (no hint), or before it when no row needs logits
        assert (last is params.lm_head and hint is None) or hint.weight is params.lm_head
