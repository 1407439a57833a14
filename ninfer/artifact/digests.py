"""SHA-256 of byte ranges of a file, read with `pread` into one reusable buffer.

Digests are computed from file reads, never through the memory map, so verifying a large
artifact does not fault its pages into the process (RSS stays flat).
"""
from __future__ import annotations

import hashlib
import os
from typing import Callable

CHUNK_BYTES = 8 << 20


def sha256_range(fd: int, offset: int, length: int, *, buffer: bytearray | None = None,
                 on_bytes: Callable[[int], None] | None = None) -> str:
    """Hex SHA-256 of `length` bytes of `fd` starting at `offset`.

    Raises `EOFError` if the file ends early.
    """
    buf = buffer if buffer is not None else bytearray(CHUNK_BYTES)
    view = memoryview(buf)
    h = hashlib.sha256()
    done = 0
    while done < length:
        want = min(len(buf), length - done)
        got = os.preadv(fd, [view[:want]], offset + done)
        if got <= 0:
            raise EOFError(f"file ends at {offset + done}, expected {offset + length}")
        h.update(view[:got])
        done += got
        if on_bytes is not None:
            on_bytes(got)
    return h.hexdigest()
