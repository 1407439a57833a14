"""What both backends share about their physical stores: slot bookkeeping and snapshot sizing.

A backend sets `self.kv` (PagedKVPool), `self.states` (StateImageStorage) and `self.pages`
(PageAllocator); placement-specific methods (zeroing a slot, writing block tables, copies)
stay in each backend.
"""
from __future__ import annotations

from ninfer.core.kv_pool import PagedKVPool


class BackendStores:
    kv: PagedKVPool
    states: object
    pages: object

    def slots_free(self) -> int:
        return self.states.num_free

    def allocate_slot(self) -> int:
        slot = self.states.allocate()
        if slot is None:
            raise RuntimeError("no free StateImage slot (checked before allocating)")
        return slot

    def free_slot(self, slot: int) -> None:
        self.states.free(slot)

    def snapshot_bytes(self, frontier: int) -> int:
        """Host bytes of a Snapshot at `frontier`: one state image + the KV pages covering it."""
        kv = self.kv
        pages = -(-frontier // kv.page_size)
        return self.states.layout.image_bytes + pages * PagedKVPool.bytes_per_page(
            kv.num_layers, kv.num_kv_heads, kv.page_size, kv.head_dim, kv.dtype)
