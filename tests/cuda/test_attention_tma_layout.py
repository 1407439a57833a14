"""paged_attention_tma_kernel's ring-stage layout and mma fragments, replayed on the CPU (no GPU).

A stage holds 16 keys' K rows then V rows, each as 8 bulk copies of the row pair (2c, 2c + 1) at
c * (4 D + 16) bytes (only keys < len are copied; the rest of the stage is stale). The consumer
reads K with ldmatrix.x4 (mma A = [key][dim], mma row kappa = key pi(kappa) = 2 kappa or
2 (kappa - 8) + 1) and V with ldmatrix.x4.trans (A = V^T, k row kappa = key pi(kappa)), and masks
the V fragments of keys past len. This test mirrors the kernel's address and mask formulas
(attention.cu) and the PTX semantics of ldmatrix (lane L gives the address of row L % 8 of
matrix L / 8; plain: register i of lane l = row l / 4, cols 2 (l % 4), +1 of matrix i; trans:
rows 2 (l % 4), +1, col l / 4; the low half holds the lower index) and mma.m16n8k16 (A: a0 row
gi k 2t, a1 row gi + 8, a2 k + 8, a3 both; B: b0 k 2t, 2t + 1 col gi, b1 k + 8; C: c0, c1 row gi
cols 2t, 2t + 1, c2, c3 row gi + 8), then checks that S = K q^T lands on the right keys, that
O^T = V^T P^T sums exactly the valid keys even when the stale bytes are NaN, and that every
8-row ldmatrix phase covers the 8 bank groups of 16 bytes (no bank conflicts).
"""
from __future__ import annotations

import numpy as np
import pytest

from ninfer.core.dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from ninfer.kernels_cuda import attention as katt

TILE = katt.TMA_TILE


def geometry(d: int):
    row_b = 2 * d
    pair_b = 4 * d + 16  # attn_tma_pair_bytes
    half_b = 8 * pair_b
    return row_b, pair_b, half_b, 2 * half_b


