"""The safetensors format, read and written without torch.

File = u64 little-endian header length N, N bytes of JSON (`{name: {dtype, shape,
data_offsets: [begin, end]}, "__metadata__": {...}}`, offsets relative to the data start at
8 + N), then the tensor data. Reading memory-maps the file; arrays are read-only views in their
storage dtype (BF16 as uint16).
"""
from __future__ import annotations

import dataclasses
import json
import math
import mmap
import os
import struct
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from ninfer.errors import ConversionError

# safetensors dtype code -> (itemsize, numpy storage dtype or None if numpy cannot hold it)
ST_DTYPES: dict[str, tuple[int, str | None]] = {
    "BOOL": (1, "bool"), "U8": (1, "uint8"), "I8": (1, "int8"), "F8_E4M3": (1, None),
    "F8_E5M2": (1, None), "F8_E8M0": (1, None), "I16": (2, "int16"), "U16": (2, "uint16"),
    "F16": (2, "float16"), "BF16": (2, "uint16"), "I32": (4, "int32"), "U32": (4, "uint32"),
    "F32": (4, "float32"), "F64": (8, "float64"), "I64": (8, "int64"), "U64": (8, "uint64"),
}
_MAX_HEADER = 100 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    dtype: str                 # safetensors code, e.g. "BF16"
    shape: tuple[int, ...]
    begin: int                 # absolute byte offsets in the file
    end: int
    path: Path


class SafetensorsFile:
    """One `.safetensors` file: validated header + read-only memory map."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError as exc:
            raise ConversionError(f"cannot open {self.path}: {exc.strerror}") from None
        try:
            size = os.fstat(fd).st_size
            self.tensors, self.metadata = _parse_header(self.path, fd, size)
            self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else None
        finally:
            os.close(fd)

    def array(self, name: str) -> np.ndarray:
        """Read-only view of tensor `name` in its storage dtype (no copy)."""
        info = self.tensors[name]
        storage = ST_DTYPES.get(info.dtype, (0, None))[1]
        if storage is None:
            raise ConversionError(f"tensor {name!r} has dtype {info.dtype}, which NumPy cannot "
                                  f"represent")
        count = math.prod(info.shape)
        if count == 0:
            empty = np.empty(info.shape, dtype=storage)
            empty.flags.writeable = False
            return empty
        return np.frombuffer(self._map, dtype=storage, count=count,
                             offset=info.begin).reshape(info.shape)

    def release(self, name: str) -> None:
        """Drop the pages of tensor `name` from this process (they are re-read if needed)."""
        info = self.tensors[name]
        page = mmap.PAGESIZE
        start = info.begin // page * page
        if self._map is not None and info.end > start and hasattr(self._map, "madvise"):
            self._map.madvise(mmap.MADV_DONTNEED, start, info.end - start)

    def close(self) -> None:
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:
                pass
            self._map = None


def _parse_header(path: Path, fd: int, size: int) -> tuple[dict[str, TensorInfo], dict]:
    def bad(msg: str) -> ConversionError:
        return ConversionError(f"{path}: {msg}")

    if size < 8:
        raise bad(f"truncated safetensors file ({size} bytes, no header)")
    (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
    if n > _MAX_HEADER:
        raise bad(f"not a safetensors file (header length {n})")
    if 8 + n > size:
        raise bad(f"truncated safetensors file (header needs {8 + n} bytes, file has {size})")
    try:
        header = json.loads(os.pread(fd, n, 8).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise bad("safetensors header is not a JSON object")
    data_start, data_len = 8 + n, size - 8 - n
    metadata = header.pop("__metadata__", None) or {}
    tensors = {}
    for name, entry in header.items():
        try:
            dtype, shape = entry["dtype"], tuple(int(d) for d in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise bad(f"malformed safetensors entry for {name!r}") from None
        itemsize = ST_DTYPES.get(dtype, (None, None))[0]
        if itemsize is not None and end - begin != math.prod(shape) * itemsize:
            raise bad(f"tensor {name!r}: {end - begin} bytes for shape {list(shape)} {dtype}")
        if not 0 <= begin <= end:
            raise bad(f"tensor {name!r} has invalid data offsets [{begin}, {end}]")
        if end > data_len:
            raise bad(f"truncated safetensors file (tensor {name!r} ends at data byte {end}, "
                      f"file has {data_len} data bytes)")
        tensors[name] = TensorInfo(name, dtype, shape, data_start + begin, data_start + end, path)
    return tensors, metadata


def write_safetensors(path: str | os.PathLike, entries: Sequence[tuple[str, str, tuple[int, ...]]],
                      fill: Callable[[str], Iterable[np.ndarray]],
                      metadata: dict[str, str] | None = None) -> Path:
    """Write `entries` = [(name, dtype code, shape)] in order; `fill(name)` yields the tensor's
    raw storage (C order) in one or more arrays. Peak memory is one yielded array."""
    path = Path(path)
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name, dtype, shape in entries:
        nbytes = math.prod(shape) * ST_DTYPES[dtype][0]
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, dtype, shape in entries:
            want = math.prod(shape) * ST_DTYPES[dtype][0]
            got = 0
            for chunk in fill(name):
                data = np.ascontiguousarray(chunk)
                got += data.nbytes
                f.write(memoryview(data.reshape(-1).view(np.uint8)))
            if got != want:
                raise ValueError(f"tensor {name!r}: fill wrote {got} bytes, expected {want}")
    return path
