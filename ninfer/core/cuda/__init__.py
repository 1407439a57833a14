"""CUDA device infrastructure over CuPy and cuda-python (`cuda.bindings`).

Importing this package needs neither CuPy nor cuda-python; the classes import them when used.
"""
from ninfer.core.cuda._check import CudaError, check
from ninfer.core.cuda.device import DeviceContext, DeviceProperties, read_properties
from ninfer.core.cuda.graph import CudaGraph
from ninfer.core.cuda.memory import GraphMemoryReport, MemorySnapshot, pinned_empty, snapshot
from ninfer.core.cuda.timing import median_ms, time_device

__all__ = [
    "CudaError", "check", "DeviceContext", "DeviceProperties", "read_properties", "CudaGraph",
    "GraphMemoryReport", "MemorySnapshot", "pinned_empty", "snapshot", "median_ms", "time_device",
]
