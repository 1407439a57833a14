"""paged_attention's launch planning, on the CPU: chunk sizes (a function of the row's own length
only), that every launched instance is built, and that a block's shared memory fits the blocks
per SM it is meant for (H100 / H200: 228 KiB per SM, 227 KiB per block, 1 KiB reserved per
block)."""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.kernels_cuda import attention as katt

SM_SMEM, BLOCK_SMEM_MAX, RESERVED = 228 * 1024, 227 * 1024, 1024


def test_chunk_rule():
    """64-key chunks up to 4096 keys, then ceil(len / 64) rounded up to 64; <= 64 chunks; a
    split launch has a block for every chunk of every row no longer than its table. (The exact
    sizes are those of the default NINFER_ATTN_CHUNK_GRAIN = 64; the invariants hold for all.)"""
    if katt.CHUNK_GRAIN == 64:
        assert [katt.chunk_keys(n) for n in (1, 64, 4096, 4097, 8192, 8193, 32768)] == \
            [64, 64, 64, 128, 128, 192, 512]
        assert [katt.num_chunks(n) for n in (1, 63, 64, 65, 1000, 4096, 4097, 5000, 9000)] \
            == [1, 1, 1, 2, 16, 64, 33, 40, 47]
    worst = 0
    for length in range(1, 70000, 7):
        cs, nc = katt.chunk_keys(length), katt.num_chunks(length)
        assert cs % katt.CHUNK_GRAIN == 0 and nc <= katt.MAX_CHUNKS
        assert (nc - 1) * cs < length <= nc * cs
        worst = max(worst, nc)
        assert katt.launch_chunks(length) >= worst
    assert katt.launch_chunks(10 ** 7) == katt.MAX_CHUNKS


def test_long_grain_chunk_rule(monkeypatch):
    """NINFER_ATTN_CHUNK_GRAIN_LONG = 256 at grain 64: rows of 4097..12288 keys (128- or 192-key
    chunks by default) take 256-key chunks; shorter and longer rows keep theirs; the rule's
    invariants and the launch's chunk bound still hold; the define reaches attention.cu only
    when it changes the chunking."""
    monkeypatch.setattr(katt, "CHUNK_GRAIN", 64)
    default = {n: katt.chunk_keys(n) for n in range(1, 40000, 3)}
    monkeypatch.setattr(katt, "CHUNK_GRAIN_LONG", 256)
    assert [katt.chunk_keys(n) for n in (1, 4096, 4097, 8192, 12288, 12289, 16384, 16385,
                                         32768)] == [64, 64, 256, 256, 256, 256, 256, 320, 512]
    for length, keys in default.items():
        changed = katt.chunk_keys(length) != keys
        assert changed == (4096 < length <= 12288), length
        cs, nc = katt.chunk_keys(length), katt.num_chunks(length)
        assert cs % 64 == 0 and nc <= katt.MAX_CHUNKS and (nc - 1) * cs < length <= nc * cs
        assert katt.launch_chunks(length) >= nc
    assert katt.chunk_options(64, 256) == ("-DATTN_CHUNK_GRAIN=64", "-DATTN_CHUNK_GRAIN_LONG=256")
    for off in (0, 64, 128):
        assert katt.chunk_options(128, off) == ("-DATTN_CHUNK_GRAIN=128",)
    monkeypatch.setattr(katt, "CHUNK_GRAIN", 256)  # not larger than the grain: off
    assert katt.chunk_keys(8192) == 256 and katt.chunk_keys(4097) == 256


@pytest.mark.parametrize("mma", [True, False])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16])
@pytest.mark.parametrize("dim", [32, 64, 128, 256])
def test_every_launch_is_built_and_fits(monkeypatch, group, dim, mma):
    """Every instance a launch can pick (MMA variant on or off) is built and fits a block."""
    monkeypatch.setattr(katt, "MMA", mma)
    names = set(katt.SOURCE.name_expressions)
    for split in (True, False):
        for kind in katt.C.WKind:
            name, smem, _, _ = katt.kernel_plan(kind, group, dim, split)
            assert smem + RESERVED <= BLOCK_SMEM_MAX
            assert name in names
            args = name[name.index("<") + 1:-1].split(", ")  # KT, GW, DPL, SPLIT, NST, MMA[, WIDE]
            assert (args[5] == "1") == (mma and kind is katt.C.WKind.BF16 and group <= 8
                                        and dim >= 64), name
            assert (args[6:] == ["1"]) == (katt.wide_blocks(group) and args[5] == "0"
                                           and args[1] != "1"), name


