"""String helpers shared by the streaming parsers (stop strings, reasoning, tool calls).

A streaming parser must never emit text it may later have to take back, so whenever the text
seen so far ends with the beginning of a marker (``"<tool_c"``), that tail is held back until
the next piece decides it.
"""
from __future__ import annotations

from typing import Sequence

__all__ = ["find_first", "partial_suffix_len", "shallow_clone"]


def find_first(text: str, markers: Sequence[str]) -> tuple[int, str | None]:
    """Earliest occurrence of any marker: (index, marker), or (-1, None) when none occurs.

    At equal positions the longer marker wins.
    """
    best, found = -1, None
    for marker in markers:
        i = text.find(marker)
        if i >= 0 and (best < 0 or i < best or (i == best and len(marker) > len(found))):
            best, found = i, marker
    return best, found


def partial_suffix_len(text: str, markers: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of some marker."""
    best = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), best, -1):
            if text.endswith(marker[:n]):
                best = n
                break
    return best


def shallow_clone(obj):
    """A copy sharing every attribute value (the parsers keep only immutable values, or
    clone their mutable parts themselves); one dict copy, as previews clone per token."""
    twin = object.__new__(type(obj))
    twin.__dict__.update(obj.__dict__)
    return twin
