"""Which backend an array lives on, decided by its type (never by catching an exception)."""
from __future__ import annotations

import enum

import numpy as np


class Backend(enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"


def backend_of(*arrays) -> Backend:
    """The backend of `arrays` (NumPy -> CPU, CuPy -> CUDA); all must agree.

    `Weight` objects are accepted and looked through. Raises TypeError on a mix or an unknown type.
    """
    found: Backend | None = None
    for arr in arrays:
        data = getattr(arr, "data", arr) if not isinstance(arr, np.ndarray) else arr
        if isinstance(data, np.ndarray):
            this = Backend.CPU
        elif type(data).__module__.startswith("cupy"):
            this = Backend.CUDA
        else:
            raise TypeError(f"unsupported array type {type(data).__name__}")
        if found is None:
            found = this
        elif found is not this:
            raise TypeError(f"operands live on different backends ({found.value} and {this.value})")
    if found is None:
        raise TypeError("no array operands")
    return found
