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
    d = sub.add_parser("decode", help="whole-model decode tokens/s at a shape (random weights)")
    d.add_argument("--shape", default="qwen3.5-9b")
    d.add_argument("--batch", default="1,8", help="comma-separated batch sizes")
    d.add_argument("--context", type=int, default=1024, help="tokens already in each sequence")
    d.add_argument("--repeat", type=int, default=30)
    d.add_argument("--hf", action="store_true", help="also time transformers on the shape")
    d.add_argument("--json", metavar="OUT")
    p = sub.add_parser("prefill", help="whole-model prefill at a shape (random weights)")
    p.add_argument("--shape", default="qwen3.5-9b")
    p.add_argument("--tokens", type=int, default=8192)
    p.add_argument("--chunk", type=int, default=2048, help="prefill chunk size")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--eager", action="store_true",
                   help="launch every chunk's kernels (no prefill graph), for comparison")
    p.add_argument("--hf", action="store_true", help="also time transformers on the shape")
    p.add_argument("--json", metavar="OUT")
    c = sub.add_parser("cpu", help="whole-model decode/prefill on the CPU backend")
    c.add_argument("--model", default="demo", choices=("demo", "0.8b"))
    c.add_argument("--prompt", type=int, default=256, help="prompt tokens to prefill")
    c.add_argument("--decode", type=int, default=32, help="decode steps to time")
    c.add_argument("--json", metavar="OUT")
    v = sub.add_parser("serve-sim", help="simulated serving through the Engine on the GPU")
    v.add_argument("--shape", default="qwen3.5-9b")
    v.add_argument("--concurrency", default="1,4,8", help="comma-separated levels in 1..8")
    v.add_argument("--prompt", type=int, default=1024)
    v.add_argument("--output", type=int, default=256)
    v.add_argument("--prefill-chunk", type=int, default=None,
                   help="prompt tokens per prefill step (default: the engine's CUDA default)")
    v.add_argument("--rounds", type=int, default=1,
                   help="run the sweep this many times, levels interleaved; report medians")
    v.add_argument("--json", metavar="OUT")
    return parser


def main(argv: list[str] | None = None) -> int:
    args, extra = _parser().parse_known_args(argv)
    if args.command == "kernels" and extra:
        print(f"ninfer-bench: error: unrecognized arguments: {' '.join(extra)}", file=sys.stderr)
        return 2
    if args.command == "cpu":
        if extra or args.prompt < 1 or args.decode < 1:
            print("ninfer-bench: error: cpu takes --prompt >= 1 and --decode >= 1",
                  file=sys.stderr)
            return 2
        from bench.cpu_model import run_cpu

        return run_cpu(args.model, args.prompt, args.decode, args.json)
    if args.command in ("decode", "prefill", "serve-sim"):
        if extra:
            print(f"ninfer-bench: error: unrecognized arguments: {' '.join(extra)}",
                  file=sys.stderr)
            return 2
        return _model_bench(args)
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


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _model_bench(args) -> int:
    try:
        shape = resolve(args.shape)
        from bench import model

        if args.command == "serve-sim":
            levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
            if not levels or min(levels) < 1 or max(levels) > 8:
                raise ValueError("--concurrency takes levels in 1..8")
            if args.prompt < 1 or args.output < 2:
                raise ValueError("--prompt must be >= 1 and --output >= 2")
            if args.prefill_chunk is not None and args.prefill_chunk < 1:
                raise ValueError("--prefill-chunk must be >= 1")
            if args.rounds < 1:
                raise ValueError("--rounds must be >= 1")
            from bench.serve_sim import run_serve_sim

            return run_serve_sim(shape, levels, args.prompt, args.output, args.json,
                                 args.prefill_chunk, args.rounds)
        if args.command == "decode":
            batches = [int(b) for b in args.batch.split(",") if b.strip()]
            if not batches or min(batches) < 1 or max(batches) > 8:
                raise ValueError("--batch takes sizes in 1..8")
            return model.run_decode(shape, batches, args.context, args.repeat, args.hf,
                                    args.json)
        if args.tokens < 1 or args.chunk < 1:
            raise ValueError("--tokens and --chunk must be >= 1")
        return model.run_prefill(shape, args.tokens, args.chunk, args.repeat, args.hf, args.json,
                                 eager=args.eager)
    except (ValueError, OSError, ImportError) as exc:
        print(f"ninfer-bench: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:  # e.g. no CUDA device: one line, not a traceback
        print(f"ninfer-bench: error: {type(exc).__name__}: {_one_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
