"""Runtime test fixtures.

`program_factory(kv_tokens=..., slots=..., snapshots=..., snapshot_location=...)` builds a fresh
Program with a KV budget of about `kv_tokens` tokens, `slots` StateImage slots and a host
snapshot budget of about `snapshots` full-context snapshots. Today it supplies the FakeProgram;
the CPU Qwen3.5 Program can be added as another param (its factory maps the same budget words
onto its own sizes), and every engine test then runs against it unchanged.
"""
from __future__ import annotations

import pytest

from ninfer.testing.fake_program import FakeProgram

_STATE_BYTES = 256
_KV_BYTES_PER_TOKEN = 16


def make_fake_program(*, kv_tokens: int = 1024, slots: int = 8, snapshots: float = 64.0,
                      snapshot_location: str = "host", max_context_len: int = 64,
                      page_size: int = 4, prefill_chunk: int = 8) -> FakeProgram:
    full_snapshot = _STATE_BYTES + _KV_BYTES_PER_TOKEN * max_context_len
    return FakeProgram(vocab_size=64, max_context_len=max_context_len, page_size=page_size,
                       total_pages=kv_tokens // page_size, total_slots=slots, max_batch=8,
                       prefill_chunk=prefill_chunk,
                       host_snapshot_bytes=int(snapshots * full_snapshot),
                       state_bytes=_STATE_BYTES, kv_bytes_per_token=_KV_BYTES_PER_TOKEN,
                       snapshot_location=snapshot_location)


@pytest.fixture(params=["fake"])
def program_factory(request):
    return {"fake": make_fake_program}[request.param]
