"""Decode-step kernel breakdown (GPU): run under Nsight Compute, one eager decode step per B.

    ncu --profile-from-start off --metrics gpu__time_duration.sum --csv \
        python3 bench/profile_decode.py --shape 9b --batch 1,8 > prof.csv
    python3 bench/profile_decode.py --summarize prof.csv

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


def summarize(path: str) -> None:
    text = Path(path).read_text()
    start = text.find('"ID"')
    rows = list(csv.DictReader(io.StringIO(text[start:])))
    by_name = collections.defaultdict(lambda: [0, 0.0])
    total = 0.0
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        ns = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "nsecond")
        ns *= {"nsecond": 1, "usecond": 1e3, "msecond": 1e6}.get(unit, 1)
        name = r["Kernel Name"].split("(")[0][:60]
        by_name[name][0] += 1
        by_name[name][1] += ns
        total += ns
    print(f"kernels: {sum(v[0] for v in by_name.values())}, total {total / 1e3:.1f} us")
    for name, (count, ns) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:25]:
        print(f"{ns / 1e3:10.1f} us {100 * ns / total:5.1f}% x{count:4d}  {name}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="9b")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--summarize")
    a = ap.parse_args()
    if a.summarize:
        summarize(a.summarize)
    else:
        profile(a.shape, [int(b) for b in a.batch.split(",")], a.context)
