"""Fixtures for the CUDA kernel tests: a freshly seeded RNG per test (seed printed on failure)."""
from __future__ import annotations

import secrets

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    seed = secrets.randbits(32)
    print(f"rng seed: {seed}")
    return np.random.default_rng(seed)
