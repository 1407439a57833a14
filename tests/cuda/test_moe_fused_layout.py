"""The fused decode MoE kernels' dynamic shared memory (no GPU): the bytes each kernel indexes
(moe.cu layouts, mirrored here) fit in what moe.py launches them with, for every block shape the
launcher can pick. moe_fused_gate_up_kernel once put its staging buffers after a 16 KiB
(MmaPartials<16>) partials area while mma_rows_smem reserves one MmaPartials<8> (4 KiB): 12 KiB
past the allocation, cudaErrorIllegalAddress on the H200."""
from __future__ import annotations

import re

import pytest

from ninfer.kernels_cuda import _checks as C
from ninfer.kernels_cuda import _nvcc
from ninfer.kernels_cuda import moe as kmoe
from ninfer.kernels_cuda.linear import MMA_ROWS_ALIGN, MMA_ROWS_WARP_SMEM, mma_splits

PARTIALS8 = 8 * 16 * 8 * 4  # sizeof(MmaPartials<8>)
PAD = MMA_ROWS_ALIGN - 1    # moe_rows_base's worst alignment pad


@pytest.mark.parametrize("hidden", [8, 136, 296, 1040, 2048, 4096, 8192])
@pytest.mark.parametrize("pairs", [1, 8, 33, 64])
def test_fused_gate_up_layout_fits(hidden, pairs):
    splits = mma_splits(hidden, kmoe.MMA_SPLITS)
    warps = max(splits, -(-pairs // 32))  # _block_fused
    used = PAD + PARTIALS8 + warps * MMA_ROWS_WARP_SMEM  # partials, then the staging buffers
    assert used <= kmoe.mma_rows_smem(warps), (hidden, pairs, warps, used)


@pytest.mark.parametrize("inter", [8, 40, 264, 512, 1024, 4096])
def test_fused_down_layout_fits(inter):
    splits = mma_splits(inter, kmoe.MMA_SPLITS)
    warps = kmoe.FUSED_DOWN_WARPS
    slots = min(kmoe.FUSED_DOWN_SLOTS, warps // splits)
    assert slots >= 1
    used = PAD + warps * MMA_ROWS_WARP_SMEM + slots * splits * 16 * 8 * 4
    assert used <= kmoe.fused_down_smem(splits), (inter, splits, used)


def test_fused_gate_up_partials_are_one_mma_partials8():
    """The kernel's partials area is sizeof(MmaPartials<8>), the size mma_rows_smem reserves."""
    text = (_nvcc.PACKAGE_DIR / "moe.cu").read_text()
    body = text[text.index("moe_fused_gate_up_kernel(\n"):]
    body = body[:body.index("\n}\n")]
    (red,) = re.findall(r"constexpr int RED = ([^;]+);", body)
    assert red.replace(" ", "") == "(int)sizeof(MmaPartials<8>)", red
    assert "moe_rows_smem_check(" in body


@pytest.mark.parametrize("inter", [8, 264, 512, 1024])
@pytest.mark.parametrize("shared_k", [16, 48, 512, 2048])
@pytest.mark.parametrize("cons", [8, 16])
def test_fused_down_layout_with_folded_shared_down_fits(inter, shared_k, cons):
    """moe.cu with MoeSharedDown: the experts' staging and partials, then the 16-row shared tile
    (moe_shared_a_pitch), MOE_FUSED_ROWS x rows (moe_shared_x_pitch floats) and `cons` partial
    tiles, within the 227 KiB an sm_90 block may opt into."""
    splits = mma_splits(inter, kmoe.MMA_SPLITS)
    warps = kmoe.FUSED_DOWN_WARPS
    slots = min(kmoe.FUSED_DOWN_SLOTS, warps // splits)
    used = (PAD + warps * MMA_ROWS_WARP_SMEM + slots * splits * 16 * 8 * 4
            + 16 * (2 * shared_k + 16) + kmoe.FUSED_MAX_ROWS * (shared_k + 8) * 4 + cons * 512)
    smem = kmoe.fused_down_smem(splits, shared_k=shared_k, shared_cons=cons)
    assert used <= smem <= 227 * 1024, (inter, shared_k, cons, used, smem)


def test_folded_shared_down_constants_mirror_moe_cu():
    """moe.py's MoeSharedDown record, team size, row bound and pitches are those of moe.cu."""
    text = (_nvcc.PACKAGE_DIR / "moe.cu").read_text()
    assert f"#define MOE_DOWN_SHARED_WARPS {kmoe.FUSED_DOWN_SHARED_WARPS}" in text
    assert f"#define MOE_FUSED_ROWS {kmoe.FUSED_MAX_ROWS}" in text
    assert f"#define MOE_DOWN_PREFETCH {kmoe.DOWN_PREFETCH}" in text
    assert f"#define MOE_DOWN_SHARED_EARLY {kmoe.DOWN_SHARED_EARLY}" in text
    assert ("#define MOE_DOWN_MAX_WARPS "
            f"{kmoe.FUSED_DOWN_WARPS + kmoe.FUSED_DOWN_SHARED_WARPS}") in text
    assert "return 2 * k + 16;" in text and "return k + 8;" in text  # moe_shared_*_pitch
    assert f"sizeof(MoeSharedDown) == {kmoe._SHARED_DOWN.itemsize}" in text
    struct = text[text.index("struct MoeSharedDown {"):
                  text.index("static_assert(sizeof(MoeSharedDown)")]
    fields = re.findall(r"\n  (?:const \w+\*|i64|int) ([\w, ]+);", struct)
    names = [n.strip() for f in fields for n in f.split(",")]
    assert names == list(kmoe._SHARED_DOWN.names), names


def _record_fields(text: str, struct: str) -> list[str]:
    """moe.cu's `struct` as moe.py packs it: its fields in order, a nested MoeGemvParams,
    MoeSharedDown or MoeCombine member m as m_<its fields>."""
    nested = {"MoeGemvParams": kmoe._GEMV_FIELDS, "MoeSharedDown": kmoe._SHARED_DOWN_FIELDS,
              "MoeCombine": kmoe._COMBINE_FIELDS}
    body = text[text.index(f"struct {struct} {{"):text.index(f"static_assert(sizeof({struct})")]
    names = []
    for typ, members in re.findall(r"\n  ((?:const )?\w+(?: \w+)*\*?) ([\w, ]+);", body):
        for m in (m.strip() for m in members.split(",")):
            names += [f"{m}_{n}" for n, _ in nested[typ]] if typ in nested else [m]
    return names


def test_persistent_experts_params_mirror_moe_cu():
    """moe.py's _EXPERTS record and PERSIST_GROUPS are moe.cu's MoeTmaExpertsParams and
    MOE_EXPERTS_GROUPS (its MoeGemvParams gu, dn, MoeSharedDown sd and MoeCombine c nested)."""
    text = (_nvcc.PACKAGE_DIR / "moe.cu").read_text()
    assert f"#define MOE_EXPERTS_GROUPS {kmoe.PERSIST_GROUPS}" in text
    assert f"sizeof(MoeTmaExpertsParams) == {kmoe._EXPERTS.itemsize}" in text
    assert f"sizeof(MoeCombine) == {C.struct(*kmoe._COMBINE_FIELDS).itemsize}" in text
    assert _record_fields(text, "MoeCombine") == [n for n, _ in kmoe._COMBINE_FIELDS]
    assert _record_fields(text, "MoeTmaExpertsParams") == list(kmoe._EXPERTS.names)


@pytest.mark.parametrize("hidden,inter", [(2048, 512), (304, 96), (1040, 256), (64, 32)])
def test_persistent_experts_ring_holds_the_down_tiles(monkeypatch, hidden, inter):
    """persist_plan's arithmetic at the shapes test_cuda_moe_persist runs: the gate_up ring of
    moe_tma_gate_up_kernel, whose stages hold PERSIST_GROUPS down tiles of 16 rows of Im bf16
    side by side (each within its stage's row of tma_pitch(sk) bytes) and then the act rows of
    PERSIST_GROUPS pairs, and a down split that fits the consumer warps."""
    monkeypatch.setattr(kmoe, "PERSIST", True)
    monkeypatch.setattr(kmoe, "current_device", lambda: type("D", (), {"sm_count": 132})())
    plan = kmoe.persist_plan(1, 8, hidden, inter)
    assert plan == kmoe.tma_gate_up_plan(hidden)
    gps = kmoe.persist_down_tiles_per_stage(plan, inter)
    assert gps >= 1 and gps * 2 * inter <= kmoe.tma_pitch(plan.sk)
    assert -(-kmoe.PERSIST_GROUPS // gps) + 1 <= plan.stages  # + the stage of act
    assert kmoe.PERSIST_GROUPS * (inter + 4) * 4 <= 16 * kmoe.tma_pitch(plan.sk)
    assert mma_splits(inter, kmoe.MMA_SPLITS) <= plan.splits
    assert kmoe.persist_plan(2, 8, hidden, inter) is None  # 16 pairs
    monkeypatch.setattr(kmoe, "PERSIST", False)
    assert kmoe.persist_plan(1, 8, hidden, inter) is None


@pytest.mark.parametrize("hidden,inter,shared_k,cons,folds", [
    (2048, 512, 512, 16, True),    # 35B-A3B: 1 shared + 4 down + 1 act stage of 6
    (2048, 512, 2048, 16, False),  # the shared tile's rows exceed a stage's
    (1040, 256, 272, 8, True),
    (1040, 256, 272, 16, False),   # 16 consumer warps' partials > 2 x 4 warps
])
def test_persistent_experts_fold_arithmetic(monkeypatch, hidden, inter, shared_k, cons, folds):
    """persist_folds: the shared down tile takes one more ring stage and the block's consumer
    warps compute two of linear_tma's consumer warps each."""
    monkeypatch.setattr(kmoe, "PERSIST", True)
    monkeypatch.setattr(kmoe, "current_device", lambda: type("D", (), {"sm_count": 132})())
    plan = kmoe.persist_plan(1, 8, hidden, inter)
    assert kmoe.persist_folds(plan, inter, shared_k, cons) is folds


def test_tma_down_params_mirror_moe_cu():
    """moe.py's _TMA_DOWN record is moe.cu's MoeTmaDownParams (its MoeGemvParams dn,
    MoeSharedDown sd and MoeCombine c nested) and its constants the kernel's."""
    text = (_nvcc.PACKAGE_DIR / "moe.cu").read_text()
    assert f"sizeof(MoeTmaDownParams) == {kmoe._TMA_DOWN.itemsize}" in text
    assert f"#define MOE_TMA_DOWN_WARPS {kmoe.TMA_DOWN_WARPS}" in text
    assert f"#define MOE_TMA_DOWN_HEAD {kmoe.TMA_DOWN_HEAD}" in text
    assert f"#define MOE_EXPERTS_TEAMS {kmoe.TMA_DOWN_TEAMS}" in text
    assert _record_fields(text, "MoeTmaDownParams") == list(kmoe._TMA_DOWN.names)


@pytest.mark.parametrize("inter,shared_k,fits", [
    (512, 512, True),     # 35B-A3B: 176.25 KiB
    (512, 2048, True),    # Is = FOLD_MAX_K: 224.25 KiB
    (512, 0, True),
    (1024, 0, False),     # 256 KiB of expert tiles
    (32, 32, True),
])
def test_tma_down_smem_layout(monkeypatch, inter, shared_k, fits):
    """tma_down_smem is moe_tma_down_kernel's layout: head, the teams' partials, the expert
    tiles, the shared tile, the act rows (each region 16-byte aligned for the bulk copies and
    cp.async); tma_down_applies takes it where it fits beside the static tables."""
    monkeypatch.setattr(kmoe, "TMA_DOWN", True)
    head = kmoe.TMA_DOWN_HEAD + kmoe.TMA_DOWN_TEAMS * 8 * 16 * 8 * 4
    tiles = kmoe.PERSIST_GROUPS * 16 * 2 * inter
    assert head % 16 == 0 and tiles % 16 == 0 and (16 * 2 * shared_k) % 16 == 0
    assert kmoe.tma_down_smem(inter, shared_k) == (
        head + tiles + 16 * 2 * shared_k + kmoe.PERSIST_GROUPS * (inter + 4) * 4)
    assert kmoe.tma_down_applies(1, 8, inter, shared_k) is fits
