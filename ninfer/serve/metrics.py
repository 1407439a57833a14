"""Prometheus metrics of one server (aggregate only: no request content, no per-request labels).

`ServerMetrics` owns a per-app `CollectorRegistry` with
- server counters: ``ninfer:http_requests_total{status_class}``,
  ``ninfer:http_client_disconnects_total``, ``ninfer:http_requests_in_progress``;
- ``ninfer:model_state{state}`` (1 for the host's current state);
- the engine's `metrics_snapshot()` mapped at scrape time by `EngineCollector`: counters
  (``ninfer:requests_*_total``, ``ninfer:*_tokens_total``, ...), gauges (queue, residents,
  outstanding, KV pages, state slots, host snapshot bytes) and histograms (TTFT, inter-token
  latency, decode batch size). Engine counters absent from `_COUNTER_NAMES` still appear as
  ``ninfer:engine_<name>_total``.
"""
from __future__ import annotations

import threading
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE", "ServerMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

# engine counter -> (metric name without _total, label name, label value)
_COUNTER_NAMES: dict[str, tuple[str, str | None, str | None]] = {
    "submitted": ("ninfer:requests_submitted", None, None),
    "admitted": ("ninfer:requests_admitted", None, None),
    "overloaded": ("ninfer:requests_refused", "reason", "overloaded"),
    "rejected": ("ninfer:requests_refused", "reason", "rejected"),
    "expired_queue": ("ninfer:requests_expired", "phase", "queue"),
    "expired_deadline": ("ninfer:requests_expired", "phase", "deadline"),
    "cancelled": ("ninfer:requests_cancelled", None, None),
    "failed": ("ninfer:requests_failed", None, None),
    "finished_stop": ("ninfer:requests_finished", "finish_reason", "stop"),
    "finished_length": ("ninfer:requests_finished", "finish_reason", "length"),
    "finished_cancelled": ("ninfer:requests_finished", "finish_reason", "cancelled"),
    "prompt_tokens": ("ninfer:prompt_tokens", None, None),
    "generation_tokens": ("ninfer:generation_tokens", None, None),
    "steps": ("ninfer:engine_steps", None, None),
    "decode_rows": ("ninfer:decode_rows", None, None),
    "prefill_chunks": ("ninfer:prefill_chunks", None, None),
    "prefill_tokens": ("ninfer:prefill_tokens", None, None),
    "aborted_batches": ("ninfer:aborted_batches", None, None),
    "pauses_snapshot": ("ninfer:pauses", "kind", "snapshot"),
    "pauses_replay": ("ninfer:pauses", "kind", "replay"),
    "resumes_snapshot": ("ninfer:resumes", "kind", "snapshot"),
    "resumes_replay": ("ninfer:resumes", "kind", "replay"),
    "snapshot_revocations": ("ninfer:snapshot_revocations", None, None),
}
_HISTOGRAMS = {
    "ttft_s": ("ninfer:time_to_first_token_seconds", "Time from submit to the first token."),
    "itl_s": ("ninfer:inter_token_latency_seconds", "Time between output tokens."),
    "decode_batch_size": ("ninfer:decode_batch_size", "Decode rows per engine step."),
}
_PAIRS = {  # snapshot key -> gauge name (labels state=used|free)
    "kv_pages": ("ninfer:kv_pages", "KV cache pages by state."),
    "slots": ("ninfer:state_slots", "Recurrent-state slots by state."),
    "host_snapshot_bytes": ("ninfer:host_snapshot_bytes", "Host memory of paused snapshots."),
}
_GAUGES = {
    "queue_depth": ("ninfer:num_requests_waiting", "Requests waiting for admission."),
    "resident": ("ninfer:num_requests_running", "Requests holding a lane."),
    "paused": ("ninfer:num_requests_paused", "Requests paused under memory pressure."),
    "outstanding": ("ninfer:requests_outstanding", "Accepted requests not yet released."),
    "max_outstanding": ("ninfer:requests_outstanding_limit", "Outstanding-request limit."),
    "max_concurrency": ("ninfer:max_concurrency", "Lanes (most requests running at once)."),
}


