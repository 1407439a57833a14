"""`ninfer inspect ART [--json]`: what an artifact holds (no digest check; see `verify`)."""
from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "inspect", help="show architecture, parameters, objects and resources of an artifact",
        description="Print architecture, name, parameter count, bytes per dtype, config "
                    "summary, bindings, frontend resources and the objects table.")
    p.add_argument("artifact", metavar="ART", help=".ninfer file")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from tools.artifact.inspect import format_summary, summarize

    summary = summarize(args.artifact)
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0
