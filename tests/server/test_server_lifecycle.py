"""Start-up and shutdown of the ``ninfer serve`` process: it listens before the model is
loaded (/health 503 "loading"), prints the URL and the capacity plan, reports a failed load on
/health, refuses a missing artifact at once, and on SIGTERM ends open streams with an error
event and exits 0."""
from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse

from .server_process import ServerProcess


def test_missing_artifact_is_refused_at_once(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "ninfer.cli.main", "serve",
                           str(tmp_path / "nope.ninfer")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error: no such artifact file")
    assert "Traceback" not in proc.stderr


def test_failed_load_is_reported_by_health():
    server = ServerProcess("--demo", "--device", "cuda")  # this machine runs the CPU backend
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.proc.poll() is None, server.output()
            if server.url is not None:
                status, body = server.health()
                if body["status"] == "failed":
                    break
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.3)
        assert status == 503 and "cuda" in body["reason"]
        assert body["error"]["code"] == "load_failed"
        # the report precedes the state change, but our reader thread may lag behind the pipe
        line_deadline = time.monotonic() + 10
        while ("error: the model failed to load" not in server.output()
               and time.monotonic() < line_deadline):
            time.sleep(0.05)
        assert "error: the model failed to load" in server.output()
    finally:
        assert server.stop() == 0


def test_loading_then_ready_then_sigterm_ends_open_streams():
    server = ServerProcess("--demo", "--max-context-len", "256", "--max-concurrency", "1",
                           "--max-queue", "0")
    try:
        assert server._url_found.wait(120), server.output()
        status, body = server.health()
        assert (status, body["status"]) == (503, "loading")  # the warm-up alone takes seconds
        server.wait_ready(600)
        out = server.output()
        assert "listening on http://127.0.0.1:" in out and "capacity:" in out
        assert "1 concurrent + 0 queued requests" in out

        url = urllib.parse.urlsplit(server.url)
        sock = socket.create_connection((url.hostname, url.port), timeout=120)
        body = json.dumps({"prompt": "Once", "max_tokens": 200, "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(body), body))
        received = b""
        while b"data: " not in received:
            received += sock.recv(65536)
        server.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        while not received.endswith(b"0\r\n\r\n"):  # the chunked response's end
            data = sock.recv(65536)
            if not data:
                break
            received += data
        sock.close()
        events = re.findall(rb"data: (.*?)\n\n", received)  # one SSE event per HTTP chunk
        assert events[-1] == b"[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == "engine_unavailable"
        server.proc.wait(30)
        assert time.monotonic() - started < 30
    finally:
        code = server.stop()
    assert code == 0 and "ninfer serve: stopped" in server.output()
