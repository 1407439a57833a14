"""Compile every CUDA module into the kernel cache, one process per module in parallel (the GPU
machine has 16 cores; a cold sequential compile takes minutes). Later processes load cubins.

    python3 -m bench.precompile        # env (e.g. NINFER_PDL_TRIGGER_FIRST=1) picks the build
"""
from __future__ import annotations

import subprocess
import sys
import time

from ninfer.kernels_cuda import MODULES

_ONE = """
import importlib, time
from ninfer.kernels_cuda._loader import KernelSource, precompile
m = importlib.import_module("ninfer.kernels_cuda.{name}")
t = time.perf_counter()
precompile(*[v for v in vars(m).values() if isinstance(v, KernelSource)])
print("{name}: %.1f s" % (time.perf_counter() - t), flush=True)
"""


def main() -> int:
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", _ONE.format(name=name)]) for name in MODULES]
    failed = [name for name, p in zip(MODULES, procs) if p.wait() != 0]
    print(f"precompile: {len(MODULES)} modules in {time.perf_counter() - start:.1f} s"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
