"""The artifact header as typed records, with its JSON codec and validation.

Records are frozen; `ArtifactHeader.to_json()` and `ArtifactHeader.from_json()` are exact inverses
for any header that validates, which is what makes read + rewrite byte-identical.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import re
from typing import Mapping

from ninfer.artifact.format import OBJECT_ALIGNMENT, VERSION
from ninfer.core.dtypes import DType
from ninfer.errors import ArtifactError

FORMAT_NAME = "ninfer-artifact"
PLACEHOLDER_SHA256 = "0" * 64
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


class Use(str, enum.Enum):
    """Which part of the model consumes a logical parameter."""
    TEXT = "text"
    MTP = "mtp"
    VISION = "vision"


@dataclasses.dataclass(frozen=True, slots=True)
class ObjectEntry:
    """A physical object: `nbytes` contiguous bytes at `offset` (relative to the payload start),
    C-order, element type `dtype` (bf16 stored as raw uint16 patterns)."""
    name: str
    dtype: DType
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    sha256: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype.value, "shape": list(self.shape),
                "offset": self.offset, "nbytes": self.nbytes, "sha256": self.sha256}


@dataclasses.dataclass(frozen=True, slots=True)
class Binding:
    """A logical parameter: the whole of `object`, or its rows [start, stop) along axis 0."""
    name: str
    object: str
    use: Use
    rows: tuple[int, int] | None = None

    def shape(self, parent_shape: tuple[int, ...]) -> tuple[int, ...]:
        if self.rows is None:
            return tuple(parent_shape)
        return (self.rows[1] - self.rows[0],) + tuple(parent_shape[1:])

    def to_json(self) -> dict:
        out = {"object": self.object, "use": self.use.value}
        if self.rows is not None:
            out["rows"] = list(self.rows)
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class ResourceEntry:
    """A frontend resource (tokenizer.json, chat template, ...): the bytes of a uint8 object."""
    name: str
    object: str
    media_type: str

    def to_json(self) -> dict:
        return {"object": self.object, "media_type": self.media_type}


@dataclasses.dataclass(frozen=True)
class ArtifactHeader:
    config: dict
    metadata: dict
    objects: tuple[ObjectEntry, ...]        # payload order (ascending offset)
    bindings: Mapping[str, Binding]
    resources: Mapping[str, ResourceEntry]

    def to_json(self) -> dict:
        return {
            "format": FORMAT_NAME,
            "version": VERSION,
            "alignment": OBJECT_ALIGNMENT,
            "config": self.config,
            "metadata": self.metadata,
            "objects": [o.to_json() for o in self.objects],
            "bindings": {k: b.to_json() for k, b in self.bindings.items()},
            "resources": {k: r.to_json() for k, r in self.resources.items()},
        }

    @classmethod
    def from_json(cls, raw: dict, *, path: str, payload_len: int) -> "ArtifactHeader":
        """Parse and validate; any inconsistency raises `ArtifactError` naming the field."""
        try:
            return _parse(raw, path=path, payload_len=payload_len)
        except (KeyError, TypeError, ValueError) as exc:
            raise ArtifactError(f"{path}: malformed header ({type(exc).__name__}: {exc})") from None


def _parse(raw: dict, *, path: str, payload_len: int) -> ArtifactHeader:
    def fail(msg: str) -> ArtifactError:
        return ArtifactError(f"{path}: malformed header: {msg}")

    if raw.get("format") != FORMAT_NAME or raw.get("version") != VERSION:
        raise fail(f"format/version is {raw.get('format')!r}/{raw.get('version')!r}")
    if raw.get("alignment") != OBJECT_ALIGNMENT:
        raise fail(f"alignment {raw.get('alignment')!r} != {OBJECT_ALIGNMENT}")
    config, metadata = raw["config"], raw["metadata"]
    if not isinstance(config, dict) or not isinstance(metadata, dict):
        raise fail("config and metadata must be objects")
    for key in ("name", "architecture"):
        if not isinstance(metadata.get(key), str):
            raise fail(f"metadata.{key} must be a string")

    objects = tuple(_parse_object(o, fail) for o in raw["objects"])
    by_name: dict[str, ObjectEntry] = {}
    end = 0
    for obj in objects:
        if obj.name in by_name:
            raise fail(f"duplicate object {obj.name!r}")
        by_name[obj.name] = obj
        if obj.offset < end:
            raise fail(f"object {obj.name!r} overlaps the previous one or is out of order")
        end = obj.offset + obj.nbytes
    if end > payload_len:
        raise fail(f"objects end at {end} but the payload has {payload_len} bytes")

    bindings = {}
    for name, b in raw["bindings"].items():
        obj = by_name.get(b["object"])
        if obj is None:
            raise fail(f"binding {name!r} refers to unknown object {b['object']!r}")
        rows = b.get("rows")
        if rows is not None:
            if not isinstance(rows, list) or len(rows) != 2:
                raise fail(f"binding {name!r} rows must be [start, stop]")
            start, stop = int(rows[0]), int(rows[1])
            if not obj.shape or not 0 <= start < stop <= obj.shape[0]:
                raise fail(f"binding {name!r} rows {rows} outside object {obj.name!r} {obj.shape}")
            rows = (start, stop)
        bindings[name] = Binding(name, obj.name, Use(b["use"]), rows)

    resources = {}
    for name, r in raw["resources"].items():
        obj = by_name.get(r["object"])
        if obj is None or obj.dtype is not DType.UINT8 or len(obj.shape) != 1:
            raise fail(f"resource {name!r} must refer to a 1-D uint8 object")
        resources[name] = ResourceEntry(name, obj.name, str(r["media_type"]))
    return ArtifactHeader(config, metadata, objects, bindings, resources)


def _parse_object(o: dict, fail) -> ObjectEntry:
    name = o["name"]
    dtype = DType(o["dtype"])
    shape = tuple(int(d) for d in o["shape"])
    offset, nbytes, digest = int(o["offset"]), int(o["nbytes"]), o["sha256"]
    if not isinstance(name, str) or not name:
        raise fail("object without a name")
    if any(d < 0 for d in shape):
        raise fail(f"object {name!r} has a negative dimension {shape}")
    if nbytes != math.prod(shape) * dtype.itemsize:
        raise fail(f"object {name!r}: nbytes {nbytes} != {shape} x {dtype.itemsize}")
    if offset < 0 or offset % OBJECT_ALIGNMENT:
        raise fail(f"object {name!r}: offset {offset} is not {OBJECT_ALIGNMENT}-aligned")
    if not isinstance(digest, str) or not _HEX64.match(digest):
        raise fail(f"object {name!r}: sha256 must be 64 lowercase hex digits")
    return ObjectEntry(name, dtype, shape, offset, nbytes, digest)
