"""Decode-step kernel breakdown (GPU): run under Nsight Compute, one eager decode step per B.

    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \
        python3 bench/profile_decode.py --shape 9b --batch 1,8 > prof.csv
    python3 bench/profile_decode.py --summarize prof.csv [--batch 1,8]

`--summarize` with `--batch` listing the profiled batch sizes prints one table per step (every
step launches the same kernels, so the launches split into equal consecutive parts).

The eager step launches exactly the kernels the decode graph replays; only the measured step is
inside cudaProfilerStart/Stop.
"""
from __future__ import annotations

import argparse
import collections
import csv
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def profile(shape_name: str, batches: list[int], context: int) -> None:
    import cupy as cp
    import numpy as np

    from bench.model import _build, decode_rows, shape_config
    from bench.shapes import resolve
    from ninfer.models.qwen3_5.random_params import random_parameters

    cfg, _, _ = shape_config(resolve(shape_name), context + 1)
    params = random_parameters(cfg, xp=cp, seed=1)
    device, backend = _build(cfg, params, max(batches), context, prefill_chunk=64)
    rng = np.random.default_rng(0)
    for b in batches:
        with decode_rows(backend, cfg, b, context, rng), device.activate():
            for _ in range(2):
                backend._decode_body(b)  # warm-up
            device.synchronize()
            cp.cuda.profiler.start()
            backend._decode_body(b)
            device.synchronize()
            cp.cuda.profiler.stop()
        print(f"# profiled B={b}", file=sys.stderr)


def kernel_times(path: str) -> list[tuple[str, float]]:
    """(kernel name without its parameter list, ns) of every gpu__time_duration.sum row of an
    `ncu --csv` log, in launch order."""
    text = Path(path).read_text()
    start = text.find('"ID"')
    out = []
    for r in csv.DictReader(io.StringIO(text[start:])):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        ns = float(r["Metric Value"].replace(",", ""))
        ns *= {"nsecond": 1, "usecond": 1e3, "msecond": 1e6}.get(r.get("Metric Unit", ""), 1)
        out.append((r["Kernel Name"].split("(")[0][:60], ns))
    return out


def summarize(path: str, labels: list[str] | None = None) -> None:
    """Per kernel name: total time, share and launch count; one table per label (the launches
    split into len(labels) equal consecutive parts: one profiled step each)."""
    times = kernel_times(path)
    labels = labels or ["all steps"]
    per = len(times) // len(labels) if len(times) % len(labels) == 0 else None
    if per is None:
        print(f"# {len(times)} launches do not split into {len(labels)} equal steps: one table")
        labels, per = ["all steps"], len(times)
    for i, label in enumerate(labels):
        by_name = collections.defaultdict(lambda: [0, 0.0])
        for name, ns in times[i * per:(i + 1) * per]:
            by_name[name][0] += 1
            by_name[name][1] += ns
        total = sum(v[1] for v in by_name.values())
        print(f"{label}: kernels {per}, total {total / 1e3:.1f} us")
        for name, (count, ns) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:25]:
            print(f"{ns / 1e3:10.1f} us {100 * ns / max(total, 1e-9):5.1f}% x{count:4d} "
                  f"{ns / 1e3 / count:8.2f}  {name}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="9b")
    ap.add_argument("--batch", default=None, help="batch sizes, e.g. 1,8 (profile: default 1)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--summarize")
    a = ap.parse_args()
    if a.summarize:
        summarize(a.summarize, [f"B={b}" for b in a.batch.split(",")] if a.batch else None)
    else:
        profile(a.shape, [int(b) for b in (a.batch or "1").split(",")], a.context)
