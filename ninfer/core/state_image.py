"""StateImage storage: every GDN layer's conv and recurrent state of one sequence, per slot.

Layout (docs/ops.md, "StateImage"): one f32 image per slot holding, for each GDN layer in layer
order, the conv state `[Kc-1, C]` then the recurrent state `[Hv, dk, dv]`. Each field starts at a
multiple of FIELD_ALIGN floats (64 bytes, for vector loads on the GPU); padding is zero. Storage is
`f32[num_slots, image_floats]`; `conv_view(i)` / `rec_view(i)` are strided views
`[num_slots, Kc-1, C]` / `[num_slots, Hv, dk, dv]` whose slot stride is `image_floats`.
"""
from __future__ import annotations

import dataclasses
import functools
from types import ModuleType

import numpy as np

FIELD_ALIGN = 16


def _align(n: int) -> int:
    return -(-n // FIELD_ALIGN) * FIELD_ALIGN


@dataclasses.dataclass(frozen=True)
class GdnStateShape:
    """One GDN layer's state sizes: conv width Kc, channels C, value heads Hv, head dims dk, dv."""

    conv_kernel: int
    conv_channels: int
    num_v_heads: int
    key_dim: int
    value_dim: int

    def __post_init__(self) -> None:
        if min(self.conv_kernel, self.conv_channels, self.num_v_heads, self.key_dim,
               self.value_dim) < 1:
            raise ValueError(f"GdnStateShape: every size must be >= 1, got {self}")

    @property
    def conv_shape(self) -> tuple[int, int]:
        return (self.conv_kernel - 1, self.conv_channels)

    @property
    def rec_shape(self) -> tuple[int, int, int]:
        return (self.num_v_heads, self.key_dim, self.value_dim)


@dataclasses.dataclass(frozen=True)
class StateImageLayout:
    """Field offsets (in floats) of every GDN layer's states inside one slot's image."""

    layers: tuple[GdnStateShape, ...]

    @classmethod
    def uniform(cls, num_layers: int, shape: GdnStateShape) -> "StateImageLayout":
        return cls(tuple([shape] * num_layers))

    @functools.cached_property
    def _offsets(self) -> tuple[tuple[int, int], ...]:
        offsets, pos = [], 0
        for shape in self.layers:
            conv = pos
            pos += _align(int(np.prod(shape.conv_shape)))
            offsets.append((conv, pos))
            pos += _align(int(np.prod(shape.rec_shape)))
        return tuple(offsets)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def conv_offset(self, i: int) -> int:
        return self._offsets[i][0]

    def rec_offset(self, i: int) -> int:
        return self._offsets[i][1]

    @functools.cached_property
    def image_floats(self) -> int:
        if not self.layers:
            return 0
        last = self.layers[-1]
        return self.rec_offset(len(self.layers) - 1) + _align(int(np.prod(last.rec_shape)))

    @property
    def image_bytes(self) -> int:
        return 4 * self.image_floats


class StateImageStorage:
    """`f32[num_slots, image_floats]` (NumPy or CuPy via `xp`) plus a slot allocator.

    Slots are handed out lowest id first; `free` rejects a slot that is not allocated. Not
    thread-safe (one owner). A freshly allocated slot is NOT zeroed: call `zero(slot)`.
    """

    def __init__(self, layout: StateImageLayout, num_slots: int, xp: ModuleType = np):
        if num_slots < 1:
            raise ValueError(f"StateImageStorage: num_slots must be >= 1, got {num_slots}")
        self.layout = layout
        self.num_slots = num_slots
        self._xp = xp
        self.data = xp.zeros((num_slots, max(1, layout.image_floats)), dtype=np.float32)
        self._free: list[int] = list(range(num_slots - 1, -1, -1))
        self._used = bytearray(num_slots)

    def conv_view(self, i: int):
        """[num_slots, Kc-1, C] view of GDN layer i's conv state (slot stride image_floats)."""
        shape = self.layout.layers[i].conv_shape
        return self._field(self.layout.conv_offset(i), shape)

    def rec_view(self, i: int):
        """[num_slots, Hv, dk, dv] view of GDN layer i's recurrent state."""
        shape = self.layout.layers[i].rec_shape
        return self._field(self.layout.rec_offset(i), shape)

    def _field(self, offset: int, shape: tuple[int, ...]):
        size = int(np.prod(shape))
        return self.data[:, offset:offset + size].reshape((self.num_slots,) + shape)

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self) -> int | None:
        if not self._free:
            return None
        slot = self._free.pop()
        self._used[slot] = 1
        return slot

    def free(self, slot: int) -> None:
        self._check_slot(slot)
        self._used[slot] = 0
        self._free.append(slot)

    def zero(self, slot: int) -> None:
        self._check_slot(slot)
        self.data[slot] = 0

    def copy_out(self, slot: int) -> np.ndarray:
        """A host (NumPy) copy of the slot's image, f32[image_floats] (a Snapshot's state)."""
        self._check_slot(slot)
        row = self.data[slot]
        return row.get() if hasattr(row, "get") else row.copy()

    def copy_in(self, slot: int, image: np.ndarray) -> None:
        """Overwrite the slot's image with `image` (f32[image_floats], e.g. from copy_out)."""
        self._check_slot(slot)
        image = np.asarray(image)
        if image.dtype != np.float32 or image.shape != (self.data.shape[1],):
            raise ValueError(f"StateImageStorage.copy_in: expected float32[{self.data.shape[1]}], "
                             f"got {image.dtype}{list(image.shape)}")
        self.data[slot] = self._xp.asarray(image)

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots or not self._used[slot]:
            raise ValueError(f"StateImageStorage: slot {slot} is not allocated")
