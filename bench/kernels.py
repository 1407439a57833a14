"""`ninfer-bench kernels`: time each CUDA kernel at a model shape against the ceilings measured
in the same run, print a table, optionally write JSON."""
from __future__ import annotations

import dataclasses
import json
import platform
import sys
import time

import numpy as np

from bench import peers
from bench.harness import BenchContext, Ceilings, Measure, measure_ceilings
from bench.kernel_cases import CASES
from bench.shapes import ModelShape


def versions() -> dict:
    import cupy

    out = {"python": platform.python_version(), "numpy": np.__version__,
           "cupy": cupy.__version__, "fla": peers.fla_status()}
    for name in ("cuda.bindings", "torch", "triton"):
        try:
            module = __import__(name, fromlist=["__version__"])
            out[name] = getattr(module, "__version__", "?")
        except Exception:
            out[name] = "not installed"
    return out


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(results: list[Measure], ceilings: Ceilings) -> str:
    lines = [f"ceilings: copy {ceilings.copy_gbps:.0f} GB/s (read+write), "
             f"bf16 matmul {ceilings.matmul_tflops:.0f} TFLOP/s",
             f"{'op':<19} {'variant':<60} {'ms':>9} {'GB/s':>7} {'TFLOP/s':>8} {'roof':>5} "
             f"{'peer ms':>9} {'x peer':>6}  peer / note"]
    for r in results:
        speed = (r.peer_ms / r.time_ms) if r.peer_ms and r.time_ms else None
        tail = " / ".join(t for t in (r.peer or "", r.note) if t)
        lines.append(f"{r.op:<19} {r.variant[:60]:<60} {r.time_ms:9.4f} {_fmt(r.gbps, '7.0f')} "
                     f"{_fmt(r.tflops, '8.1f')} {_fmt(r.roofline, '5.2f')} "
                     f"{_fmt(r.peer_ms, '9.4f')} {_fmt(speed, '6.2f')}  {tail}")
    return "\n".join(lines)


def run(shape: ModelShape, ops: list[str], json_path: str | None, repeat: int,
        seed: int = 0) -> int:
    """Run the selected cases; returns a process exit code (1 if any case failed)."""
    import cupy

    from ninfer.core.cuda import DeviceContext
    from ninfer.kernels_cuda import precompile_all
    from ninfer.kernels_cuda._loader import compile_records

    ctx_dev = DeviceContext(0)
    props = ctx_dev.props
    print(f"device: {props.name} ({props.arch}, {props.sm_count} SMs, L2 {props.l2_bytes >> 20} "
          f"MiB, {props.total_memory_bytes / 2**30:.0f} GiB); shape {shape.name}")
    info = versions()
    print("versions: " + ", ".join(f"{k} {v}" for k, v in info.items()))
    failures = []
    results: list[Measure] = []
    with ctx_dev.activate():
        start = time.perf_counter()
        precompile_all()
        compile_s = time.perf_counter() - start
        print(f"compile: {compile_s:.1f} s for {len(compile_records())} modules "
              "(modules in the kernel cache load without compiling)")
        bench = BenchContext(shape, np.random.default_rng(seed), props.l2_bytes, repeat=repeat)
        ceilings = measure_ceilings(bench)
        for op in ops:
            try:
                results += [m.finish(ceilings) for m in CASES[op](bench, cupy)]
            except Exception as exc:  # report and continue with the other ops
                failures.append({"op": op, "error": f"{type(exc).__name__}: {exc}"[:500]})
                print(f"FAILED {op}: {type(exc).__name__}: {exc}", file=sys.stderr)
            cupy.get_default_memory_pool().free_all_blocks()
    print(format_table(results, ceilings))
    for f in failures:
        print(f"FAILED {f['op']}: {f['error']}")
    if json_path:
        payload = {"shape": shape.name, "device": dataclasses.asdict(props), "versions": info,
                   "ceilings": dataclasses.asdict(ceilings), "compile_seconds": compile_s,
                   "compile": [dataclasses.asdict(r) for r in compile_records()],
                   "results": [dataclasses.asdict(r) for r in results], "failures": failures}
        with open(json_path, "w") as fh:
            json.dump(payload, fh, indent=1)
        print(f"wrote {json_path}")
    return 1 if failures else 0
