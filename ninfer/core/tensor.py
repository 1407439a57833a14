"""`Weight`: a read-only parameter tensor with its element type.

`data` is the raw storage (NumPy on the CPU, CuPy on a GPU): float32 as float32, bf16 as uint16
bit patterns. Views of a fused parent (row ranges) are plain array views of the parent's storage,
so a shared object lives once per device.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ninfer.core.dtypes import DType


@dataclasses.dataclass(frozen=True, slots=True)
class Weight:
    data: Any  # np.ndarray or cupy.ndarray of dtype.storage
    dtype: DType

    def __post_init__(self) -> None:
        if self.data.dtype != self.dtype.storage:
            raise TypeError(
                f"Weight storage dtype {self.data.dtype} does not match {self.dtype.value} "
                f"(expects {self.dtype.storage})"
            )

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def rows(self, start: int, stop: int) -> "Weight":
        """A view of rows [start, stop) along the first axis."""
        return Weight(self.data[start:stop], self.dtype)

    def __getitem__(self, index) -> "Weight":
        return Weight(self.data[index], self.dtype)
