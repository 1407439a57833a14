"""Layer 5: the Engine facade, EngineCore, Scheduler, ResourceManager.

Never imports CuPy, Numba, a specific model or the frontend: it drives the protocols in
`ninfer.runtime.contract`, which models and the frontend implement.
"""
