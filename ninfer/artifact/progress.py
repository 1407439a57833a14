"""Byte-count progress bars for convert and verify (tqdm on stderr).

`progress` is tri-state everywhere it is accepted: False (never), True (when stderr is a
terminal) or "force" (always, e.g. under a CI log).
"""
from __future__ import annotations

import sys
from typing import Union

ProgressMode = Union[bool, str]


def byte_bar(total: int, desc: str, progress: ProgressMode):
    """A tqdm bar counting bytes; call `.update(n)` and `.close()` (or use it as a context)."""
    from tqdm import tqdm

    if progress not in (True, False, "force"):
        raise ValueError(f"progress must be True, False or 'force', got {progress!r}")
    disable = {False: True, True: None, "force": False}[progress]
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                file=sys.stderr, disable=disable, leave=False, dynamic_ncols=True)
