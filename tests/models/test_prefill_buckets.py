"""Prefill graph buckets of the CUDA backend (pure host logic; no GPU needed)."""
from __future__ import annotations

import pytest

from ninfer.models.qwen3_5.cuda_backend import PREFILL_MIN_BUCKET, prefill_buckets


@pytest.mark.parametrize("chunk, want", [
    (1024, (1024, 512, 256, 128, 64, 32, 16)),
    (32, (32, 16)),
    (100, (100, 50, 25)),
    (31, (31,)),
    (8, (8,)),
])
def test_prefill_buckets(chunk, want):
    assert prefill_buckets(chunk) == want


@pytest.mark.parametrize("chunk", [16, 17, 100, 1000, 1024, 4096])
def test_every_chunk_length_has_a_bucket_less_than_twice_its_size(chunk):
    buckets = prefill_buckets(chunk)
    assert buckets[0] == chunk and min(buckets) >= min(chunk, PREFILL_MIN_BUCKET)
    for n in range(1, chunk + 1):
        fit = min(b for b in buckets if b >= n)  # the smallest bucket that holds n rows
        assert fit < 2 * n or fit == min(buckets), (chunk, n, fit)
