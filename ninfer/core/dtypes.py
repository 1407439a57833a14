"""Element types of stored weights and activations.

bf16 has no NumPy dtype: it is stored as raw 16-bit patterns in `uint16` arrays and widened to
float32 inside kernels (`f32_bits = u16 << 16`). Conversion from float32 rounds to nearest even.
"""
from __future__ import annotations

import enum

import numpy as np


class DType(str, enum.Enum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    INT32 = "int32"
    INT64 = "int64"
    UINT8 = "uint8"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def storage(self) -> np.dtype:
        """NumPy dtype of the raw storage (bf16 -> uint16)."""
        return np.dtype(_STORAGE[self])

    @classmethod
    def parse(cls, name: str) -> "DType":
        key = _ALIASES.get(name.lower(), name.lower())
        try:
            return cls(key)
        except ValueError:
            raise ValueError(
                f"unknown dtype {name!r}; known: {', '.join(d.value for d in cls)}"
            ) from None


_ITEMSIZE = {
    DType.FLOAT32: 4, DType.BFLOAT16: 2, DType.FLOAT16: 2,
    DType.INT32: 4, DType.INT64: 8, DType.UINT8: 1,
}
_STORAGE = {
    DType.FLOAT32: "float32", DType.BFLOAT16: "uint16", DType.FLOAT16: "float16",
    DType.INT32: "int32", DType.INT64: "int64", DType.UINT8: "uint8",
}
_ALIASES = {
    "f32": "float32", "fp32": "float32", "bf16": "bfloat16", "f16": "float16",
    "fp16": "float16", "i32": "int32", "i64": "int64", "u8": "uint8",
    # safetensors spellings
    "bf16 ": "bfloat16",
}


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 values to bf16 (nearest even) and return the raw uint16 patterns.

    NaN stays NaN (quiet); infinities stay infinite.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    bits = x.view(np.uint32)
    is_nan = np.isnan(x)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    out = ((bits + rounding) >> 16).astype(np.uint16)
    if is_nan.any():
        out[is_nan] = ((bits[is_nan] >> 16) | 0x0040).astype(np.uint16)
    return out


def bf16_bits_to_f32(bits: np.ndarray, xp=np) -> np.ndarray:
    """Widen raw bf16 patterns (uint16) to float32 exactly (`xp`: numpy, or cupy for a device
    array)."""
    bits = xp.ascontiguousarray(bits, dtype=xp.uint16)
    return (bits.astype(xp.uint32) << 16).view(xp.float32)


def round_to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 -> float32 (the value a bf16 store would keep)."""
    return bf16_bits_to_f32(f32_to_bf16_bits(x))


def to_float32(raw: np.ndarray, dtype: DType) -> np.ndarray:
    """Decode raw storage of `dtype` to float32 (a copy). For tests and small tensors only."""
    if dtype is DType.BFLOAT16:
        return bf16_bits_to_f32(raw)
    return np.asarray(raw, dtype=np.float32)
