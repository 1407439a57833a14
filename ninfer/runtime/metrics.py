"""Aggregate engine metrics: counters, gauges and fixed-bucket histograms (no request content).

The worker thread updates them; `snapshot()` may be called from any thread and returns plain
Python data (dicts, lists, numbers) that the server maps to Prometheus. Histogram snapshots give
per-bucket (non-cumulative) counts: `counts[i]` counts values <= `bounds[i]` and > the previous
bound; the last entry counts values above every bound (+Inf).
"""
from __future__ import annotations

import bisect
import threading
from typing import Sequence

TTFT_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

COUNTERS = (
    "submitted", "admitted", "overloaded", "rejected", "cancelled", "expired_queue",
    "expired_deadline", "failed", "finished_stop", "finished_length", "finished_cancelled",
    "prompt_tokens", "generation_tokens", "steps", "decode_rows", "prefill_chunks",
    "prefill_tokens", "aborted_batches", "pauses_snapshot", "pauses_replay",
    "resumes_snapshot", "resumes_replay", "snapshot_revocations",
)
GAUGES = (
    "queue_depth", "resident", "paused", "kv_pages_used", "kv_pages_free", "slots_used",
    "slots_free", "host_snapshot_bytes_used", "host_snapshot_bytes_free",
)


class Histogram:
    """Fixed upper bounds; not thread-safe by itself (EngineMetrics locks around it)."""

    def __init__(self, bounds: Sequence[float]):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def snapshot(self) -> dict:
        return {"bounds": list(self.bounds), "counts": list(self.counts), "sum": self.total,
                "count": self.count}


class EngineMetrics:
    def __init__(self, max_batch: int):
        self._lock = threading.Lock()
        self._counters = dict.fromkeys(COUNTERS, 0)
        self._gauges = dict.fromkeys(GAUGES, 0)
        self._ttft = Histogram(TTFT_BUCKETS_S)
        self._itl = Histogram(ITL_BUCKETS_S)
        self._batch = Histogram(tuple(float(b) for b in range(1, max_batch + 1)))
        self._request_s_sum = 0.0  # for the Overloaded retry-after hint
        self._request_count = 0

    def inc(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters[name] += n  # KeyError on an unknown name is deliberate

    def set_gauges(self, **values: int) -> None:
        with self._lock:
            for name, value in values.items():
                if name not in self._gauges:
                    raise KeyError(name)
                self._gauges[name] = value

    def observe_ttft(self, seconds: float) -> None:
        with self._lock:
            self._ttft.observe(seconds)

    def observe_itl(self, seconds: float, n_tokens: int) -> None:
        """One inter-token gap of `seconds` spread over `n_tokens` tokens committed together."""
        with self._lock:
            for _ in range(n_tokens):
                self._itl.observe(seconds / n_tokens)

    def observe_batch(self, rows: int) -> None:
        with self._lock:
            self._batch.observe(float(rows))

    def observe_request(self, seconds: float) -> None:
        with self._lock:
            self._request_s_sum += seconds
            self._request_count += 1

    def mean_request_s(self) -> float | None:
        with self._lock:
            return self._request_s_sum / self._request_count if self._request_count else None

    def snapshot(self) -> dict:
        with self._lock:
            c = dict(self._counters)
            g = dict(self._gauges)
            hist = {"ttft_s": self._ttft.snapshot(), "itl_s": self._itl.snapshot(),
                    "decode_batch_size": self._batch.snapshot()}
        return {
            **{k: g[k] for k in ("queue_depth", "resident", "paused")},
            "counters": c,
            "pauses": {"snapshot": c["pauses_snapshot"], "replay": c["pauses_replay"]},
            "resumes": {"snapshot": c["resumes_snapshot"], "replay": c["resumes_replay"]},
            "kv_pages": {"used": g["kv_pages_used"], "free": g["kv_pages_free"]},
            "slots": {"used": g["slots_used"], "free": g["slots_free"]},
            "host_snapshot_bytes": {"used": g["host_snapshot_bytes_used"],
                                    "free": g["host_snapshot_bytes_free"]},
            "histograms": hist,
        }
