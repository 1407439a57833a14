"""moe_tma_gate_up_kernel's ring plan (moe.py tma_gate_up_plan; no GPU): the constants mirror
moe.cu, every consumer warp's K range (mma_warp_k_range) lies in the ring stage it waits on, the
stages are non-empty, the slots are a multiple of the stages per item (the parity protocol) and
the dynamic shared memory the launcher passes covers the kernel's layout."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from ninfer.kernels_cuda import moe as kmoe
from ninfer.kernels_cuda.linear import mma_splits

SOURCE = (Path(kmoe.__file__).parent / "moe.cu").read_text()


def _define(name: str) -> int:
    return int(re.search(rf"#define {name} (\d+)", SOURCE).group(1))


def _warp_k_range(k: int, splits: int, warp: int) -> tuple[int, int]:
    """mma_gemv.cuh mma_warp_k_range."""
    steps = (k + 31) >> 5
    per = (steps + splits - 1) // splits
    begin = min(k, warp * per * 32)
    return begin, min(k, begin + per * 32)


def test_constants_mirror_moe_cu():
    assert _define("MOE_TMA_PAD") == kmoe.TMA_PAD
    assert _define("MOE_TMA_MAX_STAGES") == kmoe.TMA_MAX_STAGES
    assert _define("MOE_TMA_BAR_BYTES") == kmoe.TMA_BAR_BYTES
    assert "2 * sk + MOE_TMA_PAD - ((2 * sk) & MOE_TMA_PAD)" in SOURCE  # tma_pitch
    assert "MOE_TMA_BAR_BYTES + 4 * sizeof(MmaPartials<8>)" in SOURCE  # the plan's fixed bytes
    assert 2 * kmoe.TMA_MAX_STAGES * 8 <= kmoe.TMA_BAR_BYTES  # full[] and empty[] barriers
    assert re.search(r"__launch_bounds__\(32 \* \(8 \+ 1\), 1\) moe_tma_gate_up_kernel", SOURCE)
    assert kmoe.MMA_SPLITS == 8
    assert _define("MOE_TMA_XR_STEPS") == kmoe.TMA_XR_STEPS


@pytest.mark.parametrize("k", [16, 32, 1040, 2048, 2064, 4096])
def test_x_regs_predicate(k):
    """tma_x_regs_ok: one x row (x_by_pair = 0, pairs <= top_k) and every warp's K range at most
    TMA_XR_STEPS 32-k steps (mma_warp_k_range's ranges, recomputed here)."""
    splits = mma_splits(k, kmoe.MMA_SPLITS)
    ranges = [_warp_k_range(k, splits, w) for w in range(splits)]
    longest = max(end - begin for begin, end in ranges)
    fits = -(-longest // 32) <= kmoe.TMA_XR_STEPS
    assert kmoe.tma_x_regs_ok(k, splits, 0, 8, 8) == fits
    assert not kmoe.tma_x_regs_ok(k, splits, 1, 8, 8)  # x rows by pair
    assert not kmoe.tma_x_regs_ok(k, splits, 0, 16, 8)  # two tokens
    if k == 2048:
        assert fits  # 35B-A3B at B = 1 takes it


def test_35b_plan():
    """H = 2048: the rows kernel's 8 splits of 256 k, stages of 4 warps' ranges (1024 k, 2 KiB
    copies per row), 2 stages per item, 6 slots (3 items in flight)."""
    plan = kmoe.tma_gate_up_plan(2048)
    assert (plan.splits, plan.sk, plan.stage_warps, plan.per_item, plan.stages) == (8, 1024, 4,
                                                                                    2, 6)
    assert plan.smem == 256 + 4 * 4096 + 6 * 16 * (2 * 1024 + 64) <= kmoe.TMA_SMEM_LIMIT
    assert kmoe.tma_pitch(1024) == 2112 and kmoe.tma_pitch(288) == 576


@pytest.mark.parametrize("k", [0, 8, 24, 1000, 2056])
def test_k_not_a_multiple_of_16_has_no_plan(k):
    assert kmoe.tma_gate_up_plan(k) is None


@pytest.mark.parametrize("limit,target", [(kmoe.TMA_SMEM_LIMIT, kmoe.TMA_TARGET_SK),
                                          (kmoe.TMA_SMEM_LIMIT, 256), (64 * 1024, 4096),
                                          (40 * 1024, 1024)])
def test_plans_are_consistent(limit, target):
    fixed = kmoe.TMA_BAR_BYTES + 4 * 8 * 16 * 8 * 4  # barriers, four MmaPartials<8>
    planned = 0
    for k in range(16, 8192 + 1, 16):
        plan = kmoe.tma_gate_up_plan(k, limit, target)
        if plan is None:
            continue
        planned += 1
        splits, sk, sw, ns = plan.splits, plan.sk, plan.stage_warps, plan.per_item
        assert splits == mma_splits(k, kmoe.MMA_SPLITS) and 1 <= splits <= 8, k
        assert sw * ns == splits and sk % 32 == 0, (k, plan)
        assert ns <= plan.stages <= kmoe.TMA_MAX_STAGES and plan.stages % ns == 0, (k, plan)
        pitch = kmoe.tma_pitch(sk)
        assert 2 * sk <= pitch <= 2 * sk + 64 and pitch % 128 == 64, (k, plan)  # banks
        stage = 16 * pitch
        assert plan.smem == fixed + plan.stages * stage <= limit, (k, plan)
        for s in range(ns):
            assert s * sk < k, (k, plan, s)  # no empty stage (the producer copies > 0 bytes)
        for w in range(splits):
            begin, end = _warp_k_range(k, splits, w)
            s = w // sw
            assert begin < end, (k, w)  # every warp has k (its stage's barrier counts sw)
            assert s * sk <= begin and end <= min(k, (s + 1) * sk), (k, plan, w, begin, end)
            assert (begin - s * sk) % 32 == 0
    assert planned > 0


def test_plan_off_without_the_switch(monkeypatch):
    monkeypatch.setattr(kmoe, "MOE_TMA", False)
    assert kmoe._tma_plan(True, 2048) is None
