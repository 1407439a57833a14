"""Benchmark plumbing: results (`Measure`), the run context, CUDA-event timing with inputs
rotated beyond L2, and the two ceilings measured in the same run (copy bandwidth, bf16 matmul).

Two timings: `BenchContext.time` records events around one eager call (it includes the Python
launch cost whenever the host is slower than the GPU: a fast kernel measures the launcher), and
`BenchContext.time_graph` captures R back-to-back calls into one CUDA graph and divides the
replay time by R (the device time of the op as it runs inside the decode graph)."""
from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Callable

import numpy as np


@dataclasses.dataclass
class Measure:
    """One timed case. bytes/flops are the minimum traffic/work of the op (for the roofline)."""

    op: str
    variant: str
    time_ms: float
    bytes: float = 0.0
    flops: float = 0.0
    peer: str | None = None
    peer_ms: float | None = None
    note: str = ""
    gbps: float | None = None
    tflops: float | None = None
    roofline: float | None = None

    def finish(self, ceilings: "Ceilings") -> "Measure":
        """Fill the achieved rates and the ratio to the binding roofline."""
        sec = self.time_ms / 1e3
        if sec > 0 and self.bytes:
            self.gbps = self.bytes / sec / 1e9
        if sec > 0 and self.flops:
            self.tflops = self.flops / sec / 1e12
        floors = []
        if self.bytes and ceilings.copy_gbps:
            floors.append(self.bytes / (ceilings.copy_gbps * 1e9))
        if self.flops and ceilings.matmul_tflops:
            floors.append(self.flops / (ceilings.matmul_tflops * 1e12))
        if floors and sec > 0:
            self.roofline = max(floors) / sec
        return self


@dataclasses.dataclass
class Ceilings:
    copy_gbps: float = 0.0      # read + written bytes of a large device-to-device copy
    matmul_tflops: float = 0.0  # cuBLAS bf16 x bf16 -> fp32 GEMM, fp32 accumulation


@dataclasses.dataclass
class BenchContext:
    """What every case receives: the shape, an RNG, L2 size, repeat counts."""

    shape: object
    rng: np.random.Generator
    l2_bytes: int
    warmup: int = 3
    repeat: int = 20

    def copies(self, nbytes: int, limit: int = 64) -> int:
        """How many input sets to rotate so that they exceed 3x the L2 cache."""
        if nbytes <= 0:
            return 1
        return int(min(limit, max(1, -(-3 * self.l2_bytes // nbytes))))

    def time(self, fn: Callable[[int], None]) -> float:
        """Median ms of fn(i) over `repeat` calls after `warmup`, timed with CUDA events."""
        from ninfer.core.cuda import median_ms, time_device

        return median_ms(time_device(fn, warmup=self.warmup, repeat=self.repeat))

    def time_graph(self, fn: Callable[[int], None], reps: int | None = None) -> tuple[float, int]:
        """(median ms per call, calls per graph) of fn(i) without host launch cost.

        fn(0), ..., fn(reps - 1) are captured back to back into one CUDA graph on the current
        stream (it must not be the legacy default stream: run inside DeviceContext.activate()),
        and each replay is timed with CUDA events: ms = median replay / reps. So consecutive calls
        rotate their input sets inside the graph, and the time includes each kernel's tail and
        the in-graph launch gap, as in the decode graph. fn must be capturable (preallocated
        buffers, no synchronization). reps=None: `graph_reps` of one eager call's time (which
        overestimates, so the graph is never too short)."""
        import cupy

        from ninfer.core.cuda import median_ms, time_device
        from ninfer.core.cuda.graph import CudaGraph

        stream = cupy.cuda.get_current_stream()
        if stream.ptr == 0:
            raise RuntimeError("time_graph needs a non-default stream (DeviceContext.activate)")
        eager = median_ms(time_device(fn, warmup=self.warmup, repeat=3))  # warms up, too
        reps = graph_reps(eager) if reps is None else reps
        graph = CudaGraph("bench")
        try:
            with graph.capture(stream):
                for i in range(reps):
                    fn(i)
            times = time_device(lambda i: graph.launch(stream), warmup=2, repeat=self.repeat,
                                stream=stream)
        finally:
            stream.synchronize()
            graph.destroy()
        return per_call_ms(times, reps), reps


GRAPH_TARGET_MS = 2.0  # one replay of a timing graph lasts about this long
GRAPH_MIN_REPS, GRAPH_MAX_REPS = 8, 256


def graph_reps(estimate_ms: float, target_ms: float = GRAPH_TARGET_MS,
               lo: int = GRAPH_MIN_REPS, hi: int = GRAPH_MAX_REPS) -> int:
    """Calls per timing graph so that a replay lasts about target_ms, given an estimate of one
    call (an eager timing; None, NaN or <= 0: the most), clamped to [lo, hi]."""
    if estimate_ms is None or not estimate_ms > 0 or math.isinf(estimate_ms):
        return hi
    return int(min(hi, max(lo, math.ceil(target_ms / estimate_ms))))


def per_call_ms(replay_ms: list[float], reps: int) -> float:
    """Median replay time of a graph of `reps` calls, per call (NaN without replays)."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    return median(replay_ms) / reps


def bf16_random(cp, shape, scale: float = 0.02):
    """Random bf16 (uint16 patterns) generated on the device (never zeros)."""
    x = cp.random.standard_normal(shape, dtype=cp.float32) * scale
    bits = x.view(cp.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(cp.uint16)


def f32_random(cp, shape, scale: float = 1.0):
    return cp.random.standard_normal(shape, dtype=cp.float32) * scale


def measure_copy_gbps(ctx: BenchContext) -> float:
    """Copy bandwidth, GB/s: a 2 GiB device-to-device copy, read + written bytes over its median
    time (`ctx.time`)."""
    import cupy as cp

    n = 1 << 29  # 2 GiB of float32
    src = cp.random.standard_normal(n, dtype=cp.float32)
    dst = cp.empty_like(src)
    return 2 * n * 4 / (ctx.time(lambda i: cp.copyto(dst, src)) / 1e3) / 1e9


def measure_ceilings(ctx: BenchContext) -> Ceilings:
    """Copy bandwidth (`measure_copy_gbps`) and the cuBLAS bf16 GEMM rate (8192^3)."""
    import cupy as cp

    from ninfer.kernels_cuda import _cublas

    copy_gbps = measure_copy_gbps(ctx)
    size = 8192
    a, b = bf16_random(cp, (size, size)), bf16_random(cp, (size, size))
    c = cp.empty((size, size), dtype=cp.float32)

    def gemm(i):
        _cublas.gemm_ex(_cublas.OP_T, _cublas.OP_N, size, size, size, a.data.ptr, _cublas.R_16BF,
                        size, b.data.ptr, _cublas.R_16BF, size, c.data.ptr, size)

    gemm_ms = ctx.time(gemm)
    return Ceilings(copy_gbps=copy_gbps, matmul_tflops=2 * size ** 3 / (gemm_ms / 1e3) / 1e12)


def median(values) -> float:
    return float(statistics.median(values)) if values else float("nan")
