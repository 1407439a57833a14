"""ModelHost: the served model's life (load in the background, serve, shut down).

The HTTP server listens before the model is ready. `ModelHost.start(loader)` runs `loader()` on
a background thread; the loader returns a `LoadedModel` (a Program, a frontend and a name).
The host then starts the `Engine` on the Program. States:

    LOADING --ok--> READY --shutdown--> STOPPING
       \\--error--> FAILED (the reason is kept and shown by /health)

`ready()` is what every model route calls: it returns the `ServedModel` or raises a 503
`ApiError` naming the state. Thread-safe; the load thread and shutdown may race (a model that
finishes loading after shutdown began is closed at once).
"""
from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
from typing import Any, Callable

from ninfer.runtime.contract import SamplingParams
from ninfer.runtime.engine import Engine
from ninfer.runtime.request import GenerationRequest
from ninfer.serve.errors import ApiError

__all__ = ["EngineOptions", "HostState", "LoadedModel", "ModelHost", "ServedModel"]

_log = logging.getLogger("ninfer.serve")


class HostState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    STOPPING = "stopping"


@dataclasses.dataclass
class LoadedModel:
    """What a loader returns. `close` releases the model (artifact mapping etc.)."""

    name: str
    program: Any  # ninfer.runtime.contract.Program
    frontend: Any  # QwenFrontend
    description: str = ""  # e.g. the capacity plan, printed at start-up
    close: Callable[[], None] = lambda: None


@dataclasses.dataclass(frozen=True)
class ServedModel:
    """A ready model: what the routes use. Immutable; the engine is thread-safe."""

    model_id: str
    engine: Engine
    frontend: Any
    max_context_len: int
    created: int  # unix time the model became ready (the /v1/models "created")

    def check_model(self, requested: str | None) -> None:
        """404 unless `requested` (the request's "model") is absent or this model's id."""
        if requested is not None and requested != self.model_id:
            raise ApiError(404, f"the model {requested!r} does not exist; this server serves "
                           f"{self.model_id!r}", param="model", code="model_not_found")


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    max_concurrency: int
    max_queue: int
    default_timeout_s: float | None = None
    # Run one tiny generation before reporting ready, so JIT compilation and first-touch
    # costs are paid at start-up instead of by the first client.
    warmup: bool = True


def _warm_up(engine: Engine, frontend) -> None:
    ids = tuple(frontend.tokenizer.encode("Hello"))
    engine.generate(GenerationRequest(ids, SamplingParams(temperature=0.0), max_tokens=2))


class ModelHost:
    def __init__(self, engine_options: EngineOptions, *, model_id: str | None = None,
                 on_ready: Callable[[LoadedModel, ServedModel], None] | None = None,
                 on_failed: Callable[[BaseException], None] | None = None):
        self._options = engine_options
        self._model_id = model_id
        self._on_ready = on_ready
        self._on_failed = on_failed
        self._lock = threading.Lock()
        self._state = HostState.LOADING
        self._reason: str | None = None
        self._served: ServedModel | None = None
        self._loaded: LoadedModel | None = None
        self._thread: threading.Thread | None = None

    # --- state ---------------------------------------------------------------------------------
    @property
    def state(self) -> HostState:
        return self._state

    @property
    def failure_reason(self) -> str | None:
        return self._reason

    @property
    def served(self) -> ServedModel | None:
        """The ready model, or None (no exception: for /health and /metrics)."""
        return self._served

    def ready(self) -> ServedModel:
        """The ready model; ApiError 503 while loading, after a failure or when stopping."""
        served = self._served
        if served is not None and self._state is HostState.READY:
            return served
        raise self.unavailable_error()

    def unavailable_error(self) -> ApiError:
        state = self._state
        if state is HostState.LOADING:
            return ApiError(503, "the model is still loading; retry shortly", code="loading",
                            headers={"Retry-After": "2"})
        if state is HostState.FAILED:
            return ApiError(503, f"the model failed to load: {self._reason}",
                            code="load_failed")
        return ApiError(503, "the server is shutting down", code="stopping")

    # --- loading -------------------------------------------------------------------------------
    def start(self, loader: Callable[[], LoadedModel]) -> None:
        """Load in a background thread (returns at once)."""
        if self._thread is not None:
            raise RuntimeError("ModelHost.start() called twice")
        self._thread = threading.Thread(target=self._load, args=(loader,), name="ninfer-load",
                                        daemon=True)
        self._thread.start()

    def load_now(self, loader: Callable[[], LoadedModel]) -> None:
        """Load on the calling thread (tests and embedding)."""
        self._load(loader)

    def wait_loaded(self, timeout: float | None = None) -> HostState:
        if self._thread is not None:
            self._thread.join(timeout)
        return self._state

    def _load(self, loader: Callable[[], LoadedModel]) -> None:
        started = time.monotonic()
        loaded = engine = None
        try:
            loaded = loader()
            engine = Engine(loaded.program, max_concurrency=self._options.max_concurrency,
                            max_queue=self._options.max_queue,
                            default_timeout_s=self._options.default_timeout_s)
            if self._options.warmup:
                _warm_up(engine, loaded.frontend)
        except BaseException as exc:  # noqa: BLE001 - any failure is reported by /health
            if engine is not None:
                engine.shutdown()
            if loaded is not None:
                loaded.close()
            self._fail(exc)
            return
        served = ServedModel(
            model_id=self._model_id or loaded.name, engine=engine, frontend=loaded.frontend,
            max_context_len=loaded.program.limits.max_context_len, created=int(time.time()))
        with self._lock:
            stopping = self._state is HostState.STOPPING
            if not stopping:
                self._loaded, self._served, self._state = loaded, served, HostState.READY
        if stopping:
            engine.shutdown()
            loaded.close()
            return
        _log.info("model %s ready after %.1f s", served.model_id, time.monotonic() - started)
        if self._on_ready is not None:
            self._on_ready(loaded, served)

    def _fail(self, exc: BaseException) -> None:
        # report first, then publish: whoever sees /health say "failed" can find the report
        reason = str(exc) or type(exc).__name__
        try:
            _log.error("model loading failed: %s", reason,
                       exc_info=not isinstance(exc, (ValueError, OSError)))
            if self._on_failed is not None:
                self._on_failed(exc)
        finally:
            with self._lock:
                if self._state is HostState.LOADING:
                    self._state, self._reason = HostState.FAILED, reason

    # --- shutdown ------------------------------------------------------------------------------
    def begin_shutdown(self) -> None:
        """Stop accepting work: every outstanding request ends (EngineShutdown). Non-blocking,
        safe from a signal handler."""
        with self._lock:
            self._state = HostState.STOPPING
            served = self._served
        if served is not None:
            served.engine.shutdown(wait=False)

    def close(self, timeout: float | None = 10.0) -> None:
        """Shut the engine down (waiting for its worker) and release the model."""
        self.begin_shutdown()
        with self._lock:
            served, loaded = self._served, self._loaded
            self._loaded = None
        if served is not None:
            served.engine.shutdown(wait=True, timeout=timeout)
        if loaded is not None:
            loaded.close()
