"""Shared pytest setup: the `gpu` marker skips unless CuPy sees a CUDA device."""
from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    try:
        import cupy  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CuPy")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
