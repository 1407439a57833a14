"""Tensor maps (CUtensorMap) for bulk tensor copies of KV tiles (sm_90; cuda-python's
cuTensorMapEncodeTiled; imported lazily, CPU installs never load it).

`kv_tile_map(pages)` describes bf16 pages [P, Hkv, page_size, D] (D = 64, 128 or 256, contiguous,
16-byte aligned, an even number of key rows) so that one copy
(`bulk_tensor_g2s_4d` in bulk_copy.cuh, coordinates (0, row / 2, 0, 0)) brings the 16 key rows
row .. row + 15 of one KV head (row a multiple of 16) into 2 D * 16 bytes of shared memory
(1024-byte aligned) in this layout, with the 128-byte swizzle:

    key k = 2 q + h (pair q = 0..7, parity h = 0..1), dims [64 c, 64 c + 64) (chunk c < D / 64):
    the 128-byte line L = q + 8 h + 16 c; its 16-byte unit u (dims 64 c + 8 u .. + 7) at byte
    128 L + 16 (u ^ q).

The 4-d view behind it: dim 0 the 64 dims of a chunk, dim 1 key pairs (stride 4 D bytes, all
P * Hkv * page_size / 2 of them), dim 2 the key's parity (stride 2 D bytes), dim 3 the chunk
(stride 128 bytes); box (64, 8, 2, D / 64). So the 8 keys 2 q + h (q = 0..7) that one ldmatrix
phase of the decode attention reads sit in 8 distinct bank groups (XOR with q), in one copy
per 8 KiB (2 rows per copy with a 16-byte shift did the same with 8 times the copies).
"""
from __future__ import annotations

import numpy as np

TILE_KEYS = 16
MAP_BYTES = 128
_CACHE: dict[tuple, np.ndarray] = {}  # kv_tile_map's maps and kv_maps_arg's pairs
_CACHE_MAX = 64


def _cached(key: tuple, make) -> np.ndarray:
    found = _CACHE.get(key)
    if found is None:
        found = make()
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = found
    return found


def _pages_key(pages) -> tuple:
    return int(pages.data.ptr), tuple(pages.shape)


def kv_tile_map(pages) -> np.ndarray:
    """The 128 bytes (uint64[16]) of the tensor map of `pages` (bf16 bits, uint16 CuPy array
    [P, Hkv, page_size, D]; layout in the module doc). Cached by address and shape (a map
    depends on nothing else); encoding needs the CUDA driver (cuda-python)."""
    return _cached(("map",) + _pages_key(pages), lambda: _encode(pages))


def _encode(pages) -> np.ndarray:
    num_pages, kv_heads, page_size, dim = pages.shape
    rows = num_pages * kv_heads * page_size
    if dim not in (64, 128, 256) or rows % 2 or pages.dtype != np.uint16:
        raise ValueError(f"kv_tile_map: bf16 pages of D 64/128/256 and an even row count, got "
                         f"{pages.dtype} {tuple(pages.shape)}")
    from cuda.bindings import driver as cu

    chunks = dim // 64
    dims = [64, rows // 2, 2, chunks]
    strides = [4 * dim, 2 * dim, 128]  # bytes, dims 1..3
    box = [64, TILE_KEYS // 2, 2, chunks]
    err, tmap = cu.cuTensorMapEncodeTiled(
        cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, int(pages.data.ptr),
        [cu.cuuint64_t(d) for d in dims], [cu.cuuint64_t(s) for s in strides],
        [cu.cuuint32_t(b) for b in box], [cu.cuuint32_t(1)] * 4,
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuTensorMapEncodeTiled({tuple(pages.shape)}): {err.name}")
    return np.array([int(x) for x in tmap.opaque], dtype=np.uint64)


def kv_maps_arg(k_pages, v_pages) -> np.ndarray:
    """The kernel argument holding the K and the V pages' maps (256 bytes, passed by value as a
    `__grid_constant__` struct of two CUtensorMap; cached, like the maps)."""
    def make():
        both = np.concatenate([kv_tile_map(k_pages), kv_tile_map(v_pages)])
        return np.frombuffer(both.tobytes(), dtype=np.dtype((np.void, 2 * MAP_BYTES)))

    return _cached(("arg",) + _pages_key(k_pages) + _pages_key(v_pages), make)


def swizzled_offset(key: int, dim: int) -> int:
    """Byte offset in a tile's shared memory of (key 0..15, dim) in the layout of the module
    doc (the CPU mirror of the kernel's ldmatrix addressing; tests)."""
    q, h = key >> 1, key & 1
    c, u, e = dim // 64, (dim % 64) // 8, dim % 8
    return 128 * (q + 8 * h + 16 * c) + 16 * (u ^ q) + 2 * e