def test_wide_blocks_by_group(monkeypatch):
    """NINFER_ATTN_WIDE unset: 8-warp FMA blocks for G = 8 only (two head groups of 4 heads, now
    4 key warps each); "1" / "0": every / no GW >= 2 layout. GW = 1 groups keep one warp per
    head either way."""
    monkeypatch.setattr(katt, "WIDE", None)
    assert [katt.wide_blocks(g) for g in (1, 2, 4, 6, 8)] == [False] * 4 + [True]
    assert katt.head_layout(8, katt.wide_blocks(8)) == (4, 2, 4)
    assert katt.head_layout(4, katt.wide_blocks(4)) == (4, 1, 4)
    monkeypatch.setattr(katt, "WIDE", True)
    assert katt.head_layout(4, katt.wide_blocks(4)) == (4, 1, 8)
    assert katt.head_layout(5, katt.wide_blocks(5)) == (1, 5, 1)
    monkeypatch.setattr(katt, "WIDE", False)
    assert not any(katt.wide_blocks(g) for g in range(1, 17))


@pytest.mark.parametrize("mma", [True, False])
@pytest.mark.parametrize("group", [2, 4, 8])  # Qwen3.5 GQA groups
def test_blocks_per_sm(monkeypatch, group, mma):
    """With head_dim 256 (bf16, split mode) 3 blocks fit an SM (the kernel's launch bounds;
    NINFER_ATTN_WIDE's 8-warp FMA blocks: 1)."""
    monkeypatch.setattr(katt, "MMA", mma)
    _, smem, _, _ = katt.kernel_plan(katt.C.WKind.BF16, group, 256, True)
    smem += RESERVED
    blocks = 1 if katt.wide_blocks(group) and not mma else 3
    assert blocks * smem <= SM_SMEM < (blocks + 1) * smem, smem


# -- paged_attention_tma_kernel (NINFER_ATTN_TMA) ---------------------------------------------

TMA_STATIC_SMEM = 128  # the kernel's static shared memory (nvcc --resource-usage, sm_90)


def test_tma_eligibility():
    """bf16 pages with page_size % 16 == 0, D in 64 / 128 / 256, groups 1..8; anything else
    keeps the other kernels (and the switch off keeps them for everything)."""
    bf16, f32 = katt.C.WKind.BF16, katt.C.WKind.F32
    assert katt.tma_eligible(bf16, 4, 256, 16) and katt.tma_eligible(bf16, 8, 128, 32)
    assert katt.tma_eligible(bf16, 1, 64, 48)
    for args in ((f32, 4, 256, 16), (bf16, 4, 256, 12), (bf16, 4, 256, 8), (bf16, 9, 256, 16),
                 (bf16, 4, 32, 16), (bf16, 0, 256, 16)):
        assert not katt.tma_eligible(*args), args
    names = set(katt.SOURCE.name_expressions)
    assert {f"paged_attention_tma_kernel<{d}, {b}>" for d in katt.TMA_DIMS
            for b in katt.TMA_MINB} <= names


def test_tma_blocks_by_rows(monkeypatch):
    """NINFER_ATTN_TMA_BLOCKS=0 picks the register cap by the call's rows; 2 or 3 fix it."""
    monkeypatch.setattr(katt, "TMA_BLOCKS", 0)
    rows = katt.TMA_BLOCKS_AUTO_ROWS
    assert [katt.tma_blocks(n) for n in (1, rows - 1, rows, 8, 64)] == [2, 2, 3, 3, 3]
    assert katt.tma_kernel_name(256, 1) == "paged_attention_tma_kernel<256, 2>"
    assert katt.tma_kernel_name(128, 8) == "paged_attention_tma_kernel<128, 3>"
    for fixed in katt.TMA_MINB:
        monkeypatch.setattr(katt, "TMA_BLOCKS", fixed)
        assert {katt.tma_blocks(n) for n in (1, 8, 64)} == {fixed}


def test_tma_switch_off_keeps_other_kernels(monkeypatch):
    monkeypatch.setattr(katt, "TMA", False)
    assert not katt.use_tma(katt.C.WKind.BF16, 4, 256, 16)  # no device query when off


@pytest.mark.parametrize("dim", katt.TMA_DIMS)
@pytest.mark.parametrize("group", range(1, 9))
def test_tma_smem_fits(group, dim):
    """Every allowed ring depth fits a block and is a multiple of the consumer warps (one
    consumer per slot); the default depth fits the 2 blocks per SM of the kernel's launch
    bounds; the consumer states fit the ring."""
    from ninfer import envs

    for stages in envs.ATTN_TMA_STAGES:
        smem = katt.tma_smem_bytes(group, dim, stages) + TMA_STATIC_SMEM
        assert smem + RESERVED <= BLOCK_SMEM_MAX, (stages, smem)
        assert 2 <= stages <= katt.TMA_MAX_STAGES and stages % katt.TMA_CONSUMERS == 0
        assert 2 * katt.tma_stage_bytes(dim) >= katt.TMA_CONSUMERS * group * dim * 4
    smem = katt.tma_smem_bytes(group, dim, envs.attention_tma_stages()) + TMA_STATIC_SMEM + RESERVED
    assert 2 * smem <= SM_SMEM, smem


