"""PagedKVPool storage, PageAllocator (exact ids, atomicity, double free, integrity), BlockTable."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.core.dtypes import DType
from ninfer.core.kv_pool import BlockTable, PageAllocator, PagedKVPool


def test_pool_layout_and_dtype():
    pool = PagedKVPool(3, 5, 2, 4, 8, DType.BFLOAT16)
    assert len(pool.k) == len(pool.v) == 3
    assert pool.k[0].shape == pool.page_shape == (5, 2, 4, 8)
    assert pool.k[0].dtype == np.uint16 and pool.k[0].flags.c_contiguous
    assert pool.nbytes == 2 * 3 * 5 * 2 * 4 * 8 * 2
    assert PagedKVPool.bytes_per_page(3, 2, 4, 8, DType.BFLOAT16) * 5 == pool.nbytes
    assert pool.k[0] is not pool.k[1] and pool.k[0] is not pool.v[0]


def test_pool_copy_pages_copies_every_layer():
    pool = PagedKVPool(2, 4, 1, 2, 3, DType.FLOAT32)
    rng = np.random.default_rng(5)
    for a in pool.k + pool.v:
        a[:] = rng.standard_normal(a.shape)
    before = [a.copy() for a in pool.k + pool.v]
    pool.copy_pages([1], [3])
    for a, b in zip(pool.k + pool.v, before):
        assert np.array_equal(a[3], b[1]) and np.array_equal(a[:3], b[:3])


@pytest.mark.parametrize("bad", [dict(num_pages=0), dict(head_dim=0)])
def test_pool_rejects_bad_sizes(bad):
    args = dict(num_layers=1, num_pages=2, num_kv_heads=1, page_size=4, head_dim=8) | bad
    with pytest.raises(ValueError, match="must be >= 1"):
        PagedKVPool(**args, dtype=DType.FLOAT32)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        PagedKVPool(1, 2, 1, 4, 8, DType.FLOAT16)


def test_allocator_hands_out_exact_ids_and_is_atomic():
    alloc = PageAllocator(6)
    assert alloc.allocate(2) == [0, 1]
    assert alloc.allocate(3) == [2, 3, 4]
    assert alloc.num_free == 1 and alloc.num_used == 5
    assert alloc.allocate(2) is None
    assert alloc.num_free == 1, "a failed allocate takes nothing"
    alloc.free([3, 1])
    assert alloc.allocate(3) == [3, 1, 5]
    assert alloc.allocate(0) == []
    alloc.check_integrity()


def test_allocator_rejects_double_and_unknown_free_without_changes():
    alloc = PageAllocator(4)
    ids = alloc.allocate(2)
    alloc.free(ids[:1])
    for bad in ([ids[0]], [7], [-1], [ids[1], ids[1]]):
        with pytest.raises(ValueError, match="not allocated"):
            alloc.free(bad)
    assert alloc.num_free == 3
    alloc.check_integrity()


def test_allocator_integrity_detects_corruption():
    alloc = PageAllocator(3)
    alloc.allocate(1)
    alloc._free.append(1)  # simulate a bug: page 1 listed free twice
    with pytest.raises(AssertionError, match="twice"):
        alloc.check_integrity()


def test_random_allocate_free_keeps_integrity():
    rng = np.random.default_rng()
    alloc = PageAllocator(50)
    held: list[int] = []
    for _ in range(300):
        if held and rng.random() < 0.5:
            k = int(rng.integers(1, len(held) + 1))
            idx = rng.choice(len(held), k, replace=False)
            alloc.free([held[i] for i in idx])
            held = [h for i, h in enumerate(held) if i not in set(idx.tolist())]
        else:
            got = alloc.allocate(int(rng.integers(0, 8)))
            if got is not None:
                assert not set(got) & set(held)
                held += got
        assert alloc.num_used == len(held)
        alloc.check_integrity()


def test_block_table():
    table = BlockTable(page_size=4)
    assert table.pages_for(0) == 0 and table.pages_for(1) == 1 and table.pages_for(8) == 2
    assert table.missing_pages(9) == 3
    table.append([7, 2])
    assert table.capacity == 8 and table.missing_pages(8) == 0 and table.missing_pages(9) == 1
    row = np.full(4, -1, np.int32)
    table.write_row(row)
    assert row.tolist() == [7, 2, -1, -1]
    with pytest.raises(ValueError, match="exceed the row width"):
        table.write_row(np.zeros(1, np.int32))
    assert table.release() == [7, 2] and table.page_ids == []
