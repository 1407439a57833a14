"""The NINFER_* switches read by ninfer.envs."""
from __future__ import annotations

import pytest

from ninfer import envs

SWITCHES = [  # (reader, variable, default)
    (envs.cuda_debug_sync, "NINFER_CUDA_SYNC", False),
    (envs.gemv_rows, "NINFER_GEMV_ROWS", True),
    (envs.gemv_persist, "NINFER_GEMV_PERSIST", True),
    (envs.prefill_overlap, "NINFER_PREFILL_OVERLAP", True),
    (envs.gdn_chunk_split_o, "NINFER_GDN_CHUNK_SPLIT_O", False),
]


@pytest.mark.parametrize("reader, name, default", SWITCHES)
def test_switch(monkeypatch, reader, name, default):
    """Unset or empty: the default; "0": off; "1": on."""
    monkeypatch.delenv(name, raising=False)
    assert reader() is default
    for raw, want in (("1", True), ("0", False), ("", default)):
        monkeypatch.setenv(name, raw)
        assert reader() is want, raw
