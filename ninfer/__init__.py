"""ninfer: an inference runtime for the Qwen3.5 family.

The package imports lazily: `import ninfer` never loads Numba, CuPy or the model code.
"""
from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["Engine", "__version__"]


def __getattr__(name: str):
    if name == "Engine":
        from ninfer.runtime.engine import Engine

        return Engine
    raise AttributeError(f"module 'ninfer' has no attribute {name!r}")
