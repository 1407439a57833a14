"""Time the CPU `linear` kernel at Qwen3.5-0.8B shapes and print the bandwidth it achieves.

    python -m bench.cpu_ops [--rows 1 64] [--dtype bf16 f32] [--repeat 5] [--no-lm-head]

Decode (1 row) is bound by streaming the weights, so GB/s (weight bytes / time) is the number to
compare with the machine's memory bandwidth; prefill rows reuse each weight row, so GMAC/s is the
number there. The first call per dtype compiles (or loads Numba's cache) and is not timed.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from ninfer.core.dtypes import DType, f32_to_bf16_bits
from ninfer.core.tensor import Weight
from ninfer.ops import linear

HIDDEN = 1024
# (name, M, K) per layer of Qwen3.5-0.8B (fused projections as the model binds them), and lm_head.
SHAPES = (
    ("gdn in_proj [qkv|z|b|a]", 6144 + 2048 + 16 + 16, HIDDEN),
    ("gdn out_proj", HIDDEN, 2048),
    ("attn qkv [q+gate|k|v]", 4096 + 512 + 512, HIDDEN),
    ("attn o_proj", HIDDEN, 2048),
    ("mlp gate_up", 2 * 3584, HIDDEN),
    ("mlp down", HIDDEN, 3584),
)
LM_HEAD = ("lm_head (tied)", 248320, HIDDEN)


def _weight(rng: np.random.Generator, m: int, k: int, dtype: DType) -> Weight:
    values = rng.standard_normal((m, k), dtype=np.float32) * 0.02
    if dtype is DType.BFLOAT16:
        return Weight(f32_to_bf16_bits(values), dtype)
    return Weight(values, dtype)


def _time(x, w, out, repeat: int) -> float:
    linear(x, w, out)  # compile / warm caches
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        linear(x, w, out)
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--dtype", nargs="+", default=["bf16", "f32"])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-lm-head", action="store_true", help="skip the 248320-row lm_head")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    shapes = SHAPES if args.no_lm_head else SHAPES + (LM_HEAD,)
    print(f"{'shape':26s} {'dtype':9s} {'rows':>4s} {'ms':>9s} {'GB/s':>7s} {'GMAC/s':>7s}")
    for name in args.dtype:
        dtype = DType.parse(name)
        for label, m, k in shapes:
            w = _weight(rng, m, k, dtype)
            for n in args.rows:
                x = rng.standard_normal((n, k), dtype=np.float32)
                out = np.empty((n, m), np.float32)
                sec = _time(x, w, out, args.repeat)
                print(f"{label:26s} {dtype.value:9s} {n:4d} {sec * 1e3:9.3f} "
                      f"{w.nbytes / sec / 1e9:7.1f} {n * m * k / sec / 1e9:7.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
