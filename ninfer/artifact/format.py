"""Byte layout of a `.ninfer` v3 file: the fixed prefix, alignment rules and header encoding.

    offset 0    prefix (72 bytes, little-endian)
                  magic            8s   b"NINFER\\x00\\x00"
                  version          u32  3
                  flags            u32  0 (reserved)
                  header_len       u64  bytes of the JSON header
                  payload_offset   u64  absolute start of the payload, a multiple of 4096
                  payload_len      u64  payload bytes; file size == payload_offset + payload_len
                  header_sha256    32s  SHA-256 of the JSON header bytes
    offset 72   JSON header (UTF-8, ASCII-only, sorted keys, no whitespace)
                zero padding up to payload_offset
    payload     objects at `payload_offset + object.offset`; each offset a multiple of 64,
                zero padding between objects

`docs/artifact.md` is the normative description; this module is its executable form.
"""
from __future__ import annotations

import dataclasses
import json
import struct

from ninfer.errors import ArtifactError

MAGIC = b"NINFER\x00\x00"
VERSION = 3
OBJECT_ALIGNMENT = 64
PAYLOAD_ALIGNMENT = 4096
# The JSON header may not exceed this; it guards against reading garbage lengths.
MAX_HEADER_BYTES = 256 << 20

_PREFIX = struct.Struct("<8sIIQQQ32s")
PREFIX_SIZE = _PREFIX.size  # 72


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


@dataclasses.dataclass(frozen=True, slots=True)
class Prefix:
    header_len: int
    payload_offset: int
    payload_len: int
    header_sha256: bytes
    version: int = VERSION
    flags: int = 0

    def pack(self) -> bytes:
        return _PREFIX.pack(MAGIC, self.version, self.flags, self.header_len,
                            self.payload_offset, self.payload_len, self.header_sha256)

    @classmethod
    def unpack(cls, raw: bytes, *, path: str) -> "Prefix":
        if len(raw) < PREFIX_SIZE:
            raise ArtifactError(f"{path}: not a .ninfer artifact (file is only {len(raw)} bytes)")
        magic, version, flags, header_len, payload_offset, payload_len, digest = _PREFIX.unpack(
            raw[:PREFIX_SIZE])
        if magic != MAGIC:
            raise ArtifactError(f"{path}: not a .ninfer artifact (bad magic {magic!r})")
        if version != VERSION:
            raise ArtifactError(
                f"{path}: artifact format version {version} is not supported (this reader "
                f"reads version {VERSION}); re-convert the checkpoint")
        if header_len > MAX_HEADER_BYTES or PREFIX_SIZE + header_len > payload_offset:
            raise ArtifactError(f"{path}: corrupt prefix (header length {header_len}, "
                                f"payload offset {payload_offset})")
        if payload_offset % PAYLOAD_ALIGNMENT:
            raise ArtifactError(f"{path}: corrupt prefix (payload offset {payload_offset} is not "
                                f"{PAYLOAD_ALIGNMENT}-aligned)")
        return cls(header_len, payload_offset, payload_len, digest, version, flags)


def encode_header(header: dict) -> bytes:
    """Canonical JSON bytes: sorted keys, compact separators, ASCII only (deterministic)."""
    return json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def decode_header(raw: bytes, *, path: str) -> dict:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{path}: header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ArtifactError(f"{path}: header is not a JSON object")
    return header
