"""linear_mma_rows_kernel's shared-memory layout, replayed word by word on the CPU (no GPU).

The kernel (mma_gemv.cuh, "Row-contiguous staging") stores each 16-row x 128-k batch of the
weight tile with stmatrix.x4 (or, for a batch with a partial unit, one bf16 at a time) and reads
the mma A fragments back with ldmatrix.x4. Its results are bitwise equal to linear_mma_kernel's
only if every lane receives exactly the fragments that linear_mma_kernel loads directly:
{w0.x, w1.x, w0.y, w1.y} and {w0.z, w1.z, w0.w, w1.w}, w0 / w1 = the 16-byte units of A rows g
and g + 8 at k0 + 32 i + 8 t. This test mirrors the address formulas of the .cuh and the PTX
semantics of both instructions (lane L gives the address of row L % 8 of matrix L / 8; register
q of lane 4 rho + t is word t of row rho of matrix q), and checks the fragments and that every
8-row matrix access spreads over the 8 bank groups of 16 bytes (no bank conflicts).
"""
from __future__ import annotations

import re
from pathlib import Path

HEADER = Path(__file__).resolve().parents[2] / "ninfer" / "kernels_cuda" / "mma_gemv.cuh"


def buffer_row(r: int, i: int, q: int) -> int:
    """16-byte row of the warp buffer holding word q of the units t = 0..3 of tile row r, step i."""
    return r * 16 + 4 * (i ^ ((r >> 2) & 1)) + (q ^ (r & 3) ^ (i & 2))


def store_row(lane: int, j: int) -> int:
    """mma_rows_store_offset / mma_rows_store: the row whose address lane gives for load j."""
    b, i, q = (lane >> 2) & 1, lane & 3, lane >> 3
    base = 16 * b + (4 * i | (q ^ b ^ (i & 2)))
    return (base ^ (4 * ((j >> 1) & 1) | 2 * (j & 1))) + 32 * j


def frag_row(lane: int, i: int, p: int) -> int:
    """mma_rows_frag_offset / mma_rows_frag: the row whose address lane gives for step i, half p."""
    m, rho = lane >> 3, lane & 7
    r = rho + 8 * (m & 1)
    base = 16 * r + (4 * ((rho >> 2) & 1) | ((m >> 1) ^ (rho & 3)))
    return base ^ (4 * i + ((2 * p) ^ (i & 2)))


def test_buffer_rows_are_a_permutation():
    rows = sorted(buffer_row(r, i, q) for r in range(16) for i in range(4) for q in range(4))
    assert rows == list(range(256))


def _stage_with_stmatrix() -> dict:
    """The buffer after the 8 stmatrix.x4 of a batch: (row, word) -> (tile row, unit, word)."""
    smem = {}
    for j in range(8):
        # load j: lane L holds unit L % 16 of tile row 2j + L / 16; its register q = word q
        regs = {lane: [(2 * j + (lane >> 4), lane & 15, q) for q in range(4)] for lane in range(32)}
        for q in range(4):
            for rho in range(8):
                row = store_row(8 * q + rho, j)
                for t in range(4):
                    smem[(row, t)] = regs[4 * rho + t][q]
    return smem


def _stage_element_wise() -> dict:
    """mma_rows_store_partial (and the pre-sm_90 mma_rows_store): lane L writes word q (elements
    2q, 2q + 1) of its unit of tile row 2j + h to word t of buffer row (2j + h, i, q)."""
    smem = {}
    for lane in range(32):
        h, i, t = lane >> 4, (lane >> 2) & 3, lane & 3
        for j in range(8):
            r = 2 * j + h
            for q in range(4):
                smem[(buffer_row(r, i, q), t)] = (r, lane & 15, q)
    return smem


def test_fragments_equal_the_direct_loads():
    for smem in (_stage_with_stmatrix(), _stage_element_wise()):
        assert len(smem) == 256 * 4
        for i in range(4):
            for p in range(2):
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    got = [smem[(frag_row(8 * m + g, i, p), t)] for m in range(4)]
                    w0 = [(g, 4 * i + t, q) for q in range(4)]
                    w1 = [(g + 8, 4 * i + t, q) for q in range(4)]
                    want = [w0[2 * p], w1[2 * p], w0[2 * p + 1], w1[2 * p + 1]]
                    assert got == want, (i, p, lane)


def test_matrix_accesses_are_free_of_bank_conflicts():
    for j in range(8):
        for q in range(4):
            assert len({store_row(8 * q + rho, j) % 8 for rho in range(8)}) == 8, (j, q)
    for i in range(4):
        for p in range(2):
            for m in range(4):
                assert len({frag_row(8 * m + rho, i, p) % 8 for rho in range(8)}) == 8, (i, p, m)


def test_formulas_match_the_header():
    """The expressions above are the header's (a guard against editing one side only)."""
    text = re.sub(r"\s+", " ", HEADER.read_text())
    for expr in (
        "16u * (unsigned)(16 * b + (4 * i | (q ^ b ^ (i & 2))))",
        "(st ^ (16u * (4 * ((j >> 1) & 1) | 2 * (j & 1)))) + 512u * j",
        "16u * (unsigned)(16 * r + (4 * ((rho >> 2) & 1) | ((m >> 1) ^ (rho & 3))))",
        "ld ^ (16u * (4 * I + ((2 * P) ^ (I & 2))))",
        "r * 16 + 4 * (i ^ ((r >> 2) & 1)) + (q ^ (r & 3) ^ (i & 2))",
        "mma_rows_buffer_row(r, i, e >> 1); sbuf[row * 8 + 2 * t + (e & 1)]",
        "buf + 16u * (unsigned)mma_rows_buffer_row(r, i, q) + 4u * t",
    ):
        assert expr in text, expr
