"""Runtime test fixtures.

`program_factory(kv_tokens=..., slots=..., snapshots=..., snapshot_location=...)` builds a fresh
Program with a KV budget of about `kv_tokens` tokens, `slots` StateImage slots and a host
snapshot budget of about `snapshots` full-context snapshots. Every engine test runs against each
factory param unchanged:

- "fake": the FakeProgram (always);
- "cpu-tiny": the real Qwen3.5 CPU Program on a tiny random checkpoint (the CPU backend the
  issue's tests ask for; ~15 s for the whole directory). `RUNTIME_TEST_PROGRAMS=fake` limits a
  local run to the FakeProgram.
"""
from __future__ import annotations

import os

import pytest

from ninfer.testing.fake_program import FakeProgram

_STATE_BYTES = 256
_KV_BYTES_PER_TOKEN = 16
_MAX_CONTEXT = 64
_PAGE_SIZE = 4
_CHUNK = 8


def make_fake_program(*, kv_tokens: int = 1024, slots: int = 8, snapshots: float = 64.0,
                      snapshot_location: str = "host", max_context_len: int = _MAX_CONTEXT,
                      page_size: int = _PAGE_SIZE, prefill_chunk: int = _CHUNK) -> FakeProgram:
    full_snapshot = _STATE_BYTES + _KV_BYTES_PER_TOKEN * max_context_len
    return FakeProgram(vocab_size=64, max_context_len=max_context_len, page_size=page_size,
                       total_pages=kv_tokens // page_size, total_slots=slots, max_batch=8,
                       prefill_chunk=prefill_chunk,
                       host_snapshot_bytes=int(snapshots * full_snapshot),
                       state_bytes=_STATE_BYTES, kv_bytes_per_token=_KV_BYTES_PER_TOKEN,
                       snapshot_location=snapshot_location)


def _cpu_tiny_factory(tmp_path_factory):
    from ninfer.models.qwen3_5.program import Qwen35Program
    from ninfer.models.qwen3_5.startup import ProgramOptions
    from ninfer.models.registry import load_model_instance
    from ninfer.testing.checkpoints import PRESETS, write_hf_checkpoint
    from tools.convert import convert_checkpoint

    root = tmp_path_factory.mktemp("runtime-cpu-tiny")
    write_hf_checkpoint(root / "hf", PRESETS["tiny-dense"], seed=7, dtype="float32",
                        architecture="Qwen3_5ForCausalLM")
    artifact = convert_checkpoint(root / "hf", root / "tiny.ninfer", progress=False)

    def make(*, kv_tokens: int = 1024, slots: int = 8, snapshots: float = 64.0,
             snapshot_location: str = "host"):
        if snapshot_location != "host":
            pytest.skip("the CPU Program keeps Snapshots in host memory only")
        opts = ProgramOptions(max_concurrency=8, page_size=_PAGE_SIZE, prefill_chunk=_CHUNK,
                              max_context_len=_MAX_CONTEXT, num_pages=kv_tokens // _PAGE_SIZE,
                              num_slots=slots)
        program = load_model_instance(artifact, opts).program
        full = program.backend.snapshot_bytes(_MAX_CONTEXT)
        return Qwen35Program(program.backend, program.limits, int(snapshots * full))

    return make


def _enabled() -> list:
    wanted = os.environ.get("RUNTIME_TEST_PROGRAMS", "fake,cpu-tiny").split(",")
    return ["fake"] + [pytest.param("cpu-tiny", marks=pytest.mark.slow)
                       for name in wanted if name.strip() == "cpu-tiny"]


@pytest.fixture(params=_enabled())
def program_factory(request, tmp_path_factory):
    if request.param == "fake":
        return make_fake_program
    return _cpu_tiny_factory(tmp_path_factory)
