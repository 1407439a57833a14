"""In-process harness: the real app, frontend, engine and scripted Program over a FakeProgram.

`make_app(frontend, tokenizer, config=..., engine=...)` returns an `AppHarness` with a Falcon
`TestClient`, the ModelHost, the FakeProgram (for integrity checks) and `raw_call` for driving
the WSGI iterable by hand (disconnect tests). Requests without a script trigger get the
FakeProgram's pseudo-random tokens (over the real 248k vocabulary, so EOS is rare).
"""
from __future__ import annotations

import io
import json

from falcon import testing

from ninfer.serve import EngineOptions, LoadedModel, ModelHost, ServerConfig, create_app
from ninfer.serve.scripted import ScriptedProgram, load_scripts
from ninfer.testing.fake_program import FakeProgram

from .server_scripts import script_file_text

VOCAB = 248320


class AppHarness:
    def __init__(self, frontend, tokenizer, tmp_path, *, config: ServerConfig | None = None,
                 engine: EngineOptions | None = None, max_context_len: int = 1024):
        self.program = FakeProgram(vocab_size=VOCAB, max_context_len=max_context_len,
                                   page_size=16, total_pages=256, total_slots=8, max_batch=8,
                                   prefill_chunk=64)
        path = tmp_path / "scripts.json"
        doc = json.loads(script_file_text(tokenizer))
        doc["default"] = None  # unscripted requests get the FakeProgram's tokens
        path.write_text(json.dumps(doc))
        scripts, default = load_scripts(path)
        program = ScriptedProgram(self.program, scripts, default, tokenizer.decode)
        self.host = ModelHost(engine or EngineOptions(4, 4), model_id="fake-model")
        self.host.load_now(lambda: LoadedModel("fake", program, frontend))
        self.app, self.ctx = create_app(self.host, config or ServerConfig())
        self.client = testing.TestClient(self.app)

    @property
    def engine(self):
        return self.host.served.engine

    def chat(self, body: dict, **kw):
        return self.client.simulate_post("/v1/chat/completions", json=body, **kw)

    def raw_call(self, path: str, body: dict, environ_extra: dict | None = None):
        """Call the WSGI app directly; returns (status, headers, iterable) unconsumed."""
        data = json.dumps(body).encode()
        env = testing.create_environ(path=path, method="POST", body=data,
                                     headers={"Content-Type": "application/json"})
        env["wsgi.input"] = io.BytesIO(data)
        env.update(environ_extra or {})
        captured = {}

        def start_response(status, headers, exc_info=None):
            captured["status"], captured["headers"] = status, dict(headers)

        iterable = self.app(env, start_response)
        return captured["status"], captured["headers"], iterable

    def close(self) -> None:
        self.host.close()