def fill_stage(rng, k_rows, v_rows, nv, d):
    """The stage as bf16 words after the producer's copies of keys < nv over NaN-laden stale
    bytes; also the list of (dst byte, bytes) copies."""
    row_b, pair_b, half_b, stage_b = geometry(d)
    words = rng.integers(0, 1 << 16, stage_b // 2, dtype=np.uint16)
    words[rng.random(words.size) < 0.3] = 0x7FC1  # NaN
    copies = []
    for src, half in ((k_rows, 0), (v_rows, half_b)):
        for cp in range(8):
            rows = min(2, nv - 2 * cp)
            if rows <= 0:
                continue
            dst = half + cp * pair_b
            copies.append((dst, rows * row_b))
            flat = src[2 * cp:2 * cp + rows].reshape(-1)
            words[dst // 2:dst // 2 + flat.size] = flat
    return words, copies


def ldmatrix(words, addrs, trans: bool):
    """Registers [32 lanes][4] (uint32) of ldmatrix.x4 with row addresses addrs[lane] (bytes)."""
    mats = np.array([[words[addrs[8 * i + r] // 2:addrs[8 * i + r] // 2 + 8] for r in range(8)]
                     for i in range(4)], dtype=np.uint32)  # [matrix][row][col]
    regs = np.zeros((32, 4), np.uint32)
    for lane in range(32):
        for i in range(4):
            if trans:
                lo, hi = mats[i, 2 * (lane % 4), lane // 4], mats[i, 2 * (lane % 4) + 1, lane // 4]
            else:
                lo, hi = mats[i, lane // 4, 2 * (lane % 4)], mats[i, lane // 4, 2 * (lane % 4) + 1]
            regs[lane, i] = lo | (hi << 16)
    return regs


def halves(reg):
    with np.errstate(invalid="ignore"):  # stale NaN patterns
        return [bf16_bits_to_f32(np.array([reg & 0xFFFF], np.uint16))[0].astype(np.float64),
                bf16_bits_to_f32(np.array([reg >> 16], np.uint16))[0].astype(np.float64)]


def a_matrix(regs):
    """The 16 x 16 A operand held by the lanes' registers (float64)."""
    a = np.zeros((16, 16))
    for lane in range(32):
        gi, t = lane >> 2, lane & 3
        for reg, (r, k) in zip(regs[lane], ((gi, 2 * t), (gi + 8, 2 * t), (gi, 2 * t + 8),
                                            (gi + 8, 2 * t + 8))):
            a[r, k:k + 2] = halves(int(reg))
    return a


def key_of(kappa: int) -> int:
    """pi: the key of mma row (S) / k row (P V) kappa."""
    return 2 * kappa if kappa < 8 else 2 * (kappa - 8) + 1


def k_addr(lane: int, ks: int, d: int) -> int:
    row_b, pair_b, _, _ = geometry(d)
    r8, mi = lane & 7, lane >> 3
    return r8 * pair_b + (mi & 1) * row_b + (mi >> 1) * 16 + ks * 32


def v_addr(lane: int, mt: int, d: int) -> int:
    row_b, pair_b, half_b, _ = geometry(d)
    r8, mi = lane & 7, lane >> 3
    return half_b + r8 * pair_b + (mi >> 1) * row_b + (mi & 1) * 16 + mt * 32


def v_masks(t: int, nv: int) -> tuple[int, int]:
    lo = (0x0000FFFF if 4 * t < nv else 0) | (0xFFFF0000 if 4 * t + 2 < nv else 0)
    hi = (0x0000FFFF if 4 * t + 1 < nv else 0) | (0xFFFF0000 if 4 * t + 3 < nv else 0)
    return lo, hi


@pytest.mark.parametrize("d", katt.TMA_DIMS)
@pytest.mark.parametrize("nv", [16, 15, 12, 9, 4, 2, 1, 40])
def test_stage_fragments(rng, d, nv):
    """S rows and O^T over a stage filled for nv valid keys (>= 16: a full tile)."""
    row_b, pair_b, half_b, stage_b = geometry(d)
    k_f = rng.standard_normal((TILE, d)).astype(np.float32)
    v_f = rng.standard_normal((TILE, d)).astype(np.float32)
    k_bits, v_bits = f32_to_bf16_bits(k_f), f32_to_bf16_bits(v_f)
    k64 = bf16_bits_to_f32(k_bits).astype(np.float64)
    v64 = bf16_bits_to_f32(v_bits).astype(np.float64)
    words, copies = fill_stage(rng, k_bits, v_bits, nv, d)
    valid = min(nv, TILE)
    # copies: 16-byte aligned, multiples of 16 bytes, disjoint, inside their half
    spans = sorted(copies)
    for (dst, size), nxt in zip(spans, spans[1:] + [(stage_b, 0)]):
        assert dst % 16 == 0 and size % 16 == 0 and dst + size <= nxt[0]
        assert (dst < half_b) == (dst + size <= half_b)
    assert sum(size for _, size in copies) == 2 * valid * row_b  # the announced tx bytes
    # S = K q^T over the D / 16 k-steps (B = q exactly: the hi + lo split is the MMA path's)
    q = rng.standard_normal((8, d))
    s = np.zeros((16, 8))
    for ks in range(d // 16):
        a = a_matrix(ldmatrix(words, [k_addr(lane, ks, d) for lane in range(32)], False))
        s += a @ q[:, 16 * ks:16 * ks + 16].T
    for lane in range(32):  # the kernel's validity of accumulator rows gi / gi + 8
        gi = lane >> 2
        for kappa, ok in ((gi, 2 * gi < nv), (gi + 8, 2 * gi + 1 < nv)):
            assert ok == (key_of(kappa) < valid)
    for kappa in range(16):
        if key_of(kappa) < valid:
            np.testing.assert_allclose(s[kappa], k64[key_of(kappa)] @ q.T, rtol=1e-12,
                                       atol=1e-9, err_msg=f"S row {kappa}")
    # O^T = V^T P^T with p = 0 for keys past len, the V fragments masked
    p = rng.random((16, 8))
    for kappa in range(16):
        if key_of(kappa) >= valid:
            p[kappa] = 0.0
    o_t = np.zeros((d, 8))
    for mt in range(d // 16):
        regs = ldmatrix(words, [v_addr(lane, mt, d) for lane in range(32)], True)
        for lane in range(32):
            lo, hi = v_masks(lane & 3, nv)
            regs[lane] &= np.array([lo, lo, hi, hi], np.uint32)
        a = a_matrix(regs)
        assert np.isfinite(a).all(), "a masked V fragment still holds a stale NaN"
        o_t[16 * mt:16 * mt + 16] += a @ p
    expect = np.zeros((d, 8))
    for kappa in range(16):
        if key_of(kappa) < valid:
            expect += np.outer(v64[key_of(kappa)], p[kappa])
    np.testing.assert_allclose(o_t, expect, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("d", katt.TMA_DIMS)
def test_ldmatrix_phases_are_conflict_free(d):
    """Each 8-row phase of every K / V ldmatrix.x4 hits the 8 bank groups of 16 bytes once
    (stage offsets are multiples of 128 bytes, so this holds in every slot)."""
    _, _, _, stage_b = geometry(d)
    assert stage_b % 128 == 0 and 256 % 128 == 0
    for addr in (k_addr, v_addr):
        for step in range(d // 16):
            lanes = [addr(lane, step, d) for lane in range(32)]
            assert all(a % 16 == 0 for a in lanes)
            for i in range(4):
                groups = {(lanes[8 * i + r] // 16) % 8 for r in range(8)}
                assert len(groups) == 8, (addr.__name__, step, i, sorted(groups))
