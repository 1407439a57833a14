"""`ninfer serve [ARTIFACT | --demo]`: the OpenAI-compatible HTTP server (see docs/server.md).

The server listens at once and loads the model on a background thread (/health answers 503
until it is ready); it prints the URL, then the capacity plan when the model is ready.
Ctrl-C or SIGTERM ends every request and shuts down cleanly.
"""
from __future__ import annotations

import argparse
import sys

DEMO_DEFAULT_MAX_TOKENS = 256  # the demo model is random: never run to its 32k context


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve an artifact (or the embedded demo model) over HTTP: /v1/chat/"
                    "completions, /v1/completions, /v1/models, /tokenize, /detokenize, "
                    "/health, /metrics, /openapi.json. See docs/server.md.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("artifact", nargs="?", metavar="ARTIFACT", help=".ninfer artifact")
    source.add_argument("--demo", action="store_true",
                        help="serve the embedded demo model (built on first use)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: CUDA when usable by the model, else CPU")
    p.add_argument("--max-concurrency", type=_positive_int, default=4,
                   help="requests running at once (1..8, default 4)")
    p.add_argument("--max-queue", type=_non_negative_int, default=32,
                   help="requests waiting beyond those; more get 429 (default 32)")
    key = p.add_mutually_exclusive_group()
    key.add_argument("--api-key", help="require 'Authorization: Bearer KEY' (not /health)")
    key.add_argument("--api-key-file", metavar="FILE", help="read the API key from FILE")
    p.add_argument("--model-id", help="public model name (default: the artifact's name)")
    p.add_argument("--max-request-bytes", type=_positive_int, default=4 << 20,
                   help="largest request body in bytes (default 4 MiB); larger gets 413")
    p.add_argument("--chat-template", metavar="FILE", help="chat template overriding the "
                   "artifact's")
    p.add_argument("--max-context-len", type=_positive_int,
                   help="context limit (prompt + output) per request (default: the model's)")
    p.add_argument("--default-max-tokens", type=_positive_int,
                   help="output budget when a request gives no max_tokens (default: up to the "
                        f"context limit; {DEMO_DEFAULT_MAX_TOKENS} with --demo)")
    p.add_argument("--timeout-s", type=_positive_float,
                   help="deadline of each request, queue time included (default: none)")
    p.add_argument("--threads", type=_positive_int,
                   help="HTTP worker threads (default: max-concurrency + max-queue + 4)")
    p.add_argument("--log-level", default="info",
                   choices=("debug", "info", "warning", "error"), help="default info")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the artifact's SHA-256 check at load")
    p.add_argument("--scripted-program", metavar="FILE", help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def _read_text(path: str, what: str) -> str:
    from ninfer.errors import InvalidInput

    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise InvalidInput(f"cannot read the {what} {path}: {exc.strerror}") from None


def _api_key(args: argparse.Namespace) -> str | None:
    from ninfer.errors import InvalidInput

    key = args.api_key
    if args.api_key_file is not None:
        key = _read_text(args.api_key_file, "API key file").strip()
    if key is not None and not key:
        raise InvalidInput("the API key is empty")
    return key


def run(args: argparse.Namespace) -> int:
    import logging
    from pathlib import Path

    from ninfer.errors import InvalidInput
    from ninfer.serve import (
        EngineOptions, LoadOptions, ModelHost, ServerConfig, create_app, create_server,
        make_loader, run_server, server_url,
    )

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.artifact is not None and not Path(args.artifact).is_file():
        raise InvalidInput(f"no such artifact file: {args.artifact}")
    if not 1 <= args.max_concurrency <= 8:
        raise InvalidInput(f"--max-concurrency must be in 1..8, got {args.max_concurrency}")
    if not 0 <= args.port <= 65535:
        raise InvalidInput(f"--port must be in 0..65535, got {args.port}")
    template = _read_text(args.chat_template, "chat template") if args.chat_template else None
    default_max_tokens = args.default_max_tokens or (DEMO_DEFAULT_MAX_TOKENS if args.demo
                                                     else None)
    config = ServerConfig(api_key=_api_key(args), max_request_bytes=args.max_request_bytes,
                          default_max_tokens=default_max_tokens, timeout_s=args.timeout_s)
    loader = make_loader(LoadOptions(
        artifact=args.artifact, device=args.device, max_concurrency=args.max_concurrency,
        max_context_len=args.max_context_len, chat_template=template,
        verify=not args.no_verify, scripted_program=args.scripted_program))

    def on_ready(loaded, served) -> None:
        print(f"ready: model {served.model_id!r}; {loaded.description}; "
              f"{args.max_concurrency} concurrent + {args.max_queue} queued requests",
              flush=True)

    def on_failed(exc: BaseException) -> None:
        print(f"error: the model failed to load: {exc}; /health reports it", file=sys.stderr,
              flush=True)

    host = ModelHost(EngineOptions(args.max_concurrency, args.max_queue, None),
                     model_id=args.model_id, on_ready=on_ready, on_failed=on_failed)
    app, _ = create_app(host, config)
    threads = args.threads or args.max_concurrency + args.max_queue + 4
    server = create_server(app, host=args.host, port=args.port, threads=threads,
                           max_request_bytes=args.max_request_bytes)

    what = "the demo model" if args.demo else args.artifact
    print(f"ninfer serve: listening on {server_url(server)} (loading {what}; /health is 503 "
          "until ready)", flush=True)
    host.start(loader)
    run_server(server, host)
    print("ninfer serve: stopped", flush=True)
    return 0
