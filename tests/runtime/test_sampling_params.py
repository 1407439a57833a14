"""SamplingParams rejects every value the samplers cannot represent (float32 / int32), so a
request can never carry a value that would fail inside a step and take the engine down."""
from __future__ import annotations

import math

import pytest

from ninfer.errors import InvalidInput
from ninfer.runtime.contract import SamplingParams


@pytest.mark.parametrize("field, value", [
    ("top_p", 1e-300), ("top_p", 0.0), ("top_p", 1.5), ("top_p", math.nan),
    ("repetition_penalty", 1e-300), ("repetition_penalty", 1e300), ("repetition_penalty", 0.0),
    ("top_k", 2**31), ("top_k", -1), ("temperature", math.nan), ("temperature", 1e300),
    ("temperature", -0.5), ("min_p", 1.5), ("presence_penalty", 2.5),
    ("frequency_penalty", -3.0), ("top_logprobs", 21), ("seed", -1), ("seed", 2**64),
])
def test_unrepresentable_values_are_rejected_with_the_field_named(field, value):
    with pytest.raises(InvalidInput) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field


def test_edge_values_that_the_samplers_represent_are_accepted():
    p = SamplingParams(temperature=0.0, top_p=1e-6, top_k=2**31 - 1, repetition_penalty=100.0,
                       seed=2**64 - 1, top_logprobs=20)
    assert p.greedy and p.with_seed() is p
    assert SamplingParams().with_seed().seed is not None
