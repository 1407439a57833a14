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

    from bench.harness import bf16_random, f32_random
    from bench.kernel_cases import PAGE, paged_attention_bytes
    from bench.shapes import resolve
    from ninfer.kernels_cuda import attention as katt

    s, b, ctx = resolve(args.shape), args.batch, args.context
    copies = args.launches + 2
    pages_per_seq = -(-ctx // PAGE)
    num_pages = copies * b * pages_per_seq
    kp = bf16_random(cp, (num_pages, s.kv_heads, PAGE, s.head_dim), 1.0)
    vp = bf16_random(cp, (num_pages, s.kv_heads, PAGE, s.head_dim), 1.0)
    bt = cp.arange(num_pages, dtype=cp.int32).reshape(copies * b, pages_per_seq)
    pos = cp.full(b, ctx - 1, dtype=cp.int32)
    q = f32_random(cp, (b, s.heads, s.head_dim))
    o = cp.empty_like(q)
    ws = katt.AttentionWorkspace.allocate(b, s.heads, s.head_dim, ctx)

    def call(c: int) -> None:
        seqs = cp.arange(c * b, (c + 1) * b, dtype=cp.int32)
        katt.paged_attention(q, kp, vp, bt, seqs, pos, s.head_dim ** -0.5, o, workspace=ws)

    for c in range(2):
        call(c)
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.profiler.start()
    for c in range(2, copies):
        call(c)
    cp.cuda.runtime.deviceSynchronize()
    cp.cuda.profiler.stop()
    need = paged_attention_bytes([ctx] * b, s.heads, s.kv_heads, s.head_dim, 2)
    print(f"# {args.shape} B={b} ctx={ctx}: {need / 1e6:.1f} MB per launch", file=sys.stderr)


if __name__ == "__main__":
    main()
