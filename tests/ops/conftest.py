"""Fixtures for the op tests: a freshly seeded RNG per test (the seed is printed on failure;
NINFER_TEST_SEED=N reruns with seed N)."""
from __future__ import annotations

import os
import secrets

import numpy as np
import pytest


@pytest.fixture
def rng() -> np.random.Generator:
    seed = int(os.environ.get("NINFER_TEST_SEED", secrets.randbits(32)))
    print(f"rng seed: {seed}")
    return np.random.default_rng(seed)
