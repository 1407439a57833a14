"""paged_attention's launch planning, on the CPU: chunk sizes (a function of the row's own length
only), that every launched instance is built, and that a block's shared memory fits the blocks
per SM it is meant for (H100 / H200: 228 KiB per SM, 227 KiB per block, 1 KiB reserved per
block)."""
from __future__ import annotations

import pytest

from ninfer.kernels_cuda import attention as katt

SM_SMEM, BLOCK_SMEM_MAX, RESERVED = 228 * 1024, 227 * 1024, 1024


def test_chunk_rule():
    """64-key chunks up to 4096 keys, then ceil(len / 64) rounded up to 64; <= 64 chunks; a
    split launch has a block for every chunk of every row no longer than its table."""
    assert [katt.chunk_keys(n) for n in (1, 64, 4096, 4097, 8192, 8193, 32768)] == \
        [64, 64, 64, 128, 128, 192, 512]
    assert [katt.num_chunks(n) for n in (1, 63, 64, 65, 1000, 4096, 4097, 5000, 9000)] == \
        [1, 1, 1, 2, 16, 64, 33, 40, 47]
    worst = 0
    for length in range(1, 70000, 7):
        cs, nc = katt.chunk_keys(length), katt.num_chunks(length)
        assert cs % katt.CHUNK_GRAIN == 0 and nc <= katt.MAX_CHUNKS
        assert (nc - 1) * cs < length <= nc * cs
        worst = max(worst, nc)
        assert katt.launch_chunks(length) >= worst
    assert katt.launch_chunks(10 ** 7) == katt.MAX_CHUNKS


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
            assert (", 1>" in name) == (mma and kind is katt.C.WKind.BF16 and group <= 8
                                        and dim >= 64), name


@pytest.mark.parametrize("mma", [True, False])
@pytest.mark.parametrize("group", [2, 4, 8])  # Qwen3.5 GQA groups
def test_blocks_per_sm(monkeypatch, group, mma):
    """With head_dim 256 (bf16, split mode) 3 blocks fit an SM (the kernel's launch bounds)."""
    monkeypatch.setattr(katt, "MMA", mma)
    _, smem, _, _ = katt.kernel_plan(katt.C.WKind.BF16, group, 256, True)
    smem += RESERVED
    assert 3 * smem <= SM_SMEM < 4 * smem, smem