def test_tensor_map_tile_layout_is_a_conflict_free_bijection():
    """_tensor_map.swizzled_offset (the layout one tensor copy gives a 16-key tile, and the TMA
    kernel's ldmatrix addressing): every (key, dim) has its own 2 bytes of the 2 D * 16 bytes,
    and the 8 keys 2 q + h (q = 0..7) of one ldmatrix phase read a 16-byte unit in 8 distinct
    bank groups."""
    from ninfer.kernels_cuda._tensor_map import TILE_KEYS, swizzled_offset

    for dim in katt.TMA_DIMS:
        offs = {swizzled_offset(k, d) for k in range(TILE_KEYS) for d in range(dim)}
        assert offs == set(range(0, 2 * dim * TILE_KEYS, 2)), dim
        for h in (0, 1):
            for unit in range(dim // 8):
                banks = {(swizzled_offset(2 * q + h, 8 * unit) % 128) // 16 for q in range(8)}
                assert len(banks) == 8, (dim, h, unit)


def test_kv_maps_arg_packs_both_maps_and_encodes_each_once(monkeypatch):
    """kv_maps_arg: the K map's 128 bytes then the V map's, as one 256-byte by-value argument;
    each pages array's map is encoded once (cached by address and shape), the pair too."""
    import types

    from ninfer.kernels_cuda import _tensor_map as tm

    encoded = []

    def fake_encode(pages):
        encoded.append(pages.data.ptr)
        return np.full(16, pages.data.ptr, dtype=np.uint64)

    monkeypatch.setattr(tm, "_encode", fake_encode)
    monkeypatch.setattr(tm, "_CACHE", {})

    def pages(ptr):
        return types.SimpleNamespace(data=types.SimpleNamespace(ptr=ptr), shape=(9, 2, 16, 256))

    k, v = pages(4096), pages(8192)
    arg = tm.kv_maps_arg(k, v)
    assert arg.shape == (1,) and arg.dtype.itemsize == 2 * tm.MAP_BYTES
    words = np.frombuffer(arg.tobytes(), dtype=np.uint64)
    assert (words[:16] == 4096).all() and (words[16:] == 8192).all()
    assert tm.kv_maps_arg(k, v) is arg
    assert tm.kv_maps_arg(v, k) is not arg
    assert sorted(encoded) == [4096, 8192]


# -- NINFER_ATTN_MERGE_KERNEL ------------------------------------------------------------------

@pytest.mark.parametrize("mode", [1, 2, 3])
def test_merge_build_holds_every_split_launch(monkeypatch, mode):
    """The merge-kernel build holds every split-mode instance a launch can pick (FMA, MMA, WIDE,
    TMA) and attn_merge_kernel for every head dim, no loop-mode instance, and adds its define to
    the default build's options; it is one object per (source, mode) (the loader keys modules
    by identity)."""
    src = katt.merge_source(katt.SOURCE, mode)
    assert src is katt.merge_source(katt.SOURCE, mode)
    assert src.options == katt.SOURCE.options + (f"-DATTN_MERGE_KERNEL={mode}",)
    names = set(src.name_expressions)
    for mma in (True, False):
        monkeypatch.setattr(katt, "MMA", mma)
        for group in (1, 2, 3, 4, 5, 6, 7, 8, 12, 16):
            for dim in (32, 64, 128, 256):
                for kind in katt.C.WKind:
                    assert katt.kernel_plan(kind, group, dim, True)[0] in names
                    assert katt.kernel_plan(kind, group, dim, False)[0] not in names
    assert {katt.tma_kernel_name(d, n) for d in katt.TMA_DIMS for n in (1, 8)} <= names
    assert {katt.merge_kernel_name(d) for d in (32, 64, 128, 256)} <= names
    monkeypatch.setattr(katt, "MERGE_KERNEL", mode)
    assert katt.split_source() is src
    monkeypatch.setattr(katt, "MERGE_KERNEL", 0)
    monkeypatch.setattr(katt, "ACQ_REL", True)
    assert katt.split_source() is katt.SOURCE_ACQ_REL


@pytest.mark.parametrize("heads,dim,rows", [(16, 256, 1), (24, 256, 8), (8, 128, 3), (5, 32, 2)])
def test_merge_grid_covers_every_column_and_group(heads, dim, rows):
    """A thread for each (head, 4 dims, merge group) of a row: the grid's threads cover them
    with less than one block to spare."""
    gx, gy = katt.merge_grid(heads, dim, rows)
    need = heads * dim // 4 * katt.GROUP
    assert gy == rows and gx * katt.MERGE_THREADS >= need > (gx - 1) * katt.MERGE_THREADS
