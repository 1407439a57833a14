"""Layer 2, CUDA backend: RawModule kernels (`<module>.cu`) and their launchers (`<module>.py`).

One op family per module, with the contracts of docs/ops.md: `embedding`, `norm`, `linear`,
`rope`, `attention` (+ `attention_prefill`, `attn_prep`), `elementwise`, `gdn` (+ `gdn_chunk`,
`gdn_decode`), `moe`, `sampling`.
Launchers check operands (CuPy arrays on the executing device), pick the kernel instance and
grid, and launch on CuPy's current stream without allocating (capturable in CUDA graphs) unless
a docstring says otherwise. `_loader` holds the only global state: the compiled-module cache.
Importing this package or a launcher module does not import CuPy.
"""
from __future__ import annotations

MODULES = ("embedding", "norm", "linear", "rope", "attention", "attention_prefill", "attn_prep",
           "elementwise", "gdn", "gdn_chunk", "gdn_decode", "moe", "sampling")


def precompile_all() -> None:
    """Compile every module for the current device now (start-up), reporting compile time."""
    import importlib

    from ninfer.kernels_cuda._loader import KernelSource, precompile

    sources = []
    for name in MODULES:
        module = importlib.import_module(f"ninfer.kernels_cuda.{name}")
        sources += [v for v in vars(module).values() if isinstance(v, KernelSource)]
    precompile(*sources)
