"""Reading maps the payload instead of copying it: RSS stays flat for a multi-GB artifact, and
verification (pread-based) does not fault the map in either."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.artifact import Artifact, Binding, ObjectSpec, Use, write_artifact
from ninfer.core.dtypes import DType

MiB = 1 << 20


def _rss() -> dict[str, int]:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "RssAnon")}


def _write_big(path, total_bytes: int, seed: int):
    """One bf16 object of `total_bytes`: random first and last chunks, zeros between (written
    as holes, so the file costs little disk and little time besides hashing)."""
    chunk_elems = 8 * MiB // 2
    rng = np.random.default_rng(seed)
    head = rng.integers(0, 1 << 16, size=chunk_elems, dtype=np.uint16)
    tail = rng.integers(0, 1 << 16, size=chunk_elems, dtype=np.uint16)
    zeros = np.zeros(chunk_elems, dtype=np.uint16)
    n_chunks = total_bytes // (2 * chunk_elems)

    def fill(spec):
        yield head
        for _ in range(n_chunks - 2):
            yield zeros
        yield tail

    cols = 4096
    rows = n_chunks * chunk_elems // cols
    write_artifact(path, config={}, metadata={"name": "big", "architecture": "test"},
                   objects=[ObjectSpec("big", DType.BFLOAT16, (rows, cols))],
                   bindings=[Binding("w", "big", Use.TEXT)], resources=[], fill=fill)
    return head.reshape(-1, cols), tail.reshape(-1, cols)


@pytest.mark.slow
def test_multi_gb_artifact_is_mapped_not_read(tmp_path):
    size = 2 << 30
    path = tmp_path / "big.ninfer"
    head, tail = _write_big(path, size, seed=21)
    before = _rss()
    with Artifact.open(path, verify=False) as art:
        w = art.weight("w")
        assert w.nbytes == size and not w.data.flags.writeable
        np.testing.assert_array_equal(w.data[: head.shape[0]], head)
        np.testing.assert_array_equal(w.data[-tail.shape[0]:], tail)
        middle = w.data[w.shape[0] // 2: w.shape[0] // 2 + 3]
        assert int(middle.astype(np.int64).sum()) == 0
        strided = int(w.data[::8192].astype(np.int64).sum())  # touch pages across the file
        after = _rss()
    assert strided >= 0
    assert after["RssAnon"] - before["RssAnon"] < 48 * MiB, "reading copied the payload"
    assert after["VmRSS"] - before["VmRSS"] < size // 4, "reading faulted in the whole file"
    path.unlink()


def test_verify_does_not_fault_in_the_map(tmp_path):
    size = 128 * MiB
    path = tmp_path / "mid.ninfer"
    _write_big(path, size, seed=22)
    before = _rss()
    with Artifact.open(path, verify=True):  # hashes every bound object
        after = _rss()
    assert after["VmRSS"] - before["VmRSS"] < 48 * MiB
