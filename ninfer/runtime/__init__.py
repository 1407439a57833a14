"""Layer 5: the Engine facade, EngineCore, Scheduler, ResourceManager.

Never imports CuPy, Numba, a specific model or the frontend: it drives the protocols in
`ninfer.runtime.contract`, which models and the frontend implement.

Public API: `Engine`, `GenerationRequest`, `GenerationHandle`, the events (`GenerationStart`,
`OutputEvent`, `GenerationFinished`, `GenerationFailed`, `GenerationResult`) and the typed
errors in `ninfer.runtime.errors`. Imported lazily so `import ninfer.runtime.contract` stays light.
"""
from __future__ import annotations

_EXPORTS = {
    "Engine": "ninfer.runtime.engine",
    "EngineStatus": "ninfer.runtime.engine",
    "GenerationRequest": "ninfer.runtime.request",
    "GenerationHandle": "ninfer.runtime.handle",
    "GenerationStart": "ninfer.runtime.events",
    "OutputEvent": "ninfer.runtime.events",
    "GenerationFinished": "ninfer.runtime.events",
    "GenerationFailed": "ninfer.runtime.events",
    "GenerationResult": "ninfer.runtime.events",
    "Timings": "ninfer.runtime.events",
    "GenerationError": "ninfer.runtime.errors",
    "Overloaded": "ninfer.runtime.errors",
    "QueueTimeout": "ninfer.runtime.errors",
    "DeadlineExceeded": "ninfer.runtime.errors",
    "RequestCancelled": "ninfer.runtime.errors",
    "RequestRejected": "ninfer.runtime.errors",
    "RequestFailed": "ninfer.runtime.errors",
    "EngineFailed": "ninfer.runtime.errors",
    "EngineShutdown": "ninfer.runtime.errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ninfer.runtime' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
