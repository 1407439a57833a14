"""Fixtures of the server tests.

- `tokenizer`, `frontend`: the real Qwen3.5 tokenizer and frontend (for in-process tests and
  for building token scripts).
- `demo_server`: ``ninfer serve --demo`` (the real CPU model), started once per session.
- `scripted_server`: ``ninfer serve --demo --api-key KEY --scripted-program FILE``: the real
  server, tokenizer, template and frontend, with the model's Program swapped for a FakeProgram
  of the same limits that emits token scripts (see server_scripts.py); for the
  tool-call/reasoning tests, the API-key tests and the schema fuzz.

Both use the demo model from the default cache (``$NINFER_CACHE_DIR`` or ``~/.cache/ninfer``),
so it is built at most once per machine (about 30 s) and reused by later runs.
"""
from __future__ import annotations

import pytest

from .server_process import ServerProcess
from .server_scripts import API_KEY, script_file_text

READY_TIMEOUT_S = 900  # a first run builds the demo model and compiles the Numba kernels


@pytest.fixture(scope="session")
def tokenizer_json() -> str:
    from tools.demo import qwen35_tokenizer_json_path

    return qwen35_tokenizer_json_path().read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def frontend(tokenizer_json):
    from ninfer.models.common.qwen import QwenFrontend
    from tools.demo.build import demo_generation_config, demo_text_config

    return QwenFrontend.from_resources(tokenizer_json, None, demo_generation_config(),
                                       demo_text_config()["vocab_size"])


@pytest.fixture(scope="session")
def tokenizer(frontend):
    return frontend.tokenizer


def _running(server: ServerProcess):
    try:
        server.wait_ready(READY_TIMEOUT_S)
        yield server
    finally:
        code = server.stop()
    assert code == 0, f"the server exited with {code}:\n{server.output()}"
    assert "ninfer serve: stopped" in server.output()


@pytest.fixture(scope="session")
def demo_server():
    yield from _running(ServerProcess(
        "--demo", "--max-concurrency", "4", "--max-queue", "4", "--max-context-len", "1024",
        "--default-max-tokens", "16"))


@pytest.fixture(scope="session")
def scripted_server(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("scripts") / "scripts.json"
    path.write_text(script_file_text(tokenizer), encoding="utf-8")
    yield from _running(ServerProcess(
        "--demo", "--api-key", API_KEY, "--scripted-program", str(path),
        "--max-concurrency", "2", "--max-queue", "6", "--max-context-len", "512",
        "--default-max-tokens", "200", "--max-request-bytes", "65536"))
