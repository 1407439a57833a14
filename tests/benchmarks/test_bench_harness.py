"""The benchmark's timing helpers and byte counts that run without a GPU."""
from __future__ import annotations

import math

import pytest

from bench import harness
from bench.kernel_cases import paged_attention_bytes


def test_graph_reps():
    assert harness.graph_reps(0.1) == 20  # 2 ms target / 0.1 ms
    assert harness.graph_reps(0.0131) == math.ceil(2.0 / 0.0131)
    assert harness.graph_reps(10.0) == harness.GRAPH_MIN_REPS
    assert harness.graph_reps(1e-6) == harness.GRAPH_MAX_REPS
    for bad in (None, 0.0, -1.0, float("nan"), float("inf")):
        assert harness.graph_reps(bad) == harness.GRAPH_MAX_REPS
    assert harness.graph_reps(0.5, target_ms=5.0, lo=1, hi=4) == 4


def test_per_call_ms():
    assert harness.per_call_ms([4.0, 2.0, 3.0], 10) == pytest.approx(0.3)
    assert math.isnan(harness.per_call_ms([], 4))
    with pytest.raises(ValueError):
        harness.per_call_ms([1.0], 0)


def test_paged_attention_bytes():
    # 9B: 16 query heads, 4 KV heads, head_dim 256, bf16 pages; B=1 ctx 8192: 32 MiB of K+V
    kv = 8192 * 4 * 256 * 2 * 2
    assert paged_attention_bytes([8192], 16, 4, 256, 2) == kv + 2 * 16 * 256 * 4
    assert paged_attention_bytes([8192] * 8, 16, 4, 256, 2) == 8 * kv + 8 * 2 * 16 * 256 * 4
    assert paged_attention_bytes([3, 5], 2, 1, 32, 4) == 8 * 32 * 4 * 2 + 2 * 2 * 2 * 32 * 4


def test_measure_roofline():
    m = harness.Measure("op", "v", 0.01, bytes=32e6).finish(harness.Ceilings(copy_gbps=4000))
    assert m.gbps == pytest.approx(3200)
    assert m.roofline == pytest.approx(0.8)


def test_bulk_copy_rate_configs_fit_the_kernel():
    """Every bench.bulk_copy_rate configuration launches: its ring fits a block's shared memory
    (227 KiB), each slot has one consumer (slots a multiple of the 4 consumer warps), one
    producer lane per copy, 16-byte aligned copies and pitches."""
    from bench.bulk_copy_rate import CONFIGS

    for c in CONFIGS:
        assert 256 + c.stages * c.copies * c.pitch <= 227 * 1024, c
        assert c.stages % 4 == 0 and 1 <= c.copies <= 32, c
        assert c.copy % 16 == 0 and c.pitch % 16 == 0 and c.pitch >= c.copy, c
        assert c.label()
