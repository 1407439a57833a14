"""Build-once cache files: one builder at a time, atomic publish, corrupt entries rebuilt."""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from tools.demo._filecache import build_once, is_complete, temp_sibling


def _payload(seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size=100_003, dtype=np.uint8).tobytes()


def _writer(data: bytes, calls: list, delay_s: float = 0.0):
    def build(tmp):
        calls.append(tmp)
        time.sleep(delay_s)
        tmp.write_bytes(data)
    return build


def test_builds_once_then_reuses(tmp_path):
    target = tmp_path / "sub" / "thing.bin"
    data, calls = _payload(1), []
    assert build_once(target, _writer(data, calls)) is True
    assert target.read_bytes() == data and is_complete(target)
    stat = target.stat()
    assert build_once(target, _writer(b"other", calls)) is False
    assert len(calls) == 1 and target.stat().st_mtime_ns == stat.st_mtime_ns
    assert sorted(p.name for p in target.parent.iterdir()) == ["thing.bin", "thing.bin.lock", "thing.bin.sha256"]


@pytest.mark.parametrize("damage", ["flip", "truncate", "missing_sidecar", "extend"])
def test_damaged_entry_is_rebuilt(tmp_path, damage):
    target = tmp_path / "thing.bin"
    data, calls = _payload(2), []
    build_once(target, _writer(data, calls))
    raw = bytearray(target.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0x01
        target.write_bytes(bytes(raw))
    elif damage == "truncate":
        target.write_bytes(bytes(raw[:-1]))
    elif damage == "extend":
        target.write_bytes(bytes(raw) + b"\0")
    else:
        target.with_name("thing.bin.sha256").unlink()
    assert not is_complete(target)
    assert build_once(target, _writer(data, calls)) is True
    assert len(calls) == 2 and target.read_bytes() == data and is_complete(target)


def test_failed_build_publishes_nothing_and_leaves_no_temporaries(tmp_path):
    target = tmp_path / "thing.bin"

    def broken(tmp):
        tmp.write_bytes(b"half")
        temp_sibling(target, "work").mkdir()
        raise KeyError("boom")

    with pytest.raises(KeyError):
        build_once(target, broken)
    assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thing.bin.lock"]


def test_stale_temporaries_of_a_dead_builder_are_swept(tmp_path):
    target = tmp_path / "thing.bin"
    stale = temp_sibling(target)
    stale.write_bytes(b"partial")
    build_once(target, _writer(_payload(3), []))
    assert not stale.exists()


def test_concurrent_builders_build_once(tmp_path):
    target = tmp_path / "thing.bin"
    data, calls, results, errors = _payload(4), [], [], []

    def worker():
        try:
            results.append(build_once(target, _writer(data, calls, delay_s=0.2)))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert sorted(results) == [False, False, False, True]
    assert len(calls) == 1 and target.read_bytes() == data


def test_unwritable_cache_dir_gives_a_clear_error(tmp_path):
    from ninfer.errors import NinferError

    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(NinferError, match="NINFER_CACHE_DIR"):
        build_once(blocker / "thing.bin", _writer(b"x", []))
    assert os.path.isfile(blocker)


def test_discard_removes_an_idle_entry_but_not_one_being_built(tmp_path):
    from tools.demo._filecache import discard, exclusive_lock

    idle, busy = tmp_path / "idle.bin", tmp_path / "busy.bin"
    for target in (idle, busy):
        build_once(target, _writer(_payload(5), []))
    with exclusive_lock(busy.with_name("busy.bin.lock")):
        discard(idle)
        discard(busy)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy.bin", "busy.bin.lock", "busy.bin.sha256"]
