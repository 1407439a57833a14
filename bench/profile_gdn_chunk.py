"""Run the chunked GDN prefill (or FLA's chunk_gated_delta_rule) a few times at one shape, for an
Nsight Compute per-kernel breakdown (the benchmark CLI interleaves several variants and peers):

    ncu --metrics gpu__time_duration.sum --csv python3 bench/profile_gdn_chunk.py [--fla]
        [--local pair|local16]

Shape: one T-token segment, Hk = 16, Hv = 32, dk = dv = 128 (Qwen3.5 9B / 35B-A3B).
"""
from __future__ import annotations

import argparse


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--precision", default="bf16", choices=("bf16", "tf32x3"))
    ap.add_argument("--cols", type=int, default=None, help="bf16_cols (None: the default)")
    ap.add_argument("--local", choices=("pair", "local16"), default=None,
                    help="the bf16-tile path's local kernel (None: NINFER_GDN_CHUNK_LOCAL_PAIR)")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--fla", action="store_true", help="FLA's Triton kernels instead")
    args = ap.parse_args()
    hk, hv, d = 16, 32, 128
    if args.fla:
        from bench import peers

        run, _ = peers.fla_chunk(args.tokens, hk, hv, d, d)
        for i in range(args.iters):
            run(i)
        return
    import cupy as cp
    import numpy as np

    from bench.harness import f32_random
    from ninfer.kernels_cuda.gdn_chunk import ChunkWorkspace, Precision, gdn_chunk_prefill

    t = args.tokens
    q, k = f32_random(cp, (t, hk, d), d ** -1.0), f32_random(cp, (t, hk, d), d ** -0.5)
    v = f32_random(cp, (t, hv, d))
    g = -cp.random.random_sample((t, hv), dtype=cp.float32) * 0.1
    beta = cp.random.random_sample((t, hv), dtype=cp.float32)
    state = f32_random(cp, (1, hv, d, d), 0.01)
    starts = cp.asarray(np.array([0, t], np.int32))
    slots = cp.zeros(1, dtype=cp.int32)
    out = cp.empty_like(v)
    ws = ChunkWorkspace.allocate(t, 1, hv, bf16_tiles=True)
    for _ in range(args.iters):
        gdn_chunk_prefill(q, k, v, g, beta, state, starts, slots, out, workspace=ws,
                          precision=Precision(args.precision), bf16_cols=args.cols,
                          local_pair=None if args.local is None else args.local == "pair")
    cp.cuda.get_current_stream().synchronize()


if __name__ == "__main__":
    main()
