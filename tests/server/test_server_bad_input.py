"""Bad input against a real ``ninfer serve`` process (the scripted server: real HTTP stack,
frontend and engine; see conftest.py): a schemathesis fuzz of /openapi.json, oversized and
malformed bodies, missing API keys. Every answer must be a well-formed JSON success or
OpenAI error object, never a 5xx, and the server must stay healthy."""
from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.parse

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance, response_schema_conformance, status_code_conformance,
)

from .server_scripts import API_KEY


AUTH = {"Authorization": f"Bearer {API_KEY}"}
FUZZ_BUDGET_S = 60
EXAMPLES = {"/v1/chat/completions": 40, "/v1/completions": 30}  # others: 12 per mode


def _address(server) -> tuple[str, int]:
    url = urllib.parse.urlsplit(server.url)
    return url.hostname, url.port


def _conn(server) -> http.client.HTTPConnection:
    return http.client.HTTPConnection(*_address(server), timeout=60)


def _request(server, method, path, body=None, headers=None):
    conn = _conn(server)
    try:
        conn.request(method, path, body=body, headers={**AUTH, **(headers or {})})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def _assert_error(status_and_body, status, code=None):
    got, headers, raw = status_and_body
    assert got == status, raw[:300]
    err = json.loads(raw)["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if code is not None:
        assert err["code"] == code
    return err


def _assert_well_formed(response) -> None:
    """Never a 5xx; JSON bodies parse; errors are OpenAI error objects."""
    assert response.status_code < 500, response.text[:500]
    ctype = response.headers.get("Content-Type", "")
    if ctype.startswith("application/json"):
        body = response.json()
        if response.status_code >= 400:
            err = body["error"]
            assert set(err) >= {"message", "type", "param", "code"} and err["message"]
    elif ctype.startswith("text/event-stream"):
        events = [e for e in response.text.split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        for event in events[:-1]:
            assert event.startswith("data: ") and isinstance(json.loads(event[6:]), dict)


def test_schema_fuzz(scripted_server):
    url = scripted_server.url
    schema = schemathesis.openapi.from_url(url + "/openapi.json", headers=AUTH)
    checks = [not_a_server_error, status_code_conformance, content_type_conformance,
              response_schema_conformance]
    stop_at = time.monotonic() + FUZZ_BUDGET_S
    calls = {"n": 0, "generated": 0}
    for result in schema.get_all_operations():
        operation = result.ok()
        modes = [GenerationMode.POSITIVE]
        if operation.method.upper() == "POST":  # only bodies can be made schema-invalid
            modes.append(GenerationMode.NEGATIVE)
        for mode in modes:
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=EXAMPLES.get(operation.path, 12), deadline=None,
                      derandomize=True, database=None, phases=[Phase.generate],
                      suppress_health_check=list(HealthCheck))
            def fuzz(case):
                if time.monotonic() > stop_at:
                    return
                response = case.call(base_url=url, headers=AUTH, timeout=60)
                calls["n"] += 1
                if response.status_code == 200 and "completions" in operation.path:
                    calls["generated"] += 1
                _assert_well_formed(response)
                case.validate_response(response, checks=checks, headers=AUTH)

            fuzz()
    assert calls["n"] >= 100 and calls["generated"] >= 10, calls
    status, body = scripted_server.health()
    assert status == 200 and body["status"] == "ready"
    status, _, raw = _request(scripted_server, "POST", "/v1/completions",
                              json.dumps({"prompt": "ok", "max_tokens": 2}))
    assert status == 200 and json.loads(raw)["choices"][0]["finish_reason"] == "stop"


def test_oversized_bodies(scripted_server):
    limit = 65536  # --max-request-bytes of the scripted server
    body = json.dumps({"prompt": "x" * (limit + 10)})
    err = _assert_error(_request(scripted_server, "POST", "/v1/completions", body), 413,
                        "request_too_large")
    assert str(limit) in err["message"]
    # chunked, no Content-Length: the app stops reading one byte past the limit
    conn = _conn(scripted_server)
    conn.putrequest("POST", "/v1/completions")
    for name, value in {**AUTH, "Transfer-Encoding": "chunked"}.items():
        conn.putheader(name, value)
    conn.endheaders()
    for _ in range(3):
        chunk = b"x" * 40000
        conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    conn.send(b"0\r\n\r\n")
    resp = conn.getresponse()
    assert resp.status == 413 and json.loads(resp.read())["error"]["code"] == \
        "request_too_large"
    conn.close()
    # a declared length far past the limit is refused before the body is sent
    sock = socket.create_connection(_address(scripted_server), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n"
                 b"Authorization: Bearer " + API_KEY.encode() + b"\r\n\r\n{")
    reply = sock.recv(4096)
    sock.close()
    assert reply.startswith(b"HTTP/1.1 413")
    assert scripted_server.health()[0] == 200


@pytest.mark.parametrize("raw", [b"{not json", b"[]", b"", b'{"prompt": NaN}',
                                 b"\xc3\x28{}"])
def test_malformed_json(scripted_server, raw):
    _assert_error(_request(scripted_server, "POST", "/v1/completions", raw,
                           {"Content-Type": "application/json"}), 400, "invalid_json")


def test_missing_or_wrong_key(scripted_server):
    for headers in ({"Authorization": ""}, {"Authorization": "Bearer nope"}):
        conn = _conn(scripted_server)
        conn.request("GET", "/v1/models", headers=headers)
        resp = conn.getresponse()
        assert resp.status == 401
        assert json.loads(resp.read())["error"]["code"] == "invalid_api_key"
        conn.close()
    assert _request(scripted_server, "GET", "/v1/models")[0] == 200


EXTREME_SAMPLING = [{"temperature": 1e-300}, {"temperature": 2}, {"top_p": 1e-6},
                    {"top_p": 1e-300}, {"top_k": 2**31 - 1}, {"top_k": 2**31}, {"min_p": 1},
                    {"repetition_penalty": 0.01}, {"repetition_penalty": 1e-300},
                    {"repetition_penalty": 100}, {"presence_penalty": 2,
                                                  "frequency_penalty": -2},
                    {"seed": 2**63 - 1}, {"seed": 2**63}, {"n": 8}]


def test_extreme_sampling_values_do_not_harm_the_real_engine(demo_server):
    """Every boundary value either works or gets a 400; the real engine stays up."""
    for extra in EXTREME_SAMPLING:
        status, _, raw = _request(demo_server, "POST", "/v1/completions", json.dumps(
            {"prompt": "hello hello", "max_tokens": 2, **extra}))
        assert status in (200, 400), (extra, raw[:300])
        if status == 200:
            assert json.loads(raw)["usage"]["completion_tokens"] == 2 * extra.get("n", 1)
    status, _, raw = _request(demo_server, "GET", "/metrics")
    assert b"ninfer:engine_running 1.0" in raw
    assert demo_server.health()[0] == 200
