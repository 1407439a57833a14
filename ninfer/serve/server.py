"""Serving a Falcon app with waitress, with a clean shutdown on SIGINT / SIGTERM.

`run_server` binds at once (port 0 picks a free port), reports the URL through `on_listen`,
and serves until a signal: the handler first ends every engine request (`ModelHost
.begin_shutdown`, so open streams finish with an error event instead of hanging), then stops
waitress's loop; waitress waits up to 5 s for its worker threads, and the host is closed (engine
worker joined, model released).

waitress settings that matter:
- `threads`: one per concurrently handled request; streams hold theirs until they end. Sized
  by the caller to the engine's outstanding limit plus a few for cheap routes, so overload is
  decided by the engine (429), not by a thread queue.
- `channel_request_lookahead=1`: the channel keeps reading while a request runs, so a client
  that closes its connection is noticed (``waitress.client_disconnected``) even while its
  request waits for the engine and nothing is being written.
- `max_request_body_size`: a hard cap at twice the app's own limit. Bodies up to it reach the
  app, which answers 413 with a JSON error above its limit; waitress refuses larger ones
  itself (plain-text 413) so it never buffers an unbounded body.
"""
from __future__ import annotations

import logging
import signal
import threading
import waitress

from ninfer.serve.lifecycle import ModelHost

__all__ = ["create_server", "run_server", "server_url"]

_log = logging.getLogger("ninfer.serve")


def create_server(app, *, host: str, port: int, threads: int, max_request_bytes: int):
    """A bound (listening) waitress server for `app`; `.effective_port` is the real port."""
    logging.getLogger("waitress.queue").setLevel(logging.ERROR)  # the engine reports load
    return waitress.create_server(
        app, host=host, port=port, threads=threads, ident="ninfer",
        channel_request_lookahead=1, max_request_body_size=2 * max_request_bytes,
        clear_untrusted_proxy_headers=True, connection_limit=max(100, 4 * threads),
    )


def server_url(server) -> str:
    host = server.effective_host
    return f"http://{f'[{host}]' if ':' in host else host}:{server.effective_port}"


def run_server(server, model_host: ModelHost) -> None:
    """Serve until SIGINT/SIGTERM (main thread only), then shut everything down."""

    stopping = threading.Event()

    def stop(signum, frame) -> None:
        if stopping.is_set():  # a repeated signal (e.g. also sent by a wrapper): already on it
            return
        stopping.set()
        _log.info("received %s; shutting down", signal.Signals(signum).name)
        model_host.begin_shutdown()
        raise KeyboardInterrupt  # ends waitress's loop (it catches this and shuts down)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, stop)
    try:
        server.run()  # returns after waitress has shut its task threads down
    finally:
        stopping.set()  # signals during the cleanup below are ignored, not raised
        model_host.close()
        server.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
