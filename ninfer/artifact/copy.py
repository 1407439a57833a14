"""Rewrite an artifact through the reader and writer (used by tests and format migrations)."""
from __future__ import annotations

import os
from pathlib import Path

from ninfer.artifact.progress import ProgressMode
from ninfer.artifact.reader import Artifact
from ninfer.artifact.writer import ObjectSpec, write_artifact

_COPY_ROWS_BYTES = 64 << 20


def copy_artifact(src: str | os.PathLike, dst: str | os.PathLike, *, verify: bool = True,
                  progress: ProgressMode = False) -> Path:
    """Read `src` and write the same header and objects to `dst`.

    The result is byte-identical to `src`: layout and JSON encoding are functions of the header."""
    with Artifact.open(src, verify=verify, progress=progress) as art:
        header = art.header
        specs = [ObjectSpec(o.name, o.dtype, o.shape) for o in header.objects]

        def fill(spec: ObjectSpec):
            flat = art.object_array(spec.name).reshape(-1)
            step = max(1, _COPY_ROWS_BYTES // max(1, flat.itemsize))
            for start in range(0, flat.size, step):
                yield flat[start:start + step]

        return write_artifact(dst, config=header.config, metadata=header.metadata,
                              objects=specs, bindings=list(header.bindings.values()),
                              resources=list(header.resources.values()), fill=fill,
                              progress=progress, desc="copy")
