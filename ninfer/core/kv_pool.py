"""Paged KV storage for the full-attention layers, its page allocator and per-sequence block tables.

Layout (docs/ops.md, "Paged KV"): per attention layer one K and one V array
`[num_pages, Hkv, page_size, D]` (float32, or bf16 stored as uint16). A page id addresses the same
page in every layer, so one block table per sequence covers all layers: position p lives in page
`page_ids[p // page_size]` at offset `p % page_size`.

This module is bookkeeping and storage only: it never decides who gets pages (no policy).
"""
from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Iterable

import numpy as np

from ninfer.core.dtypes import DType

KV_DTYPES = (DType.FLOAT32, DType.BFLOAT16)


class PagedKVPool:
    """K/V page arrays for `num_layers` attention layers (index = attention-layer ordinal).

    `k[layer]` / `v[layer]` are `[num_pages, num_kv_heads, page_size, head_dim]` arrays of `xp`
    (NumPy, or CuPy on the GPU), zero-initialised, owned by the pool.
    """

    def __init__(self, num_layers: int, num_pages: int, num_kv_heads: int, page_size: int,
                 head_dim: int, dtype: DType, xp: ModuleType = np):
        for name, value in (("num_layers", num_layers), ("num_pages", num_pages),
                            ("num_kv_heads", num_kv_heads), ("page_size", page_size),
                            ("head_dim", head_dim)):
            if value < 1:
                raise ValueError(f"PagedKVPool: {name} must be >= 1, got {value}")
        if dtype not in KV_DTYPES:
            raise ValueError(f"PagedKVPool: dtype must be float32 or bfloat16, got {dtype.value}")
        self.num_layers = num_layers
        self.num_pages = num_pages
        self.num_kv_heads = num_kv_heads
        self.page_size = page_size
        self.head_dim = head_dim
        self.dtype = dtype
        shape = (num_pages, num_kv_heads, page_size, head_dim)
        self.k = [xp.zeros(shape, dtype=dtype.storage) for _ in range(num_layers)]
        self.v = [xp.zeros(shape, dtype=dtype.storage) for _ in range(num_layers)]

    @property
    def page_shape(self) -> tuple[int, int, int, int]:
        return (self.num_pages, self.num_kv_heads, self.page_size, self.head_dim)

    @staticmethod
    def bytes_per_page(num_layers: int, num_kv_heads: int, page_size: int, head_dim: int,
                       dtype: DType) -> int:
        """Bytes one page id costs over all layers, K and V (for capacity planning)."""
        return 2 * num_layers * num_kv_heads * page_size * head_dim * dtype.itemsize

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.k + self.v)

    def copy_pages(self, src_ids: Iterable[int], dst_ids: Iterable[int]) -> None:
        """Copy whole pages src -> dst in every layer (copy-on-write of a shared tail page)."""
        src = np.asarray(list(src_ids), dtype=np.int64)
        dst = np.asarray(list(dst_ids), dtype=np.int64)
        if src.shape != dst.shape:
            raise ValueError("copy_pages: src_ids and dst_ids differ in length")
        for arrays in (self.k, self.v):
            for a in arrays:
                a[dst] = a[src]


class PageAllocator:
    """Free list of page ids 0..num_pages-1. Not thread-safe: one owner (the engine thread).

    `allocate` and `free` are O(n) in the pages moved, never in the pool size.
    """

    def __init__(self, num_pages: int):
        if num_pages < 0:
            raise ValueError(f"PageAllocator: num_pages must be >= 0, got {num_pages}")
        self.num_pages = num_pages
        # Popping from the end hands out low ids first (deterministic, easy to read in tests).
        self._free: list[int] = list(range(num_pages - 1, -1, -1))
        self._used = bytearray(num_pages)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    def can_allocate(self, n: int) -> bool:
        return 0 <= n <= len(self._free)

    def allocate(self, n: int) -> list[int] | None:
        """n page ids, or None (and nothing taken) when fewer than n are free."""
        if n < 0:
            raise ValueError(f"PageAllocator.allocate: n must be >= 0, got {n}")
        if n > len(self._free):
            return None
        ids = self._free[len(self._free) - n:][::-1]
        del self._free[len(self._free) - n:]
        for i in ids:
            self._used[i] = 1
        return ids

    def free(self, ids: Iterable[int]) -> None:
        """Return pages; raises ValueError (changing nothing) on an unknown or already free id."""
        ids = list(ids)
        seen = set()
        for i in ids:
            if not 0 <= i < self.num_pages or not self._used[i] or i in seen:
                raise ValueError(f"PageAllocator.free: page {i} is not allocated")
            seen.add(i)
        for i in ids:
            self._used[i] = 0
        self._free.extend(reversed(ids))

    def check_integrity(self) -> None:
        """Raise AssertionError if the free list and the used flags disagree."""
        free = self._free
        if len(set(free)) != len(free):
            raise AssertionError("PageAllocator: a page is on the free list twice")
        if any(self._used[i] for i in free):
            raise AssertionError("PageAllocator: a free page is marked used")
        used = sum(self._used)
        if used + len(free) != self.num_pages:
            raise AssertionError(
                f"PageAllocator: {used} used + {len(free)} free != {self.num_pages} pages")


@dataclasses.dataclass(slots=True)
class BlockTable:
    """The page ids of one sequence, in position order (one table covers every layer)."""

    page_size: int
    page_ids: list[int] = dataclasses.field(default_factory=list)

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold `num_tokens` positions."""
        return -(-num_tokens // self.page_size)

    def missing_pages(self, num_tokens: int) -> int:
        """Pages to add so the table holds `num_tokens` positions (0 if it already does)."""
        return max(0, self.pages_for(num_tokens) - len(self.page_ids))

    @property
    def capacity(self) -> int:
        """Positions the current pages hold."""
        return len(self.page_ids) * self.page_size

    def append(self, ids: Iterable[int]) -> None:
        self.page_ids.extend(ids)

    def release(self) -> list[int]:
        """Remove and return every page id (the caller frees them)."""
        ids, self.page_ids = self.page_ids, []
        return ids

    def write_row(self, row: np.ndarray) -> None:
        """Write the ids into one row of an int32 `block_tables` array (rest left as is)."""
        if len(self.page_ids) > row.shape[0]:
            raise ValueError(f"BlockTable: {len(self.page_ids)} pages exceed the row width "
                             f"{row.shape[0]}")
        row[:len(self.page_ids)] = self.page_ids
