"""Prefill-chunk diagnosis (GPU): is the prefill bound by the host or by the GPU?

    python3 bench/profile_prefill.py --shape 9b --tokens 1024 --chunk 512 [--cprofile] [--graphs]
    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \
        python3 bench/profile_prefill.py --shape 9b --tokens 1024 --chunk 512 --ncu > prof.csv
    python3 bench/profile_decode.py --summarize prof.csv

Gate method: a spin kernel holds the stream for `--gate-ms` while the host issues every chunk
behind it. GPU ms is the event time from the gate's end to the last chunk's end (pure GPU work,
provided the host finished issuing before the gate ran out, which is printed); host ms is the
time the host spent issuing. host >= gate means something in the prefill path waited for the GPU.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="9b")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--gate-ms", type=float, default=400.0)
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--ncu", action="store_true", help="profile one pass (cudaProfilerStart/Stop)")
    ap.add_argument("--graphs", action="store_true",
                    help="capture the prefill graphs first, so chunks replay them (else eager)")
    a = ap.parse_args()

    import cupy as cp
    import numpy as np

    from bench.model import _build, shape_config
    from bench.shapes import resolve
    from ninfer.models.qwen3_5.random_params import random_parameters

    cfg, _, _ = shape_config(resolve(a.shape), a.tokens + 1)
    params = random_parameters(cfg, xp=cp, seed=1)
    device, backend = _build(cfg, params, 1, a.tokens, prefill_chunk=a.chunk)
    if a.graphs:
        backend.capture_prefill_graphs()
    slot = backend.allocate_slot()
    backend.set_block_table(slot, backend.pages.allocate(
        -(-(a.tokens + 1) // backend.kv.page_size)))
    ids = np.random.default_rng(3).integers(0, cfg.vocab_size, a.tokens).tolist()

    def issue() -> None:
        for start in range(0, a.tokens, a.chunk):
            inp = backend.step_inputs
            inp.reset()
            inp.add_segment(slot, ids[start:start + a.chunk], start)
            backend.execute(num_decode=0)

    backend.zero_state(slot)
    issue()  # warm-up: compilation, cuBLAS heuristics, memory pool
    device.synchronize()
    if a.ncu:
        cp.cuda.profiler.start()
        issue()
        device.synchronize()
        cp.cuda.profiler.stop()
        return
    spin = cp.RawKernel(SPIN, "spin")
    with device.activate():
        stream = cp.cuda.get_current_stream()
        clock_khz = cp.cuda.runtime.getDeviceProperties(0)["clockRate"]
        for label in ("gated", "gated again"):
            backend.zero_state(slot)
            device.synchronize()
            gate_end, done = cp.cuda.Event(), cp.cuda.Event()
            spin((1,), (1,), (np.int64(a.gate_ms * clock_khz),))
            gate_end.record(stream)
            t = time.perf_counter()
            issue()
            host_ms = (time.perf_counter() - t) * 1e3
            done.record(stream)
            gate_left = not gate_end.done  # True: the host finished issuing inside the gate
            done.synchronize()
            gpu_ms = cp.cuda.get_elapsed_time(gate_end, done)
            print(f"{label}: {a.tokens} tokens in {a.chunk}-token chunks: host issue "
                  f"{host_ms:.1f} ms (gate {a.gate_ms:.0f} ms, still running after issue: "
                  f"{gate_left}), GPU {gpu_ms:.1f} ms", flush=True)
        if a.cprofile:
            backend.zero_state(slot)
            device.synchronize()
            prof = cProfile.Profile()
            prof.enable()
            issue()
            device.synchronize()
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(40)


if __name__ == "__main__":
    main()
