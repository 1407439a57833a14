"""One decode paged_attention case for Nsight Compute (GPU): warm-up launches, then `--launches`
launches inside cudaProfilerStart/Stop, each over its own copy of the K/V pages (no L2 reuse).

    ncu --profile-from-start off --clock-control none --section SpeedOfLight \
        --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
        python3 bench/profile_attention.py --shape 9b --batch 1 --context 32768

Prints the minimum bytes the launch must move (K and V of every attended key, q and out).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="9b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--launches", type=int, default=2)
    args = ap.parse_args()

    import cupy as cp

    from bench.kernel_cases import DecodeAttention
    from bench.shapes import resolve

    s, b, ctx = resolve(args.shape), args.batch, args.context
    copies = args.launches + 2
    case = DecodeAttention.build(cp, s, b, ctx, copies)
    call = case.call

    for c in range(2):
        call(c)
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.profiler.start()
    for c in range(2, copies):
        call(c)
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.profiler.stop()
    print(f"# {args.shape} B={b} ctx={ctx}: {case.bytes / 1e6:.1f} MB per launch", file=sys.stderr)


if __name__ == "__main__":
    main()