def _counters(counters: dict[str, int]) -> Iterator[CounterMetricFamily]:
    families: dict[str, CounterMetricFamily] = {}
    for key, value in counters.items():
        name, label, label_value = _COUNTER_NAMES.get(key, (f"ninfer:engine_{key}", None, None))
        family = families.get(name)
        if family is None:
            family = CounterMetricFamily(name, f"Engine counter {name[7:]}.",
                                         labels=[label] if label else None)
            families[name] = family
        family.add_metric([label_value] if label else [], value)
    return iter(families.values())


def _histogram(name: str, doc: str, snap: dict) -> HistogramMetricFamily:
    buckets, cumulative = [], 0
    for bound, count in zip(list(snap["bounds"]) + [float("inf")], snap["counts"]):
        cumulative += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), cumulative))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=snap["sum"])


class EngineCollector:
    """Maps `engine.metrics_snapshot()` at scrape time (no engine, no engine metrics)."""

    def __init__(self, snapshot: Callable[[], dict | None]):
        self._snapshot = snapshot

    def collect(self):
        snap = self._snapshot()
        if snap is None:
            return
        yield from _counters(snap.get("counters", {}))
        for key, (name, doc) in _GAUGES.items():
            if key in snap:
                yield GaugeMetricFamily(name, doc, value=snap[key])
        for key, (name, doc) in _PAIRS.items():
            if key in snap:
                family = GaugeMetricFamily(name, doc, labels=["state"])
                for state in ("used", "free"):
                    family.add_metric([state], snap[key][state])
                yield family
        up = GaugeMetricFamily("ninfer:engine_running", "1 while the engine accepts work.",
                               value=1 if snap.get("engine_status") == "running" else 0)
        yield up
        for key, (name, doc) in _HISTOGRAMS.items():
            hist = snap.get("histograms", {}).get(key)
            if hist is not None:
                yield _histogram(name, doc, hist)


class ServerMetrics:
    """Counters the HTTP layer updates, plus the engine's and the model state's collectors.

    The server's own counters are plain integers under a lock, exposed by this object's
    `collect` (no ``_created`` series, nothing process-global).
    """

    STATES = ("loading", "ready", "failed", "stopping")

    def __init__(self, engine_snapshot: Callable[[], dict | None],
                 model_state: Callable[[], str]):
        self._lock = threading.Lock()
        self._responses: dict[str, int] = {}
        self._disconnects = 0
        self._in_progress = 0
        self._model_state = model_state
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        self.registry.register(EngineCollector(engine_snapshot))

    def count_response(self, status: int) -> None:
        with self._lock:
            key = f"{status // 100}xx"
            self._responses[key] = self._responses.get(key, 0) + 1

    def count_disconnect(self) -> None:
        with self._lock:
            self._disconnects += 1

    def enter(self) -> None:
        with self._lock:
            self._in_progress += 1

    def leave(self) -> None:
        with self._lock:
            self._in_progress -= 1

    def collect(self):
        with self._lock:
            responses, disconnects = dict(self._responses), self._disconnects
            in_progress = self._in_progress
        http = CounterMetricFamily("ninfer:http_requests", "HTTP responses by status class.",
                                   labels=["status_class"])
        for status_class, value in sorted(responses.items()):
            http.add_metric([status_class], value)
        yield http
        yield CounterMetricFamily("ninfer:http_client_disconnects",
                                  "Clients that went away before their response ended.",
                                  value=disconnects)
        yield GaugeMetricFamily("ninfer:http_requests_in_progress",
                                "HTTP requests being handled.", value=in_progress)
        state = GaugeMetricFamily("ninfer:model_state", "1 for the model's current state.",
                                  labels=["state"])
        current = self._model_state()
        for name in self.STATES:
            state.add_metric([name], float(current == name))
        yield state

    def render(self) -> bytes:
        return generate_latest(self.registry)
