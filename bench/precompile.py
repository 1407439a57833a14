"""Compile every CUDA module into the kernel cache, one process per KernelSource (and per extra
setting) in parallel, at most `--jobs` processes at once (the GPU machine has 16 cores; a cold
sequential compile takes minutes; a module's second build, e.g. linear.SOURCE_FOLD, compiles
beside its first). Later processes load cubins.

    python3 -m bench.precompile        # env (e.g. NINFER_PDL_TRIGGER_FIRST=1) picks the build
    python3 -m bench.precompile --setting NINFER_ATTN_TMA=1+NINFER_ATTN_MERGE_KERNEL=3 ...
                                       # also the builds those settings select

Each process compiles through CuPy, which loads the module and so holds a CUDA context (~0.5 GB
of device memory): an unbounded fan-out over several settings (6 x 20 processes) ran the device
out of memory (cudaErrorMemoryAllocation), hence the bound.
"""
from __future__ import annotations

import argparse
import importlib
import os
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
print("{label}{name}.{var}: %.1f s" % (time.perf_counter() - t), flush=True)
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


def parse_setting(setting: str) -> dict[str, str]:
    """'A=1+B=2' -> {'A': '1', 'B': '2'} (the session scripts' env-list spelling)."""
    out = {}
    for item in filter(None, setting.split("+")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"bad setting {item!r} in {setting!r}: expected NAME=VALUE")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.precompile", description=__doc__.split("\n")[0])
    parser.add_argument("--setting", action="append", default=[],
                        help="NAME=VALUE[+NAME=VALUE...]: also compile the builds these env "
                             "settings select (repeatable)")
    parser.add_argument("--jobs", type=int, default=24, help="processes at once (default 24)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    settings = [("", {})] + [(s + ": ", parse_setting(s)) for s in args.setting]
    start = time.perf_counter()
    jobs = [(label, env, name, var) for label, env in settings
            for name in MODULES for var in _sources(name)]
    pending, running, failed = list(jobs), [], []
    while pending or running:
        while pending and len(running) < args.jobs:
            label, env, name, var = job = pending.pop(0)
            code = _ONE.format(name=name, var=var, label=label)
            running.append((job, subprocess.Popen([sys.executable, "-c", code],
                                                  env={**os.environ, **env})))
        time.sleep(0.05)
        for entry in [r for r in running if r[1].poll() is not None]:
            running.remove(entry)
            (label, _, name, var), proc = entry
            if proc.returncode != 0:
                failed.append(f"{label}{name}.{var}")
    print(f"precompile: {len(MODULES)} modules, {len(jobs)} builds "
          f"({len(settings)} settings) in {time.perf_counter() - start:.1f} s"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
