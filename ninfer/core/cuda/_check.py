"""`CudaError` and `check`: every CUDA driver/runtime call made through cuda-python is checked.

cuda-python calls return a tuple `(status, *values)`. `check(result, op)` raises `CudaError`
naming the operation and the CUDA error when `status` is not success, and otherwise returns the
values (None, one value, or a tuple).
"""
from __future__ import annotations

from ninfer.errors import NinferError


class CudaError(NinferError):
    """A CUDA call failed: `op` is the call (e.g. "cuGraphLaunch"), `code`/`name` the CUDA error."""

    def __init__(self, op: str, code: int, name: str, detail: str = ""):
        message = f"{op} failed: {name} ({code})"
        if detail:
            message += f": {detail}"
        super().__init__(message)
        self.op = op
        self.code = code
        self.name = name


def _error_name(status) -> str:
    from cuda.bindings import driver, runtime

    try:
        if isinstance(status, driver.CUresult):
            err, name = driver.cuGetErrorName(status)
            if err == driver.CUresult.CUDA_SUCCESS and name:
                return name.decode() if isinstance(name, bytes) else str(name)
        elif isinstance(status, runtime.cudaError_t):
            err, name = runtime.cudaGetErrorName(status)
            if name:
                return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # the name is decoration; never mask the original failure
        pass
    return getattr(status, "name", str(status))


def check(result, op: str):
    """Raise `CudaError` unless `result[0]` is success; return the remaining values.

    Returns None when the call has no outputs, the single output, or a tuple of outputs.
    """
    if not isinstance(result, tuple):
        result = (result,)
    status, values = result[0], result[1:]
    if int(status) != 0:
        raise CudaError(op, int(status), _error_name(status))
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return values
