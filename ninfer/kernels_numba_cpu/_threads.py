"""Launch policy: small kernels run on the calling thread alone.

Waking Numba's worker threads costs tens of microseconds on an idle machine and, when the cores
are shared with other processes, up to a scheduler tick (milliseconds). Below PARALLEL_MIN_WORK
(a rough count of element operations: multiply-adds for products, elements for elementwise ops)
a kernel is launched with one thread. Results never depend on the thread count: every kernel
computes each output element in a fixed order whatever the partition.
"""
from __future__ import annotations

import numba

PARALLEL_MIN_WORK = 1 << 22


def launch(kernel, work: int, *args):
    """kernel(*args), on one thread if `work` is below PARALLEL_MIN_WORK."""
    if work >= PARALLEL_MIN_WORK:
        return kernel(*args)
    saved = numba.get_num_threads()
    if saved == 1:
        return kernel(*args)
    numba.set_num_threads(1)
    try:
        return kernel(*args)
    finally:
        numba.set_num_threads(saved)
