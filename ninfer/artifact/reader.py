"""Reader of `.ninfer` files: validates the framing, memory-maps the payload, resolves bindings.

Arrays returned by `object_array`/`weight` are read-only NumPy views of the memory map (no
copy); they keep the map alive after `close()`. Digests are computed from file reads, so
`verify` does not fault the map's pages into the process.
"""
from __future__ import annotations

import copy
import hashlib
import mmap
import os
import types
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from ninfer.artifact.digests import CHUNK_BYTES, sha256_range
from ninfer.artifact.format import PREFIX_SIZE, Prefix, decode_header
from ninfer.artifact.header import ArtifactHeader, Binding, ObjectEntry, ResourceEntry
from ninfer.artifact.progress import ProgressMode, byte_bar
from ninfer.core.tensor import Weight
from ninfer.errors import ArtifactError, ArtifactIntegrityError


class Artifact:
    """An open `.ninfer` artifact. Use `Artifact.open(path)`; close with `close()` or `with`."""

    def __init__(self, path: Path, file, header: ArtifactHeader, payload_offset: int,
                 payload_len: int):
        self.path = path
        self._file = file
        self._header = header
        self._payload_offset = payload_offset
        self._payload_len = payload_len
        self._objects = types.MappingProxyType({o.name: o for o in header.objects})
        self._bindings = types.MappingProxyType(dict(header.bindings))
        self._resources = types.MappingProxyType(dict(header.resources))
        self._map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) if payload_len else None

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike, *, verify: bool = True,
             progress: ProgressMode = False) -> "Artifact":
        """Open and validate `path`. With `verify`, recompute the SHA-256 of every object a
        binding or resource uses and raise `ArtifactIntegrityError` at the first mismatch.

        Malformed, truncated or non-artifact files raise `ArtifactError` (one-line message)."""
        path = Path(path)
        try:
            file = open(path, "rb")
        except OSError as exc:
            raise ArtifactError(f"cannot open artifact {path}: {exc.strerror or exc}") from None
        try:
            art = cls._from_file(path, file)
        except BaseException:
            file.close()
            raise
        if verify:
            try:
                art.verify(art.used_objects(), progress=progress)
            except BaseException:
                art.close()
                raise
        return art

    @classmethod
    def _from_file(cls, path: Path, file) -> "Artifact":
        prefix = Prefix.unpack(file.read(PREFIX_SIZE), path=str(path))
        size = os.fstat(file.fileno()).st_size
        expected = prefix.payload_offset + prefix.payload_len
        if size < expected:
            raise ArtifactError(f"{path}: truncated artifact ({size} bytes, header says "
                                f"{expected})")
        if size > expected:
            raise ArtifactError(f"{path}: {size - expected} unexpected bytes after the payload")
        raw = file.read(prefix.header_len)
        if hashlib.sha256(raw).digest() != prefix.header_sha256:
            raise ArtifactError(f"{path}: header fails its SHA-256 check (corrupt file)")
        header = ArtifactHeader.from_json(decode_header(raw, path=str(path)), path=str(path),
                                          payload_len=prefix.payload_len)
        return cls(path, file, header, prefix.payload_offset, prefix.payload_len)

    def close(self) -> None:
        """Release the file and the map. Arrays already handed out keep the map alive."""
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass  # views are still exported; the map is freed with the last of them
            self._map = None
        self._file.close()

    def __enter__(self) -> "Artifact":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- header --------------------------------------------------------------------------------
    @property
    def config(self) -> dict:
        """The normalized HF text config (a private copy)."""
        return copy.deepcopy(self._header.config)

    @property
    def metadata(self) -> dict:
        return copy.deepcopy(self._header.metadata)

    @property
    def name(self) -> str:
        return self._header.metadata["name"]

    @property
    def architecture(self) -> str:
        return self._header.metadata["architecture"]

    @property
    def header(self) -> ArtifactHeader:
        return self._header

    @property
    def objects(self) -> Mapping[str, ObjectEntry]:
        """Physical objects by name, in payload order."""
        return self._objects

    @property
    def bindings(self) -> Mapping[str, Binding]:
        return self._bindings

    @property
    def resources(self) -> Mapping[str, ResourceEntry]:
        return self._resources

    def binding(self, logical_name: str) -> Binding:
        try:
            return self._bindings[logical_name]
        except KeyError:
            raise ArtifactError(f"{self.path}: no parameter {logical_name!r} is bound") from None

    def binding_shape(self, logical_name: str) -> tuple[int, ...]:
        b = self.binding(logical_name)
        return b.shape(self._objects[b.object].shape)

    def parent_groups(self) -> dict[str, tuple[Binding, ...]]:
        """Objects that back row-range views -> their view bindings sorted by start row.

        Consecutive members (`a.rows[1] == b.rows[0]`) can be computed as one fused linear."""
        groups: dict[str, list[Binding]] = {}
        for b in self._bindings.values():
            if b.rows is not None:
                groups.setdefault(b.object, []).append(b)
        return {k: tuple(sorted(v, key=lambda b: b.rows)) for k, v in groups.items()}

    def used_objects(self) -> list[str]:
        """Names of objects referenced by a binding or resource, in payload order."""
        used = {b.object for b in self._bindings.values()}
        used |= {r.object for r in self._resources.values()}
        return [name for name in self._objects if name in used]

    # -- data ----------------------------------------------------------------------------------
    def object_array(self, name: str) -> np.ndarray:
        """Read-only view of object `name` in its storage dtype (bf16 as uint16), no copy."""
        obj = self._objects.get(name)
        if obj is None:
            raise ArtifactError(f"{self.path}: no object {name!r}")
        if self._map is None:
            if obj.nbytes:
                raise ArtifactError(f"{self.path}: artifact is closed")
            empty = np.empty(obj.shape, dtype=obj.dtype.storage)
            empty.flags.writeable = False
            return empty
        arr = np.frombuffer(self._map, dtype=obj.dtype.storage, count=obj.numel,
                            offset=self._payload_offset + obj.offset)
        return arr.reshape(obj.shape)

    def weight(self, logical_name: str) -> Weight:
        """The logical parameter as a `Weight` (a row view of its parent for fused storage)."""
        b = self.binding(logical_name)
        w = Weight(self.object_array(b.object), self._objects[b.object].dtype)
        return w if b.rows is None else w.rows(*b.rows)

    def resource(self, name: str) -> bytes:
        entry = self._resources.get(name)
        if entry is None:
            raise ArtifactError(f"{self.path}: no resource {name!r} "
                                f"(has: {', '.join(sorted(self._resources)) or 'none'})")
        return self.object_array(entry.object).tobytes()

    # -- integrity -----------------------------------------------------------------------------
    def verify(self, names: Iterable[str] | None = None, *, progress: ProgressMode = False) -> None:
        """Recompute the SHA-256 of `names` (default: every object), in payload order.

        Raises `ArtifactIntegrityError` naming the first object whose bytes do not match."""
        wanted = list(self._objects) if names is None else list(names)
        entries = [self._objects[n] for n in wanted]
        buf = bytearray(CHUNK_BYTES)
        fd = self._file.fileno()
        with byte_bar(sum(e.nbytes for e in entries), "verify", progress) as bar:
            for e in entries:
                digest = sha256_range(fd, self._payload_offset + e.offset, e.nbytes, buffer=buf,
                                      on_bytes=bar.update)
                if digest != e.sha256:
                    raise ArtifactIntegrityError(
                        e.name, f"{self.path}: object {e.name!r} fails its SHA-256 check "
                                f"(expected {e.sha256[:16]}..., got {digest[:16]}...)")
