"""ServerConfig and the ServerContext every route shares."""
from __future__ import annotations

import dataclasses

from ninfer.serve.jobs import JobLimits
from ninfer.serve.lifecycle import ModelHost
from ninfer.serve.metrics import ServerMetrics

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "ServerConfig", "ServerContext"]

DEFAULT_MAX_REQUEST_BYTES = 4 << 20


@dataclasses.dataclass(frozen=True)
class ServerConfig:
    """HTTP-level settings of one app (network settings belong to `run_server`).

    - `api_key`: when set, every route but /health needs ``Authorization: Bearer <key>``.
    - `max_request_bytes`: request bodies above it get 413.
    - `default_max_tokens`: output budget of a request that gives no max_tokens (None: up
      to the context limit).
    - `timeout_s`: deadline of every generation request, queue time included (None: none).
    """

    api_key: str | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    default_max_tokens: int | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must not be empty")
        if self.max_request_bytes < 1024:
            raise ValueError("max_request_bytes must be at least 1024")

    @property
    def job_limits(self) -> JobLimits:
        return JobLimits(default_max_tokens=self.default_max_tokens, timeout_s=self.timeout_s)


@dataclasses.dataclass(frozen=True)
class ServerContext:
    config: ServerConfig
    host: ModelHost
    metrics: ServerMetrics
