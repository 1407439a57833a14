"""linear_tma_kernel launch planning on the CPU (no GPU): the split-K choice."""
from __future__ import annotations


def test_tma_parts_balances_rounds_and_ignores_the_batch():
    """tma_parts (CPU): 27B's N = 5120 GEMVs (320 row tiles, 3 rounds on 132 SMs, the last 42%
    full) split in 2; balanced shapes (9B) and K of 4-5 stages (no split instance) keep 1."""
    from ninfer.kernels_cuda import linear as L

    assert L.tma_parts(5120, 17408, False, 1024, 132) == 2
    assert L.tma_parts(5120, 6144, False, 1024, 132) == 2
    for m, k, sw in ((4096, 12288, False), (24576, 4096, True), (12352, 4096, False),
                     (248320, 5120, False)):
        assert L.tma_parts(m, k, sw, 1024, 132) == 1, (m, k, sw)
    assert not L.tma_split_ok(4096, 1024, 16) and not L.tma_split_ok(5120, 1024, 16)
    assert L.tma_split_ok(2048, 1024, 16) and L.tma_split_ok(6144, 1024, 16)
    assert not L.tma_split_ok(6144, 2048, 16) and not L.tma_split_ok(6144, 1024, 8)
    for m, k in ((300, 4096), (5000, 17408), (123, 1024)):
        p = L.tma_parts(m, k, False, 1024, 132)
        assert 1 <= p <= min(L.TMA_MAX_PARTS, -(-k // 1024))
