"""Bitwise comparison of the decode paged_attention across two checkouts (GPU).

    python3 -m bench.attn_bits --save A.npz            # in tree A
    python3 -m bench.attn_bits --compare A.npz         # in tree B: every output bitwise equal?

The inputs are drawn from fixed seeds on the host, so both trees see the same values: per case
(query heads, KV heads, head dim, page type) decode rows whose lengths put the row's own key at
every place of a tile and a chunk, over 1..9000 keys, in split and in loop mode, with and without
the output gate (and, where the tree's launcher has it, with past_kv_ready). A refactor of the
kernel that claims to keep the bits is checked against the tree before it with this.
"""
from __future__ import annotations

import argparse
import inspect
import sys

import numpy as np

CASES = ((4, 4, 64, True), (8, 4, 128, False), (6, 2, 256, True), (16, 4, 256, True),
         (10, 2, 64, True), (12, 2, 128, False), (16, 2, 256, True), (16, 2, 256, False),
         (24, 4, 256, True), (8, 2, 256, True))
LENGTHS = (1, 2, 7, 8, 9, 16, 17, 31, 32, 33, 63, 64, 65, 96, 127, 129, 1025, 4097, 9000)
PAGE = 16


def _outputs() -> dict[str, np.ndarray]:
    import cupy as cp

    from ninfer.core.dtypes import f32_to_bf16_bits
    from ninfer.kernels_cuda import attention as katt

    katt.TMA, katt.MMA = False, False  # the default FMA kernel (the env defaults of decode)
    early = "past_kv_ready" in inspect.signature(katt.paged_attention).parameters
    out = {}
    for ci, (heads, hkv, d, bf16) in enumerate(CASES):
        rng = np.random.default_rng(1000 + ci)
        pages = sum(-(-n // PAGE) for n in LENGTHS) + 2
        kp, vp = (rng.standard_normal((pages, hkv, PAGE, d), dtype=np.float32)
                  for _ in range(2))
        if bf16:
            kp, vp = f32_to_bf16_bits(kp), f32_to_bf16_bits(vp)
        cols = -(-max(LENGTHS) // PAGE)
        bt = np.full((len(LENGTHS), cols), -1, np.int32)
        perm, used = rng.permutation(pages), 0
        for s, n in enumerate(LENGTHS):
            bt[s, :-(-n // PAGE)] = perm[used:used + -(-n // PAGE)]
            used += -(-n // PAGE)
        rows = len(LENGTHS)
        q = cp.asarray(2 * rng.standard_normal((rows, heads, d), dtype=np.float32))
        gate = cp.asarray(rng.standard_normal((rows, heads, 2 * d), dtype=np.float32))[:, :, d:]
        seq = cp.arange(rows, dtype=cp.int32)
        pos = cp.asarray(np.array(LENGTHS, np.int32) - 1)
        kp_d, vp_d, bt_d = cp.asarray(kp), cp.asarray(vp), cp.asarray(bt)
        ws = katt.AttentionWorkspace.allocate(rows, heads, d, cols * PAGE)
        for split in (True, False):
            katt.SPLIT_MAX_ROWS = 64 if split else 0
            for g in (None, gate):
                for ready in ((False, True) if early else (False,)):
                    o = cp.full((rows, heads, d), np.nan, np.float32)
                    kw = {"past_kv_ready": True} if ready else {}
                    katt.paged_attention(q, kp_d, vp_d, bt_d, seq, pos, d ** -0.5, o,
                                         workspace=ws if split else None, gate=g, **kw)
                    key = f"h{heads}_kv{hkv}_d{d}_{'bf16' if bf16 else 'f32'}_" \
                          f"{'split' if split else 'loop'}_{'gate' if g is not None else 'plain'}"
                    out[key + ("_early" if ready else "")] = cp.asnumpy(o)
    katt.SPLIT_MAX_ROWS = 64
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attn_bits")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--save", help="write this tree's outputs to an .npz")
    mode.add_argument("--compare", help="compare this tree's outputs with an .npz")
    args = parser.parse_args(argv)
    got = _outputs()
    if args.save:
        np.savez(args.save, **got)
        print(f"attn_bits: {len(got)} outputs saved to {args.save}")
        return 0
    ref = dict(np.load(args.compare))
    bad = 0
    for key, value in got.items():
        base = ref.get(key.removesuffix("_early"))
        if base is None:
            print(f"attn_bits: {key}: not in {args.compare}")
            bad += 1
        elif not np.array_equal(value.view(np.uint32), base.view(np.uint32)):
            diff = np.count_nonzero(value.view(np.uint32) != base.view(np.uint32))
            print(f"attn_bits: {key}: {diff} of {value.size} elements differ")
            bad += 1
    print(f"attn_bits: {len(got)} outputs compared, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
