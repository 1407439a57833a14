"""What each kind of launch costs inside the decode graph: `ninfer-bench decode` with chosen ops
replaced by no-ops (their outputs are left stale, so the logits are garbage: timing only).

    python3 -m bench.probe_skip --skip norm,sigmoid_mul -- decode --shape 9b --batch 1,8

The step time saved by skipping an op kind is an upper bound on what fusing those launches
away can gain (the fused kernel still has to do the op's work).
"""
from __future__ import annotations

import argparse
import sys

from ninfer import ops

GROUPS = {
    "norm": ("rms_norm", "add_rms_norm"),
    "sigmoid_mul": ("sigmoid_mul",),
    "gdn_decode": ("gdn_decode_fused",),
    "attn_prep": ("attn_prep",),
    "attention": ("paged_attention",),
    "add": ("add_inplace",),
    "moe": ("moe_block",),
    # with routing first, skip it only together with "moe" (the expert stages read its tables)
    "moe_route": ("moe_route",),
    "swiglu_linear": ("linear_swiglu",),  # the dense MLPs' gate_up, or MoE's shared expert
}


def _skip(names: list[str]) -> None:
    for group in names:
        if group not in GROUPS:
            raise SystemExit(f"probe_skip: unknown group {group!r} (have {', '.join(GROUPS)})")
        for op in GROUPS[group]:
            setattr(ops, op, lambda *args, **kwargs: None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="probe_skip")
    parser.add_argument("--skip", required=True, help=f"comma-separated: {', '.join(GROUPS)}")
    parser.add_argument("bench_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    _skip([g for g in args.skip.split(",") if g])
    from bench.cli import main as bench_main

    rest = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args
    return bench_main(rest)


if __name__ == "__main__":
    sys.exit(main())
