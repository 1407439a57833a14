"""`DeviceContext`: one GPU, its non-blocking CuPy stream and the properties planners need.

The context owns its stream. Kernels launch on CuPy's *current* stream, so callers run work
inside `with ctx.activate():`, which makes this device and this stream current.
"""
from __future__ import annotations

import contextlib
import dataclasses

from ninfer.errors import DeviceUnavailable


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceProperties:
    """What the planner and the launchers read off the device (sizes in bytes)."""

    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    l2_bytes: int
    total_memory_bytes: int
    max_smem_per_block_optin: int
    max_threads_per_sm: int
    clock_khz: int
    memory_clock_khz: int
    memory_bus_bits: int

    @property
    def arch(self) -> str:
        """The `-arch` value for this device, e.g. "sm_90"."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"


def _cupy():
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise DeviceUnavailable("the cuda backend needs CuPy (pip install ninfer[cuda13])") from exc
    return cupy


def read_properties(ordinal: int) -> DeviceProperties:
    """Read `DeviceProperties` for device `ordinal` (raises DeviceUnavailable if absent)."""
    cupy = _cupy()
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise DeviceUnavailable(f"no CUDA device is usable: {exc}") from exc
    if not 0 <= ordinal < count:
        raise DeviceUnavailable(f"CUDA device {ordinal} does not exist ({count} visible)")
    p = cupy.cuda.runtime.getDeviceProperties(ordinal)
    name = p["name"]
    return DeviceProperties(
        ordinal=ordinal,
        name=name.decode() if isinstance(name, bytes) else str(name),
        compute_capability=(int(p["major"]), int(p["minor"])),
        sm_count=int(p["multiProcessorCount"]),
        l2_bytes=int(p["l2CacheSize"]),
        total_memory_bytes=int(p["totalGlobalMem"]),
        max_smem_per_block_optin=int(p.get("sharedMemPerBlockOptin", p["sharedMemPerBlock"])),
        max_threads_per_sm=int(p["maxThreadsPerMultiProcessor"]),
        clock_khz=int(p.get("clockRate", 0)),
        memory_clock_khz=int(p.get("memoryClockRate", 0)),
        memory_bus_bits=int(p.get("memoryBusWidth", 0)),
    )


class DeviceContext:
    """A device ordinal, a non-blocking stream on it, and its properties.

    Not thread-safe: one engine worker thread drives one context.
    """

    def __init__(self, ordinal: int = 0):
        cupy = _cupy()
        self.props = read_properties(ordinal)
        self.ordinal = ordinal
        self.device = cupy.cuda.Device(ordinal)
        with self.device:
            self.stream = cupy.cuda.Stream(non_blocking=True)

    @contextlib.contextmanager
    def activate(self):
        """Make this device and this context's stream current for the block."""
        with self.device, self.stream:
            yield self

    def synchronize(self) -> None:
        """Wait for all work queued on this context's stream."""
        self.stream.synchronize()

    def __repr__(self) -> str:
        p = self.props
        return (f"DeviceContext({p.ordinal}: {p.name}, {p.arch}, {p.sm_count} SMs, "
                f"L2 {p.l2_bytes >> 20} MiB, {p.total_memory_bytes / 2**30:.1f} GiB)")
