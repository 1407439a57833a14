"""`precompile_all` compiles every kernel module: MODULES names exactly the launcher modules that
declare a KernelSource (no GPU or CuPy needed: importing a launcher compiles nothing)."""
from __future__ import annotations

import importlib
import pkgutil

import ninfer.kernels_cuda as kernels_cuda
from ninfer.kernels_cuda._loader import KernelSource


def test_modules_lists_every_kernel_source():
    public = [m.name for m in pkgutil.iter_modules(kernels_cuda.__path__)
              if not m.name.startswith("_")]
    with_source = {name for name in public if any(
        isinstance(v, KernelSource)
        for v in vars(importlib.import_module(f"ninfer.kernels_cuda.{name}")).values())}
    assert with_source == set(kernels_cuda.MODULES)
    assert {"attention_prefill", "attn_prep"} <= with_source
