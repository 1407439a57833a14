"""The `.ninfer` v3 artifact container: reader, streaming writer, digests (format: docs/artifact.md).

- `Artifact.open(path, verify=True)`: memory-mapped reader; `weight(name)`, `binding(name)`,
  `object_array(name)`, `resource(name)`, `parent_groups()`, `verify()`.
- `write_artifact(path, config=, metadata=, objects=, bindings=, resources=, fill=)`: streaming,
  atomic writer.
- `copy_artifact(src, dst)`: read + rewrite (byte-identical).
"""
from ninfer.artifact.copy import copy_artifact
from ninfer.artifact.format import MAGIC, OBJECT_ALIGNMENT, PAYLOAD_ALIGNMENT, VERSION
from ninfer.artifact.header import ArtifactHeader, Binding, ObjectEntry, ResourceEntry, Use
from ninfer.artifact.reader import Artifact
from ninfer.artifact.writer import ObjectSpec, write_artifact

__all__ = [
    "MAGIC", "OBJECT_ALIGNMENT", "PAYLOAD_ALIGNMENT", "VERSION", "Artifact", "ArtifactHeader",
    "Binding", "ObjectEntry", "ObjectSpec", "ResourceEntry", "Use", "copy_artifact",
    "write_artifact",
]
