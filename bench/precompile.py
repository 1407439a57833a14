"""Compile every CUDA module into the kernel cache, one process per KernelSource in parallel (the
GPU machine has 16 cores; a cold sequential compile takes minutes; a module's second build, e.g.
linear.SOURCE_FOLD, compiles beside its first). Later processes load cubins.

    python3 -m bench.precompile        # env (e.g. NINFER_PDL_TRIGGER_FIRST=1) picks the build
"""
from __future__ import annotations

import importlib
import subprocess
import sys
import time

from ninfer.kernels_cuda import MODULES

_ONE = """
import importlib, time
from ninfer.kernels_cuda._loader import KernelSource, precompile
m = importlib.import_module("ninfer.kernels_cuda.{name}")
t = time.perf_counter()
precompile(m.{var})
print("{name}.{var}: %.1f s" % (time.perf_counter() - t), flush=True)
"""


def _sources(name: str) -> list[str]:
    """The names of module `name`'s KernelSource variables, one per distinct build."""
    from ninfer.kernels_cuda._loader import KernelSource
    m = importlib.import_module(f"ninfer.kernels_cuda.{name}")
    builds = {}
    for var, v in vars(m).items():
        if isinstance(v, KernelSource):
            builds.setdefault(v, var)
    return list(builds.values())


def main() -> int:
    start = time.perf_counter()
    jobs = [(name, var) for name in MODULES for var in _sources(name)]
    procs = [subprocess.Popen([sys.executable, "-c", _ONE.format(name=name, var=var)])
             for name, var in jobs]
    failed = [f"{name}.{var}" for (name, var), p in zip(jobs, procs) if p.wait() != 0]
    print(f"precompile: {len(MODULES)} modules, {len(jobs)} builds in "
          f"{time.perf_counter() - start:.1f} s"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
