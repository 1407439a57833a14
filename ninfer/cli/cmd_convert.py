"""`ninfer convert HF_DIR OUT.ninfer`: HF Qwen3.5 checkpoint -> .ninfer artifact."""
from __future__ import annotations

import argparse


def register(subparsers) -> None:
    from ninfer.cli.main import add_progress_argument

    p = subparsers.add_parser(
        "convert", help="convert an HF Qwen3.5 checkpoint directory to a .ninfer artifact",
        description="Convert an HF Qwen3.5 checkpoint (config.json, *.safetensors, tokenizer "
                    "files) into one .ninfer artifact. Writes atomically: on error no output "
                    "file is left behind.")
    p.add_argument("hf_dir", metavar="HF_DIR", help="checkpoint directory")
    p.add_argument("out", metavar="OUT.ninfer", help="artifact to write")
    p.add_argument("--dtype", choices=("keep", "bf16", "fp32"), default="keep",
                   help="weight dtype: keep as stored, or convert (bf16 rounds to nearest even)")
    p.add_argument("--name", help="public model name (metadata.name; default: architecture)")
    add_progress_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import os

    from ninfer.cli.main import progress_mode
    from tools.convert import convert_checkpoint

    path = convert_checkpoint(args.hf_dir, args.out, dtype=args.dtype, name=args.name,
                              progress=progress_mode(args))
    print(f"wrote {path} ({os.path.getsize(path):,} bytes)")
    return 0
