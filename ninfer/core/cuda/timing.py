"""CUDA-event timing of device work (for benchmarks and calibration, never on the hot path)."""
from __future__ import annotations

import statistics
from typing import Callable


def time_device(fn: Callable[[int], None], *, warmup: int = 3, repeat: int = 20,
                stream=None) -> list[float]:
    """Run `fn(i)` `warmup` times, then time `repeat` calls with CUDA events; return ms per call.

    `fn` receives the call index so that callers can rotate input sets (to defeat the L2 cache).
    Work is timed on `stream` (default: CuPy's current stream).
    """
    import cupy

    stream = stream or cupy.cuda.get_current_stream()
    for i in range(warmup):
        fn(i)
    times = []
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    for i in range(repeat):
        start.record(stream)
        fn(warmup + i)
        stop.record(stream)
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return times


def median_ms(times: list[float]) -> float:
    return float(statistics.median(times)) if times else float("nan")
