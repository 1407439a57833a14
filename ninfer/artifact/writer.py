"""Streaming writer of `.ninfer` files.

The caller declares every object (name, dtype, shape) up front, so all offsets are known before
the first payload byte. The header is written with placeholder digests of the same width as the
real ones, the objects are streamed one by one from the caller's `fill` callback (peak memory is
the largest chunk it yields), and the header is rewritten in place with the real digests. The
file is written under a temporary name in the target directory and renamed on success; on any
error the temporary file is removed and nothing appears at `path`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Sequence, Union

import numpy as np

from ninfer.artifact.format import (
    OBJECT_ALIGNMENT, PAYLOAD_ALIGNMENT, PREFIX_SIZE, Prefix, align_up, decode_header,
    encode_header,
)
from ninfer.artifact.header import (
    PLACEHOLDER_SHA256, ArtifactHeader, Binding, ObjectEntry, ResourceEntry,
)
from ninfer.artifact.progress import ProgressMode, byte_bar
from ninfer.core.dtypes import DType
from ninfer.errors import ArtifactError

_SPARSE_MIN_BYTES = 1 << 20
Chunk = Union[np.ndarray, bytes, bytearray, memoryview]


@dataclasses.dataclass(frozen=True, slots=True)
class ObjectSpec:
    """An object to write: `fill(spec)` must yield exactly `nbytes` bytes for it, in C order."""
    name: str
    dtype: DType
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


FillFn = Callable[[ObjectSpec], Iterable[Chunk]]


def plan_layout(objects: Sequence[ObjectSpec]) -> tuple[list[int], int]:
    """Payload-relative offsets of `objects` (in order, each 64-aligned) and the payload length."""
    offsets, end = [], 0
    for spec in objects:
        start = align_up(end, OBJECT_ALIGNMENT)
        offsets.append(start)
        end = start + spec.nbytes
    return offsets, end


def write_artifact(path: str | os.PathLike, *, config: dict, metadata: dict,
                   objects: Sequence[ObjectSpec], bindings: Sequence[Binding],
                   resources: Sequence[ResourceEntry], fill: FillFn,
                   progress: ProgressMode = False, desc: str = "write") -> Path:
    """Write a complete artifact to `path` (atomically) and return it.

    Invalid declarations (unknown objects in bindings, bad row ranges, non-uint8 resources,
    duplicate names, missing `metadata.name`/`architecture`) raise `ArtifactError` before any
    byte is written. `fill` errors propagate unchanged after the temporary file is removed.
    """
    path = Path(path)
    offsets, payload_len = plan_layout(objects)
    header = ArtifactHeader(
        config=config, metadata=metadata,
        objects=tuple(ObjectEntry(s.name, s.dtype, tuple(s.shape), off, s.nbytes,
                                  PLACEHOLDER_SHA256) for s, off in zip(objects, offsets)),
        bindings={b.name: b for b in bindings},
        resources={r.name: r for r in resources},
    )
    _check_declarations(header, objects, bindings, resources, path, payload_len)
    placeholder = encode_header(header.to_json())
    payload_offset = align_up(PREFIX_SIZE + len(placeholder), PAYLOAD_ALIGNMENT)

    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp",
                                    dir=path.parent if str(path.parent) else ".")
    try:
        with os.fdopen(fd, "r+b") as f:
            f.write(Prefix(len(placeholder), payload_offset, payload_len, bytes(32)).pack())
            f.write(placeholder)
            digests = _write_payload(f, payload_offset, objects, offsets, fill, progress, desc)
            f.truncate(payload_offset + payload_len)
            final = dataclasses.replace(header, objects=tuple(
                dataclasses.replace(o, sha256=d) for o, d in zip(header.objects, digests)))
            raw = encode_header(final.to_json())
            assert len(raw) == len(placeholder), "digest width changed the header length"
            f.seek(0)
            f.write(Prefix(len(raw), payload_offset, payload_len,
                           hashlib.sha256(raw).digest()).pack())
            f.write(raw)
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, path)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    return path


def _check_declarations(header, objects, bindings, resources, path, payload_len) -> None:
    names = [s.name for s in objects]
    for kind, seq in (("object", names), ("binding", [b.name for b in bindings]),
                      ("resource", [r.name for r in resources])):
        if len(set(seq)) != len(seq):
            dup = sorted({n for n in seq if seq.count(n) > 1})[0]
            raise ArtifactError(f"{path}: duplicate {kind} name {dup!r}")
    try:
        encoded = encode_header(header.to_json())
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"{path}: config/metadata are not JSON-serializable ({exc})") from None
    ArtifactHeader.from_json(decode_header(encoded, path=str(path)), path=str(path),
                             payload_len=payload_len)


def _write_payload(f, payload_offset, objects, offsets, fill, progress, desc) -> list[str]:
    total = sum(s.nbytes for s in objects)
    digests = []
    with byte_bar(total, desc, progress) as bar:
        for spec, offset in zip(objects, offsets):
            pad = payload_offset + offset - f.tell()
            if pad:
                f.write(bytes(pad))
            h = hashlib.sha256()
            written = 0
            for chunk in fill(spec):
                view = _as_bytes(chunk, spec)
                written += len(view)
                if written > spec.nbytes:
                    break
                h.update(view)
                _write_sparse(f, view)
                bar.update(len(view))
            if written != spec.nbytes:
                raise ArtifactError(f"object {spec.name!r}: fill produced {written} bytes, "
                                    f"expected {spec.nbytes}")
            digests.append(h.hexdigest())
    return digests


def _write_sparse(f, view: memoryview) -> None:
    """Write `view`, leaving a hole (seek) for large all-zero chunks: the bytes read back as
    zeros, and a mostly-zero object costs no disk."""
    if len(view) >= _SPARSE_MIN_BYTES and not np.frombuffer(view, dtype=np.uint8).any():
        f.seek(len(view), os.SEEK_CUR)
    else:
        f.write(view)


def _as_bytes(chunk: Chunk, spec: ObjectSpec) -> memoryview:
    if isinstance(chunk, np.ndarray):
        if chunk.dtype != spec.dtype.storage:
            raise ArtifactError(f"object {spec.name!r}: chunk dtype {chunk.dtype} does not match "
                                f"{spec.dtype.value} storage {spec.dtype.storage}")
        chunk = np.ascontiguousarray(chunk)
        return memoryview(chunk.reshape(-1).view(np.uint8))
    return memoryview(chunk).cast("B")
