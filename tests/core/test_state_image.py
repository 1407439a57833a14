"""StateImageLayout offsets and StateImageStorage views, slots and snapshots."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.core.state_image import (FIELD_ALIGN, GdnStateShape, StateImageLayout,
                                     StateImageStorage)

SHAPE = GdnStateShape(conv_kernel=4, conv_channels=13, num_v_heads=3, key_dim=5, value_dim=7)


def test_layout_offsets_are_in_layer_order_and_aligned():
    layout = StateImageLayout.uniform(3, SHAPE)
    conv, rec = 3 * 13, 3 * 5 * 7
    assert layout.conv_offset(0) == 0
    for i in range(3):
        assert layout.rec_offset(i) >= layout.conv_offset(i) + conv
        assert layout.conv_offset(i) % FIELD_ALIGN == 0 and layout.rec_offset(i) % FIELD_ALIGN == 0
        if i:
            assert layout.conv_offset(i) >= layout.rec_offset(i - 1) + rec
    assert layout.image_floats >= layout.rec_offset(2) + rec
    assert layout.image_floats % FIELD_ALIGN == 0 and layout.image_bytes == 4 * layout.image_floats


def test_views_are_strided_windows_of_one_array():
    layout = StateImageLayout.uniform(2, SHAPE)
    store = StateImageStorage(layout, 3)
    conv, rec = store.conv_view(1), store.rec_view(1)
    assert conv.shape == (3, 3, 13) and rec.shape == (3, 3, 5, 7)
    assert conv.strides[0] == rec.strides[0] == 4 * layout.image_floats
    assert np.shares_memory(conv, store.data) and np.shares_memory(rec, store.data)
    rec[2, 1, 4, 6] = 5.0
    flat_index = layout.rec_offset(1) + (1 * 5 + 4) * 7 + 6
    assert store.data[2, flat_index] == 5.0
    conv[0] = 1.0
    assert np.count_nonzero(store.data) == 1 + 3 * 13


def test_slots_zero_and_snapshot_round_trip():
    store = StateImageStorage(StateImageLayout.uniform(2, SHAPE), 2)
    a, b = store.allocate(), store.allocate()
    assert (a, b) == (0, 1) and store.allocate() is None and store.num_free == 0
    rng = np.random.default_rng()
    store.data[:] = rng.standard_normal(store.data.shape)
    snap = store.copy_out(a)
    assert not np.shares_memory(snap, store.data)
    store.zero(a)
    assert not store.data[a].any() and store.data[b].all()
    store.copy_in(a, snap)
    assert np.array_equal(store.data[a], snap)
    with pytest.raises(ValueError, match="expected float32"):
        store.copy_in(a, snap[:-1])
    store.free(a)
    with pytest.raises(ValueError, match="not allocated"):
        store.free(a)
    with pytest.raises(ValueError, match="not allocated"):
        store.copy_out(a)
    assert store.allocate() == a


def test_shape_validation():
    with pytest.raises(ValueError, match=">= 1"):
        GdnStateShape(4, 0, 1, 1, 1)
