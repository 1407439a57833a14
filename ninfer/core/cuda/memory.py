"""Device memory snapshots and pinned host buffers.

`MemorySnapshot` records what `cudaMemGetInfo` and CuPy's pool report at one moment. Graph
calibration takes three (before capture, after capture, after destroying the graphs) and reports
signed differences: they include lazy module loading and driver caches, so they are not an exact
attribution of graph allocations (see `GraphMemoryReport`).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ninfer.core.cuda._check import check


@dataclasses.dataclass(frozen=True, slots=True)
class MemorySnapshot:
    label: str
    free_bytes: int
    total_bytes: int
    pool_used_bytes: int
    pool_held_bytes: int

    @property
    def used_bytes(self) -> int:
        """Device memory in use by anyone (total - free)."""
        return self.total_bytes - self.free_bytes


def snapshot(label: str = "") -> MemorySnapshot:
    """Synchronize the current device and read its memory state."""
    import cupy
    from cuda.bindings import runtime

    cupy.cuda.Device().synchronize()
    free, total = check(runtime.cudaMemGetInfo(), "cudaMemGetInfo")
    pool = cupy.get_default_memory_pool()
    return MemorySnapshot(label, int(free), int(total), int(pool.used_bytes()),
                          int(pool.total_bytes()))


@dataclasses.dataclass(frozen=True, slots=True)
class GraphMemoryReport:
    """Signed device-memory deltas of a graph calibration (bytes; positive = more used)."""

    before: MemorySnapshot
    after_capture: MemorySnapshot
    after_destroy: MemorySnapshot

    @property
    def calibration_growth(self) -> int:
        return self.after_capture.used_bytes - self.before.used_bytes

    @property
    def retained_after_destroy(self) -> int:
        """Growth that stays after the graphs are destroyed (driver caches, lazy loading)."""
        return self.after_destroy.used_bytes - self.before.used_bytes

    @property
    def graph_bytes_estimate(self) -> int:
        """What rebuilding the graphs is expected to take on top of the retained growth."""
        return self.after_capture.used_bytes - self.after_destroy.used_bytes

    def describe(self) -> str:
        mib = 1 << 20
        return (f"graphs: +{self.calibration_growth / mib:.1f} MiB at capture, "
                f"{self.retained_after_destroy / mib:+.1f} MiB retained after destroy, "
                f"rebuild estimate {self.graph_bytes_estimate / mib:+.1f} MiB")


def pinned_empty(shape, dtype) -> np.ndarray:
    """A NumPy array in page-locked host memory (for async H2D/D2H on a stream).

    The array keeps the pinned allocation alive through its buffer base.
    """
    import cupy

    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    mem = cupy.cuda.alloc_pinned_memory(max(count, 1) * dtype.itemsize)
    return np.frombuffer(mem, dtype=dtype, count=count).reshape(shape)
