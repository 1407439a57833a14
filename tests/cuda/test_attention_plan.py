"""paged_attention's launch planning, on the CPU: chunk sizes (a function of the row's own length
only), the K/V pipeline depth each call gets (`pipeline_stages`) and that the shared memory of
the deeper pipelines fits the blocks per SM it is meant for (H100 / H200: 228 KiB per SM,
227 KiB per block, 1 KiB reserved per block)."""
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


@pytest.mark.parametrize("group", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16])
@pytest.mark.parametrize("dim", [32, 64, 128, 256])
def test_pipeline_stages(group, dim):
    """The requested depth, or 2 where no deeper kernel is built (loop mode, f32 pages,
    head_dim < 128), or less when the block would not fit; every launched instance is built."""
    names = set(katt.SOURCE.name_expressions)
    gw, hg, kw = katt.head_layout(group)
    for split in (True, False):
        for bf16 in (True, False):
            for req in katt.STAGES:
                nst = katt.pipeline_stages(req, bf16, dim, group, split)
                assert 2 <= nst <= req
                if not split or not bf16 or dim < 128:
                    assert nst == 2
                smem = katt._smem_bytes(group, kw, hg * kw, dim, split, nst)
                assert smem + RESERVED <= BLOCK_SMEM_MAX
                ctype = "unsigned short" if bf16 else "float"
                assert (f"paged_attention_kernel<{ctype}, {gw}, {dim // 32}, {int(split)}, "
                        f"{nst}>") in names


def test_pipeline_stages_default_and_errors(monkeypatch):
    assert katt.pipeline_stages(None, True, 256, 4, True) == katt.DEFAULT_STAGES
    monkeypatch.setattr(katt, "DEFAULT_STAGES", 3)
    assert katt.pipeline_stages(None, True, 256, 4, True) == 3
    assert katt.pipeline_stages(None, True, 256, 4, False) == 2
    for bad in (0, 1, 5):
        with pytest.raises(ValueError, match="stages"):
            katt.pipeline_stages(bad, True, 256, 4, True)


@pytest.mark.parametrize("group", [2, 4, 8])  # Qwen3.5 GQA groups
def test_deep_pipeline_blocks_per_sm(group):
    """With head_dim 256 (bf16): 2 stages fit 3 blocks per SM (the kernel's launch bounds),
    3 stages 2 blocks, 4 stages 1 block."""
    gw, hg, kw = katt.head_layout(group)
    for nst, blocks in ((2, 3), (3, 2), (4, 1)):
        smem = katt._smem_bytes(group, kw, hg * kw, 256, True, nst) + RESERVED
        assert blocks * smem <= SM_SMEM < (blocks + 1) * smem, (nst, smem)
