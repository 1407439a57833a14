"""Layer 7: the OpenAI-compatible HTTP gateway (Falcon app on waitress).

Owns protocol, transport, schemas, connections; prompts and output semantics come from the
frontend, generation from the Engine. Entry points: `create_app(host, config)` (the WSGI app),
`ModelHost` (background model loading and the engine), `create_server` / `run_server`
(waitress), `make_loader` (what `ninfer serve` loads). See docs/server.md.
"""
from ninfer.serve.app import create_app
from ninfer.serve.context import ServerConfig, ServerContext
from ninfer.serve.lifecycle import EngineOptions, HostState, LoadedModel, ModelHost, ServedModel
from ninfer.serve.loading import LoadOptions, make_loader
from ninfer.serve.server import create_server, run_server, server_url

__all__ = [
    "EngineOptions", "HostState", "LoadOptions", "LoadedModel", "ModelHost", "ServedModel",
    "ServerConfig", "ServerContext", "create_app", "create_server", "make_loader", "run_server",
    "server_url",
]
