"""`ninfer verify ART`: recompute every object's SHA-256; exit 1 naming the first bad object."""
from __future__ import annotations

import argparse
import sys


def register(subparsers) -> None:
    from ninfer.cli.main import add_progress_argument

    p = subparsers.add_parser(
        "verify", help="check every object of a .ninfer artifact against its SHA-256",
        description="Recompute the SHA-256 of every object in the artifact. Exits 0 if all "
                    "match, 1 naming the first object that does not (or if the file is "
                    "malformed).")
    p.add_argument("artifact", metavar="ART", help=".ninfer file")
    add_progress_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ninfer.cli.main import progress_mode
    from ninfer.errors import ArtifactError
    from tools.artifact.verify import verify_artifact

    try:
        count, nbytes = verify_artifact(args.artifact, progress=progress_mode(args))
    except ArtifactError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"ok: {count} objects, {nbytes:,} bytes verified")
    return 0
