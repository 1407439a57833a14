"""`ninfer` command line. Each subcommand lives in `ninfer/cli/cmd_<name>.py` and exposes
`register(subparsers)`, which adds its parser and sets `func(args) -> int`.

Command modules import only argparse at module level (heavy imports happen inside `func`), so
`ninfer --help` stays fast and never loads NumPy, Numba or torch. Errors derived from
`NinferError` print `error: <message>` and exit 2; unexpected exceptions print one line and exit
1 (`--debug` shows the traceback).
"""
from __future__ import annotations

import argparse
import importlib
import sys
import warnings

# Adding a command is one line here plus its module.
COMMANDS = ("convert", "verify", "inspect", "generate", "serve")

_PROGRESS_MODES = {"auto": True, "always": "force", "never": False}


def add_progress_argument(parser: argparse.ArgumentParser) -> None:
    """`--progress {auto,always,never}` -> `args.progress` in the tri-state the library takes."""
    parser.add_argument("--progress", choices=tuple(_PROGRESS_MODES), default="auto",
                        help="progress bar on stderr (auto: only on a terminal)")


def progress_mode(args: argparse.Namespace):
    return _PROGRESS_MODES[args.progress]


def build_parser() -> argparse.ArgumentParser:
    from ninfer import __version__

    parser = argparse.ArgumentParser(
        prog="ninfer", description="Inference runtime for the Qwen3.5 family.")
    parser.add_argument("--version", action="version", version=f"ninfer {__version__}")
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of internal errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"ninfer.cli.cmd_{name}").register(sub)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.showwarning = _show_warning
    from ninfer.errors import NinferError

    try:
        return int(args.func(args) or 0)
    except NinferError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `ninfer inspect ART | head`: stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:
        if args.debug:
            raise
        where = f": {exc.filename}" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1
    except Exception as exc:  # never a bare traceback for a CLI user
        if args.debug:
            raise
        print(f"error: internal error ({type(exc).__name__}: {exc}); rerun with --debug for "
              f"the traceback", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
