"""Full integrity check of an artifact: every object, not only the bound ones."""
from __future__ import annotations

import os

from ninfer.artifact import Artifact
from ninfer.artifact.progress import ProgressMode


def verify_artifact(path: str | os.PathLike, *, progress: ProgressMode = True) -> tuple[int, int]:
    """Recompute every object's SHA-256. Returns (objects, bytes) checked.

    Raises `ArtifactIntegrityError` naming the first bad object, `ArtifactError` if the file
    is not a well-formed artifact."""
    with Artifact.open(path, verify=False) as art:
        art.verify(progress=progress)
        return len(art.objects), sum(o.nbytes for o in art.objects.values())
