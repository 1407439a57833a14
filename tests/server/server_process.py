"""A `ninfer serve` subprocess on a free loopback port, for the end-to-end server tests.

The server is started with ``--port 0`` and its URL is read from the line it prints when it
starts listening; readiness is /health == 200. Output is collected by a reader thread so a
failure shows the server's last lines. `stop()` sends SIGTERM and checks the clean exit.
"""
from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

_URL = re.compile(r"listening on (http://\S+)")


class ServerProcess:
    def __init__(self, *args: str, env: dict[str, str] | None = None):
        cmd = [sys.executable, "-m", "ninfer.cli.main", "serve", *args, "--port", "0",
               "--host", "127.0.0.1", "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, **(env or {})})
        self.lines: collections.deque[str] = collections.deque(maxlen=200)
        self._url_found = threading.Event()
        self.url: str | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            match = _URL.search(line)
            if match and self.url is None:
                self.url = match.group(1)
                self._url_found.set()

    def output(self) -> str:
        return "\n".join(self.lines)

    def _fail(self, why: str):
        raise RuntimeError(f"ninfer serve {why}; its output:\n{self.output()}")

    def health(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def wait_ready(self, timeout: float) -> float:
        """Seconds until /health said 200 (the model is loaded and warmed up)."""
        start = time.monotonic()
        if not self._url_found.wait(60):
            self._fail("did not start listening within 60 s")
        while time.monotonic() - start < timeout:
            if self.proc.poll() is not None:
                self._fail(f"exited with {self.proc.returncode}")
            status, _ = self.health()
            if status == 200:
                return time.monotonic() - start
            time.sleep(0.5)
        self._fail(f"was not ready within {timeout} s")

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self._fail(f"did not stop within {timeout} s of SIGTERM")
        self._reader.join(5)
        return self.proc.returncode
