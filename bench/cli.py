"""`ninfer-bench`: kernel microbenchmarks (and, later, whole-model decode/prefill/serving runs).

    ninfer-bench kernels [--op NAME ...] [--shape qwen3.5-0.8b|9b|27b|35b-a3b] [--json OUT]

Errors are one line on stderr with exit code 2 (no traceback); a failing benchmark case is
reported and the others still run (exit code 1).
"""
from __future__ import annotations

import argparse
import sys

from bench.kernel_cases import CASES
from bench.shapes import SHAPES, resolve


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ninfer-bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    k = sub.add_parser("kernels", help="time each CUDA kernel against the measured ceilings")
    k.add_argument("--op", nargs="+", choices=sorted(CASES), default=None, metavar="NAME",
                   help=f"ops to run (default: all): {', '.join(sorted(CASES))}")
    k.add_argument("--shape", default="qwen3.5-9b",
                   help=f"model shape: {', '.join(SHAPES)} or 0.8b/9b/27b/35b-a3b")
    k.add_argument("--json", metavar="OUT", help="write machine-readable results here")
    k.add_argument("--repeat", type=int, default=20, help="timed repeats per case (median)")
    k.add_argument("--seed", type=int, default=0)
    for name, text in (("decode", "whole-model decode tokens/s at a shape (--batch 1,8)"),
                       ("prefill", "whole-model prefill at a shape (--tokens 8192)"),
                       ("serve-sim", "simulated serving load")):
        sub.add_parser(name, help=f"{text} [not implemented yet]")
    return parser


def main(argv: list[str] | None = None) -> int:
    args, extra = _parser().parse_known_args(argv)
    if args.command == "kernels" and extra:
        print(f"ninfer-bench: error: unrecognized arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    if args.command != "kernels":
        print(f"ninfer-bench {args.command}: not implemented yet", file=sys.stderr)
        return 2
    try:
        shape = resolve(args.shape)
        if args.repeat < 1:
            raise ValueError("--repeat must be >= 1")
        from bench.kernels import run

        return run(shape, args.op or list(CASES), args.json, args.repeat, args.seed)
    except (ValueError, OSError, ImportError) as exc:
        print(f"ninfer-bench: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # e.g. no CUDA device: one line, not a traceback
        print(f"ninfer-bench: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
